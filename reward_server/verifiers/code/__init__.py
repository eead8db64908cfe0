"""Code rewards (``verifier: code``): run the program in a response against the tests in
its label, in a sandbox (:mod:`reward_server.sandbox`), and score the share of tests passed.

    verifier = CodeVerifier(CodeOptions(languages=("python", "cpp"), workers=4), name="code")
    verifier.start()                  # ModelLoadError when no sandbox can be made here
    label = {"inputs": ["1 2\\n"], "outputs": ["3\\n"]}
    task = Task(prompt=None, response="```python\\nprint(sum(map(int, input().split())))\\n```",
                label=label)
    (verdict,) = await verifier.verify([task])
    verdict.score, verdict.tests      # 1.0, ("passed",)

The parts: :mod:`.suite` reads the tests from a label (stdin/stdout, call-based,
assert-based), :mod:`.program` finds the program and its language in a response,
:mod:`.harness` gives the files and stdin of each run (a Python harness for call- and
assert-based tests), :mod:`.compare` decides whether an answer is the expected one, and
:mod:`.verifier` runs it all (:class:`CodeVerifier`).
"""

from reward_server.verifiers.code.options import (
    DEFAULT_TIMEOUT_S,
    TEST_VERDICTS,
    CodeOptions,
    SandboxMode,
    ScoreRule,
    TestVerdict,
    default_workers,
)
from reward_server.verifiers.code.program import Program, extract_program
from reward_server.verifiers.code.suite import Case, Format, Suite, parse_suite
from reward_server.verifiers.code.verifier import CodeVerifier

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "TEST_VERDICTS",
    "Case",
    "CodeOptions",
    "CodeVerifier",
    "Format",
    "Program",
    "SandboxMode",
    "ScoreRule",
    "Suite",
    "TestVerdict",
    "default_workers",
    "extract_program",
    "parse_suite",
]
