"""What the test modules share, so that no test module imports another (no tests here).

pytest puts ``tests/`` on the import path (``pythonpath`` in pyproject.toml): a test imports
``from helpers.models_files import write_models``. One module a job:

- :mod:`helpers.models_files`: a models file (``--models``) or a keys file (``--api-keys``)
  written from its entries;
- :mod:`helpers.servers`: real ``reward-server`` processes by spec, shared by the tests
  (and the files of one pytest worker) that need the same one (the ``shared_server``
  fixture of ``tests/conftest.py``), and in-process apps of a models file;
- :mod:`helpers.posting`: requests to a server and the checks of their answers (``score``,
  ``post``, ``assert_error``, ``bearer``);
- :mod:`helpers.training`: PPO and TRL GRPO configs, prompts, the trainers' commands
  (``ppo-client``, ``accelerate launch``) and their logs;
- :mod:`helpers.fakes`: the fake scorer behind an in-process app;
- :mod:`helpers.judges`, :mod:`helpers.rubric_judge`: the judges' tiny models, entries and
  references;
- :mod:`helpers.tenants`, :mod:`helpers.pki`, and one module per counterpart (vLLM, verl,
  OpenRLHF, ...) for what several test files need of it.

The older helper modules beside this package (``server_proc``, ``chat_templates``,
``counterparts``, ...) stay where they are; tests/unit/test_suite_layout.py checks that no
test module imports another.
"""
