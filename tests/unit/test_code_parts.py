"""The code verifier's pure parts, without a sandbox: reading tests from labels, finding the
program in a response, comparing answers, and the files and input the harness gets (the
harness run on trusted programs, as a plain subprocess: test_code_harness.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reward_server.verifiers.code.compare import outputs_match, printed, values_match
from reward_server.verifiers.code.harness import files, stdin
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


def test_stdio_runs_the_program_itself() -> None:
    suite = parse_suite({"inputs": ["1\n"], "outputs": ["1\n"]})
    assert files(suite, "print(input())", "main.cpp") == {"main.cpp": "print(input())"}
    assert stdin(suite, suite.cases[0]) == ("1\n", None)
