"""An item's tests, read from its label: :func:`parse_suite` turns the formats code datasets
use into one :class:`Suite`.

- standard input/output, ``{"inputs": [...], "outputs": [...]}`` (APPS, TACO, CodeContests,
  LiveCodeBench, verl's ``sandbox_fusion``): each input is a program's stdin, its output
  the stdout expected (a list of strings is taken as lines);
- call-based, ``{"fn_name": "f", "inputs": [[args...]], "outputs": [result]}`` (APPS/TACO):
  each input is the list of arguments (or, as verl writes them, a string holding one JSON
  value per line), each output the value expected;
- assert-based, ``{"test": "...", "entry_point": "f"}`` (HumanEval: the test defines
  ``check(candidate)``, called with the entry point; MBPP-style plain asserts need no entry
  point): one test; ``{"assert_case": ["assert f(1) == 2", ...]}`` (verl) or MBPP's
  ``{"test_list": [...], "test_setup_code": "..."}``: one test per assert.

The label is that dict or a JSON string of it; keys not named here are ignored (datasets
carry more). An unusable label is a ValueError whose message is the item's reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Case", "Format", "Suite", "parse_suite"]

#: How a suite's tests run: the program's stdin/stdout, a call of one of its functions, or
#: test code (asserts) run after it.
Format = Literal["stdio", "call", "assert"]


@dataclass(frozen=True, slots=True)
class Case:
    """One test. ``stdio``: ``stdin`` and the ``expected`` stdout (a string); ``call``: the
    arguments (``args``) and the ``expected`` value; ``assert``: the test ``code``."""

    stdin: str = ""
    expected: Any = None
    args: tuple[Any, ...] = ()
    code: str = ""


@dataclass(frozen=True, slots=True)
class Suite:
    """An item's tests, all of one format. ``fn_name``: the function a call-based test calls;
    ``entry_point``: the function HumanEval's ``check`` is given; ``setup``: code run before
    each assert-based test (MBPP's ``test_setup_code``)."""

    format: Format
    cases: tuple[Case, ...]
    fn_name: str | None = None
    entry_point: str | None = None
    setup: str = ""


def parse_suite(label: Any) -> Suite:
    """The tests ``label`` holds (ValueError naming what is wrong with it)."""
    data = _as_dict(label)
    if "assert_case" in data or "test_list" in data:
        key = "assert_case" if "assert_case" in data else "test_list"
        return _asserts(data, key)
    if "test" in data:
        return _humaneval(data)
    if "inputs" in data or "outputs" in data:
        if data.get("fn_name") is not None:
            return _call_based(data)
        return _stdio(data)
    keys = ", ".join(sorted(map(str, data))) or "none"
    raise ValueError(
        "the label holds no tests: expected inputs/outputs, fn_name with inputs/outputs, "
        f"test (with entry_point) or assert_case (its keys: {keys})"
    )


def _as_dict(label: Any) -> dict[str, Any]:
    if label is None:
        raise ValueError("the item has no label (its tests)")
    if isinstance(label, str):
        try:
            label = json.loads(label)
        except json.JSONDecodeError as exc:
            raise ValueError(f"the label is a string but not JSON: {exc}") from None
    if not isinstance(label, dict):
        raise ValueError(f"the label must be an object of tests, not {type(label).__name__}")
    return label


def _text(value: Any, what: str) -> str:
    """A stdin or stdout: a string, or a list of lines."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "\n".join(value) + ("\n" if value else "")
    raise ValueError(f"{what} must be a string (or a list of lines), not {type(value).__name__}")


def _pairs(data: dict[str, Any]) -> list[tuple[Any, Any]]:
    inputs, outputs = data.get("inputs"), data.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list):
        raise ValueError("inputs and outputs must both be lists")
    if len(inputs) != len(outputs):
        raise ValueError(f"{len(inputs)} inputs for {len(outputs)} outputs")
    if not inputs:
        raise ValueError("the label has no tests (inputs is empty)")
    return list(zip(inputs, outputs, strict=True))


def _stdio(data: dict[str, Any]) -> Suite:
    cases = tuple(
        Case(stdin=_text(stdin, f"input {i}"), expected=_text(stdout, f"output {i}"))
        for i, (stdin, stdout) in enumerate(_pairs(data))
    )
    return Suite("stdio", cases)


def _arguments(value: Any, i: int) -> tuple[Any, ...]:
    """A call's arguments: a list of them, or verl's string of one JSON value per line."""
    if isinstance(value, list):
        return tuple(value)
    if isinstance(value, str):
        try:
            return tuple(json.loads(line) for line in value.split("\n") if line.strip())
        except json.JSONDecodeError as exc:
            raise ValueError(f"input {i}: a line is not JSON ({exc})") from None
    raise ValueError(f"input {i} must be a list of arguments, not {type(value).__name__}")


def _name(data: dict[str, Any], key: str) -> str:
    name = data.get(key)
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"{key} must be a Python identifier, not {name!r}")
    return name


def _call_based(data: dict[str, Any]) -> Suite:
    fn_name = _name(data, "fn_name")
    cases = tuple(
        Case(args=_arguments(args, i), expected=expected)
        for i, (args, expected) in enumerate(_pairs(data))
    )
    return Suite("call", cases, fn_name=fn_name)


def _humaneval(data: dict[str, Any]) -> Suite:
    test = data["test"]
    if not isinstance(test, str) or not test.strip():
        raise ValueError("test must be a non-empty string of Python test code")
    entry_point = _name(data, "entry_point") if data.get("entry_point") is not None else None
    return Suite("assert", (Case(code=test),), entry_point=entry_point)


def _asserts(data: dict[str, Any], key: str) -> Suite:
    asserts = data[key]
    if not isinstance(asserts, list) or not all(isinstance(a, str) for a in asserts):
        raise ValueError(f"{key} must be a list of strings (Python asserts)")
    if not asserts:
        raise ValueError(f"the label has no tests ({key} is empty)")
    setup = data.get("test_setup_code") or ""
    if not isinstance(setup, str):
        raise ValueError("test_setup_code must be a string")
    return Suite("assert", tuple(Case(code=a) for a in asserts), setup=setup)
