"""The verifier engine: rule-based rewards (``kind: verifier`` in a models file) run in a
process pool with a per-item timeout. No torch, no HTTP: the standard library, plus
math-verify in the workers of a ``math`` verifier.

    pool = VerifierPool(VerifierOptions("math", workers=2, timeout_s=5.0), name="math")
    pool.start()                      # ModelLoadError when the verifier does not load
    verdicts = await pool.verify([Task(prompt=None, response="... \\\\boxed{1/2}", label="0.5")])
    verdicts[0].score, verdicts[0].error   # 1.0, None
    pool.close()

Built-ins: ``math`` (math-verify decides whether the final answer equals the label; see
:mod:`reward_server.verifiers.answers` for how the answer and the label are read),
``exact``, ``regex`` and ``python`` (a user's ``f(prompt, response, label)``). A failing
item never raises: its :class:`Verdict` carries ``on_error`` and the reason (:data:`REASONS`).
``code`` (the response's program run against the label's tests in a sandbox) has a runner of
its own with the pool's interface: :mod:`reward_server.verifiers.code`; so has a ``python``
function with ``sandbox: bwrap`` (each call in a sandbox, through the code verifier's item
runner): :mod:`reward_server.verifiers.sandboxed`.
"""

from reward_server.verifiers.items import REASONS, Reason, Task, Verdict
from reward_server.verifiers.options import VerifierName, VerifierOptions
from reward_server.verifiers.pool import VerifierPool

__all__ = [
    "REASONS",
    "Reason",
    "Task",
    "Verdict",
    "VerifierName",
    "VerifierOptions",
    "VerifierPool",
]
