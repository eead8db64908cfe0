"""The Python harness of call- and assert-based tests, run as a plain subprocess on trusted
programs (the harness's own logic, without a sandbox). The code verifier's other pure parts
are in test_code_parts.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from reward_server.verifiers.code.harness import files, read_outcome, stdin
from reward_server.verifiers.code.suite import parse_suite


def run_harness(tmp_path: Path, label: Any, source: str) -> list[tuple[int, Any]]:
    """Each test's exit code and what the harness reported."""
    suite = parse_suite(label)
    for name, text in files(suite, source, "main.py").items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    out = []
    for case in suite.cases:
        data, marker = stdin(suite, case)
        assert marker is not None and marker not in source
        run = subprocess.run(
            [sys.executable, "main.py"],
            input=data,
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=60,
            check=False,
        )
        out.append((run.returncode, read_outcome(run.stdout, marker)))
    return out


def test_harness_calls_a_function_or_a_solution_method(tmp_path: Path) -> None:
    source = "def add(a, b):\n    print('chatter')\n    return (a + b, [a])\n"
    (first,) = run_harness(tmp_path, {"fn_name": "add", "inputs": [[1, 2]], "outputs": [0]}, source)
    assert first[0] == 0 and first[1].finished and first[1].value == [3, [1]]
    leetcode = (
        "from dataclasses import dataclass\n\n@dataclass\nclass Pair:\n    a: int\n\n"
        "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
        "        seen = {}\n        for i, n in enumerate(nums):\n"
        "            if target - n in seen:\n                return [seen[target - n], i]\n"
        "            seen[n] = i\n"
    )
    label = {"fn_name": "twoSum", "inputs": [[[2, 7, 11, 15], 9]], "outputs": [[0, 1]]}
    ((code, outcome),) = run_harness(tmp_path, label, leetcode)
    assert code == 0 and outcome.value == [0, 1]


def test_harness_runs_asserts_and_humaneval_check(tmp_path: Path) -> None:
    source = "def sq(x):\n    return x * x\n"
    check = "def check(candidate):\n    assert candidate(3) == 9\n"
    ((code, outcome),) = run_harness(tmp_path, {"test": check, "entry_point": "sq"}, source)
    assert code == 0 and outcome.finished and outcome.ok
    results = run_harness(
        tmp_path, {"assert_case": ["assert sq(2) == 4", "assert sq(2) == 5"]}, source
    )
    assert [(code, o.finished, o.ok) for code, o in results] == [(0, True, True), (0, True, False)]


def test_harness_tells_an_early_exit_from_a_finished_test(tmp_path: Path) -> None:
    source = "import sys\nsys.exit(0)\ndef sq(x):\n    return 0\n"
    ((code, outcome),) = run_harness(tmp_path, {"assert_case": ["assert sq(2) == 4"]}, source)
    assert code == 0 and not outcome.finished
    main_guard = "def f():\n    return 1\nif __name__ == '__main__':\n    raise SystemExit(3)\n"
    ((code, outcome),) = run_harness(tmp_path, {"assert_case": ["assert f() == 1"]}, main_guard)
    assert code == 0 and outcome.ok  # the program is tested, not run as a script


def test_harness_reports_exceptions_as_a_failed_run(tmp_path: Path) -> None:
    source = "def f(x):\n    raise ValueError('boom')\n"
    ((code, outcome),) = run_harness(
        tmp_path, {"fn_name": "f", "inputs": [[1]], "outputs": [1]}, source
    )
    assert code == 1 and not outcome.finished
    ((code, outcome),) = run_harness(
        tmp_path, {"fn_name": "g", "inputs": [[1]], "outputs": [1]}, source
    )
    assert code == 1 and not outcome.finished  # no such function


def test_harness_reports_a_program_that_does_not_compile(tmp_path: Path) -> None:
    label = {"assert_case": ["assert f() == 1"]}
    ((code, outcome),) = run_harness(tmp_path, label, "def f(:\n")
    assert code == 0 and outcome.finished and outcome.syntax_error and not outcome.ok


def test_harness_reports_a_value_json_cannot_carry(tmp_path: Path) -> None:
    source = "def f():\n    return object()\n"
    ((code, outcome),) = run_harness(
        tmp_path, {"fn_name": "f", "inputs": [[]], "outputs": [1]}, source
    )
    assert code == 0 and outcome.finished and outcome.unserialisable == "object"
