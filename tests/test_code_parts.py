"""The code verifier's pure parts, without a sandbox: reading tests from labels, finding the
program in a response, comparing answers, and the Python harness of call- and assert-based
tests (run here as a plain subprocess on trusted programs: the harness's own logic)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from reward_server.verifiers.code.compare import outputs_match, printed, values_match
from reward_server.verifiers.code.harness import files, read_outcome, stdin
from reward_server.verifiers.code.program import extract_program, fenced_blocks
from reward_server.verifiers.code.suite import Case, parse_suite

ALIASES = {"python": "python", "py": "python", "python3": "python", "cpp": "cpp", "c++": "cpp"}
ALIASES |= {"javascript": "javascript", "js": "javascript", "node": "javascript"}


def resolve(tag: str) -> str | None:
    return ALIASES.get(tag)


# ----------------------------------------------------------------------------------------
# Labels.


def test_stdio_label_as_dict_or_json_string() -> None:
    label = {"inputs": ["1 2\n", ["3 4", "5"]], "outputs": ["3\n", ["7", "5"]], "extra": 1}
    for given in (label, json.dumps(label)):
        suite = parse_suite(given)
        assert suite.format == "stdio"
        assert suite.cases == (Case(stdin="1 2\n", expected="3\n"), Case("3 4\n5\n", "7\n5\n"))


def test_call_based_label_takes_argument_lists_or_verl_json_lines() -> None:
    suite = parse_suite({"fn_name": "add", "inputs": [[1, 2], "[3]\n4\n"], "outputs": [3, [7]]})
    assert suite.format == "call" and suite.fn_name == "add"
    assert [c.args for c in suite.cases] == [(1, 2), ([3], 4)]
    assert [c.expected for c in suite.cases] == [3, [7]]


def test_assert_based_labels() -> None:
    humaneval = parse_suite({"test": "def check(candidate):\n    pass\n", "entry_point": "f"})
    assert humaneval.format == "assert" and humaneval.entry_point == "f"
    assert len(humaneval.cases) == 1
    verl = parse_suite({"assert_case": ["assert f(1) == 2", "assert f(2) == 4"]})
    assert [c.code for c in verl.cases] == ["assert f(1) == 2", "assert f(2) == 4"]
    mbpp = parse_suite({"test_list": ["assert g() == 1"], "test_setup_code": "import math"})
    assert mbpp.setup == "import math" and len(mbpp.cases) == 1
    plain = parse_suite({"test": "assert f(1) == 2"})
    assert plain.entry_point is None


@pytest.mark.parametrize(
    ("label", "reason"),
    [
        (None, "no label"),
        ("not json", "not JSON"),
        ([1, 2], "not list"),
        ({"answer": 3}, "holds no tests"),
        ({"inputs": [], "outputs": []}, "no tests"),
        ({"inputs": ["1"], "outputs": []}, "1 inputs for 0 outputs"),
        ({"inputs": [1], "outputs": ["1"]}, "input 0 must be a string"),
        ({"fn_name": "not an identifier", "inputs": [[1]], "outputs": [1]}, "identifier"),
        ({"assert_case": []}, "assert_case is empty"),
        ({"test": "  "}, "non-empty"),
    ],
)
def test_unusable_labels_say_why(label: Any, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_suite(label)


# ----------------------------------------------------------------------------------------
# The program in a response.


def test_last_block_in_an_allowed_language_wins_over_later_output_blocks() -> None:
    response = (
        "First try:\n```python\nprint(1)\n```\nBetter:\n```py\nprint(2)\n```\n"
        "Output:\n```\n2\n```\n"
    )
    program = extract_program(response, ["python"], resolve)
    assert (program.source, program.language, program.refused) == ("print(2)\n", "python", None)


def test_language_tag_picks_among_allowed_languages() -> None:
    response = "```cpp\nint main() {}\n```\nand in Python\n```python\nprint()\n```"
    assert extract_program(response, ["cpp", "python"], resolve).language == "python"
    program = extract_program("```c++\nint main() {}\n```", ["python", "cpp"], resolve)
    assert (program.language, program.refused) == ("cpp", None)


def test_untagged_block_is_in_the_first_language() -> None:
    program = extract_program("```\nprint(3)\n```", ["python", "cpp"], resolve)
    assert (program.source, program.language) == ("print(3)\n", "python")


def test_block_in_a_language_not_allowed_is_refused() -> None:
    program = extract_program("```js\nconsole.log(1)\n```", ["python"], resolve)
    assert program.language == "javascript"
    assert program.refused is not None and "javascript" in program.refused
    odd = extract_program("```haskell\nmain = print 1\n```", ["python"], resolve)
    assert odd.refused is not None and "haskell" in odd.refused


def test_no_block_means_the_whole_response() -> None:
    program = extract_program("print(4)\n", ["python"], resolve)
    assert (program.source, program.language, program.refused) == ("print(4)\n", "python", None)
    # A block cut short (the generation ended) is no block.
    assert extract_program("```python\nprint(", ["python"], resolve).source == "```python\nprint("


def test_fences_of_tildes_and_longer_fences_and_tag_attributes() -> None:
    text = "~~~python\na\n~~~\n````py title='x'\n```\nb\n````\n"
    assert fenced_blocks(text) == [("python", "a\n"), ("py", "```\nb\n")]


# ----------------------------------------------------------------------------------------
# Comparing answers.


@pytest.mark.parametrize(
    ("actual", "expected", "tolerance", "match"),
    [
        ("3\n", "3", None, True),
        ("3   \r\n4\t\n\n\n", "3\n4\n", None, True),
        (" 3\n", "3\n", None, False),  # leading whitespace counts
        ("3\n4\n", "3\n", None, False),
        ("0.3333\n", "0.333333\n", None, False),
        ("0.3333 x\n", "0.333333 x\n", 1e-3, True),
        ("0.3333 y\n", "0.333333 x\n", 1e-3, False),
        ("1000001\n", "1000000\n", 1e-6, True),  # relative
        ("1.5\n", "1.6\n", 1e-3, False),
        ("nan\n", "nan\n", 1e-3, True),  # equal as text
    ],
)
def test_outputs_match(actual: str, expected: str, tolerance: float | None, match: bool) -> None:
    assert outputs_match(actual, expected, tolerance) is match


@pytest.mark.parametrize(
    ("actual", "expected", "tolerance", "match"),
    [
        ([1, 2], (1, 2), None, True),  # a tuple is a list
        ({"1": "a"}, {1: "a"}, None, True),  # keys are strings
        (3, [3], None, True),  # APPS: [value]
        ([3], [[3]], None, True),
        (3, [3, 4], None, False),
        (True, 1, None, False),
        (0.1 + 0.2, 0.3, None, False),
        (0.1 + 0.2, 0.3, 1e-9, True),
        ([0.1 + 0.2, "x"], [0.3, "x"], 1e-9, True),
        (7, "7", None, True),  # verl: the printed form
        ([1, 2], "[1, 2]\n", None, True),
        (None, "null", None, True),
        ("7", 7, None, False),
    ],
)
def test_values_match(actual: Any, expected: Any, tolerance: float | None, match: bool) -> None:
    assert values_match(actual, expected, tolerance) is match


def test_printed_is_verl_s_form() -> None:
    assert [printed(v) for v in (1, 2.5, "s", [1], {"a": 1}, True, None)] == [
        "1",
        "2.5",
        "s",
        "[1]",
        '{"a": 1}',
        "true",
        "null",
    ]


# ----------------------------------------------------------------------------------------
# The harness, run bare on trusted programs.


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


def test_stdio_runs_the_program_itself() -> None:
    suite = parse_suite({"inputs": ["1\n"], "outputs": ["1\n"]})
    assert files(suite, "print(input())", "main.cpp") == {"main.cpp": "print(input())"}
    assert stdin(suite, suite.cases[0]) == ("1\n", None)
