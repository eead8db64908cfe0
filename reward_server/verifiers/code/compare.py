"""Whether a program's answer is the expected one.

- :func:`outputs_match` (stdin/stdout tests): line by line, each line's trailing whitespace
  ignored, trailing empty lines ignored, ``\\r\\n`` read as ``\\n``; with a float tolerance,
  lines that differ are compared token by token (split on whitespace) and two numeric
  tokens match when they are close (:func:`close`);
- :func:`values_match` (call-based tests): JSON-normalised equality (a tuple is a list,
  dictionary keys are strings: the harness sends the value as JSON), floats close within the
  tolerance; as APPS's own checker, a value also matches an expected one-element list
  ``[value]``; as verl's sandbox client, a non-string value also matches an expected string
  that is its printed form (JSON for lists, dicts, booleans and None; ``str`` for numbers).
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["close", "outputs_match", "printed", "values_match"]


def close(actual: float, expected: float, tolerance: float) -> bool:
    """``|actual - expected| <= tolerance``, absolute or relative to ``expected``
    (``math.isclose`` with both tolerances equal)."""
    return math.isclose(actual, expected, rel_tol=tolerance, abs_tol=tolerance)


def _lines(text: str) -> list[str]:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _number(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _tokens_match(actual: str, expected: str, tolerance: float) -> bool:
    got, want = actual.split(), expected.split()
    if len(got) != len(want):
        return False
    for a, e in zip(got, want, strict=True):
        if a == e:
            continue
        x, y = _number(a), _number(e)
        if x is None or y is None or not close(x, y, tolerance):
            return False
    return True


def outputs_match(actual: str, expected: str, tolerance: float | None = None) -> bool:
    """Whether stdout ``actual`` is ``expected`` (see the module docstring)."""
    got, want = _lines(actual), _lines(expected)
    if len(got) != len(want):
        return False
    for a, e in zip(got, want, strict=True):
        if a == e:
            continue
        if tolerance is None or not _tokens_match(a, e, tolerance):
            return False
    return True


def _normal(value: Any) -> Any:
    """``value`` as JSON would carry it: tuples as lists, keys as strings."""
    return json.loads(json.dumps(value))


def _equal(actual: Any, expected: Any, tolerance: float | None) -> bool:
    if isinstance(actual, bool) or isinstance(expected, bool):
        return type(actual) is type(expected) and actual == expected
    if isinstance(actual, int | float) and isinstance(expected, int | float):
        if tolerance is None or (isinstance(actual, int) and isinstance(expected, int)):
            return actual == expected
        return close(float(actual), float(expected), tolerance)
    if isinstance(actual, list) and isinstance(expected, list):
        return len(actual) == len(expected) and all(
            _equal(a, e, tolerance) for a, e in zip(actual, expected, strict=True)
        )
    if isinstance(actual, dict) and isinstance(expected, dict):
        return actual.keys() == expected.keys() and all(
            _equal(actual[k], expected[k], tolerance) for k in actual
        )
    return type(actual) is type(expected) and actual == expected


def printed(value: Any) -> str:
    """``value`` as verl's sandbox harness prints it: JSON for lists, dicts, booleans and
    None, ``str`` for numbers and strings."""
    if isinstance(value, dict | list | bool) or value is None:
        return json.dumps(value)
    return str(value)


def values_match(actual: Any, expected: Any, tolerance: float | None = None) -> bool:
    """Whether a call-based test's result ``actual`` (parsed from the harness's JSON) is
    ``expected`` (see the module docstring)."""
    try:
        want = _normal(expected)
    except (TypeError, ValueError):
        return False
    if _equal(actual, want, tolerance):
        return True
    if isinstance(want, list) and len(want) == 1 and _equal(actual, want[0], tolerance):
        return True
    if isinstance(want, str) and not isinstance(actual, str):
        return printed(actual).rstrip("\n") == want.rstrip("\n")
    return False
