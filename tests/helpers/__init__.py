"""What the test modules share, so that no test module imports another (no tests here).

pytest puts ``tests/`` on the import path (``pythonpath`` in pyproject.toml): a test imports
``from helpers.models_files import write_models``. One module a job:

- :mod:`helpers.models_files`: a models file (``--models``) or a keys file (``--api-keys``)
  written from its entries, and the entries the tests' verifiers share;
- :mod:`helpers.servers`: a real ``reward-server`` by spec (model, models file entries,
  flags, environment): ``serve`` for a server of its own, ``SharedServers`` for one shared by
  the tests and the test files of a pytest worker that ask for the same spec (the
  ``shared_server``, ``bert_server``, ``gpt2_server`` and ``llama_server`` fixtures of
  tests/conftest.py); :mod:`helpers.apps`: an in-process app of a models file;
- :mod:`helpers.posting`: requests to a server and the checks of their answers (``post``,
  ``score``, ``scores``, ``assert_error``, ``bearer``);
- :mod:`helpers.training`: PPO and TRL GRPO configs, prompts and datasets, the trainers'
  commands (``ppo-client``, ``accelerate launch``) and environments, their logs;
- :mod:`helpers.fakes`: the fake scorer behind an in-process app;
  :mod:`helpers.mock_answers`: answers behind ``httpx.MockTransport``;
- :mod:`helpers.judges`, :mod:`helpers.rubric_judge`, :mod:`helpers.pairwise`,
  :mod:`helpers.rubrics`: the judges' tiny models, entries and independent references;
- :mod:`helpers.tenants`, :mod:`helpers.pki`, :mod:`helpers.load`, :mod:`helpers.remote`,
  :mod:`helpers.protocols`, :mod:`helpers.server_cli`, :mod:`helpers.clients`,
  :mod:`helpers.dns`, :mod:`helpers.repository`: what several test files need of one subject;
- one module per counterpart: :mod:`helpers.vllm`, :mod:`helpers.drivers` (verl and
  bfcl-eval), :mod:`helpers.openrlhf`, :mod:`helpers.kubernetes`.

The older helper modules beside this package (``server_proc``, ``warm_launcher``,
``chat_templates``, ``counterparts``, ...) stay where they are; tests/unit/test_suite_layout.py
fails when a test module imports another.
"""
