"""OpenAI's graders, run here (``kind: grader``; ``/v1/fine_tuning/alpha/graders/run``):
templating (:mod:`.templates`), the metrics of ``text_similarity`` (:mod:`.similarity`),
``python`` graders in a warm sandbox (:mod:`.python_sandbox`), the leaves that need no
model and the combination of a ``multi`` grader (:mod:`.grading`), and the check a
worker of a grader's pool runs (:mod:`.check`). The grader objects themselves are
:mod:`reward_server.config.graders`.
"""
