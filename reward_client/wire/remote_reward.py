"""This project's server (protocol ``remote-reward``): ``POST /score`` bodies and answers.

A body holds one input column as given (``texts``, ``queries`` and ``responses``, or
``conversations``: lists of OpenAI chat messages or ``{"messages", "tools"}`` objects, tool
calls, tool results and ``reasoning_content`` as they are) and its ``labels`` when given,
then ``truncate`` and this server's own fields (``model``, ``components``, ``cache``, the
call's ``tools``). An answer holds ``scores``, ``tokens`` and ``truncated`` per item and,
from a composite server, the breakdown (:data:`~reward_client.results.BREAKDOWN`), each
checked for shape and finiteness here. A ``null`` score is a masked item; ``masked``, sent
when some item is, gives the reason of each (or null for a scored item); a component and
an outcome score may be ``null`` too.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

from reward_client.results import BREAKDOWN, UNKNOWN_REASON, ScoreResult
from reward_client.wire.base import WireRequest, is_count, is_number

__all__ = ["find_max_client_batch", "parse", "requests"]


def requests(
    columns: dict[str, list[Any]], size: int, truncate: bool | None, fields: Mapping[str, Any]
) -> list[WireRequest]:
    """``/score`` requests of at most ``size`` items each."""
    n = len(next(iter(columns.values())))
    bodies: list[dict[str, Any]] = [
        {k: v[i : i + size] for k, v in columns.items()} for i in range(0, n, size)
    ]
    for body in bodies:
        if truncate is not None:
            body["truncate"] = truncate
        body.update(fields)
    # The first key of a body is its input column (then truncate and fields).
    return [WireRequest("/score", b, len(next(iter(b.values())))) for b in bodies]


def parse(payload: object, expected: int) -> ScoreResult:
    """A ``/score`` answer checked for shape and finiteness; ValueError naming what is wrong."""
    if not isinstance(payload, dict):
        raise ValueError(f"expected a JSON object, got {type(payload).__name__}")
    columns: dict[str, list[Any]] = {}
    for key in ("scores", "tokens", "truncated"):
        column = payload.get(key)
        if not isinstance(column, list):
            raise ValueError(f"{key!r} missing or not a list")
        if len(column) != expected:
            raise ValueError(f"{len(column)} {key} for {expected} items")
        columns[key] = column
    for i, score in enumerate(columns["scores"]):
        if score is not None and not is_number(score):
            raise ValueError(f"score {i} is {score!r}, not a finite number or null")
    for i, count in enumerate(columns["tokens"]):
        if not is_count(count):
            raise ValueError(f"tokens {i} is {count!r}, not a count")
    for i, flag in enumerate(columns["truncated"]):
        if not isinstance(flag, bool):
            raise ValueError(f"truncated {i} is {flag!r}, not a bool")
    scores = [None if s is None else float(s) for s in columns["scores"]]
    return ScoreResult(
        scores=scores,
        tokens=list(columns["tokens"]),
        truncated=list(columns["truncated"]),
        masked=_masked(payload.get("masked"), scores),
        **_breakdown(payload, expected),
    )


def _masked(column: object, scores: list[float | None]) -> list[str | None] | None:
    """Each item's mask reason (None for a scored one), or None when no item is masked; a
    null score without a reason gets :data:`~reward_client.results.UNKNOWN_REASON`."""
    if column is None:
        reasons: list[object] = [None] * len(scores)
    elif isinstance(column, list) and len(column) == len(scores):
        reasons = column
    else:
        raise ValueError(f"masked is not a list of {len(scores)} reasons")
    out: list[str | None] = []
    for i, (score, reason) in enumerate(zip(scores, reasons, strict=True)):
        if reason is not None and not isinstance(reason, str):
            raise ValueError(f"masked[{i}] is {reason!r}, not a reason or null")
        if score is None:
            out.append(reason or UNKNOWN_REASON)
        elif reason is not None:
            raise ValueError(f"item {i} has a score and a mask reason ({reason!r})")
        else:
            out.append(None)
    return out if any(r is not None for r in out) else None


def _checked(
    column: object, expected: int | None, what: str, ok: Callable[[object], bool], kind: str
) -> list[Any]:
    """``column`` if it is a list of values that are ``ok`` (``expected`` of them unless
    None); else ValueError naming the first wrong one (``kind``: "number", "score": a
    number or null, or "count")."""
    if not isinstance(column, list) or (expected is not None and len(column) != expected):
        count = "" if expected is None else f"{expected} "
        raise ValueError(f"{what} is not a list of {count}{kind}s")
    wanted = {"number": "a finite number", "score": "a finite number or null"}
    for i, value in enumerate(column):
        if not ok(value):
            raise ValueError(f"{what}[{i}] is {value!r}, not {wanted.get(kind, f'a {kind}')}")
    return list(column)


def _numbers(column: object, expected: int | None, what: str) -> list[float]:
    """Finite numbers as floats (``expected`` of them unless None); ValueError if not."""
    return [float(v) for v in _checked(column, expected, what, is_number, "number")]


def _is_score(value: object) -> bool:
    """A finite number, or null for a masked one."""
    return value is None or is_number(value)


def _scores(column: object, expected: int, what: str) -> list[float | None]:
    """``expected`` finite numbers as floats or None (masked); ValueError if not."""
    checked = _checked(column, expected, what, _is_score, "score")
    return [None if v is None else float(v) for v in checked]


def _offsets(column: object, expected: int | None, what: str) -> list[int]:
    """Non-negative ints (``expected`` of them unless None); ValueError if not."""
    return _checked(column, expected, what, is_count, "count")


def _per_item(
    column: object, expected: int, what: str, row: Callable[[object, None, str], list[Any]]
) -> list[list[Any]]:
    """One list per item, each checked by ``row``."""
    if not isinstance(column, list) or len(column) != expected:
        raise ValueError(f"{what} is not a list of {expected} lists")
    return [row(value, None, f"{what}[{i}]") for i, value in enumerate(column)]


def _named(
    column: object, expected: int, what: str, values: Callable[[object, int, str], list[Any]]
) -> dict[str, list[Any]]:
    """Name -> ``expected`` values, each list checked by ``values``."""
    if not isinstance(column, dict):
        raise ValueError(f"{what} is not an object of name -> scores")
    return {str(k): values(v, expected, f"{what}[{k!r}]") for k, v in column.items()}


def _criteria(column: object, expected: int, what: str) -> list[list[dict[str, Any]] | None]:
    """Per item, a rubric judge's criteria verdicts (objects with a bool verdict and a finite
    probability and weight) or null; ValueError if not."""
    if not isinstance(column, list) or len(column) != expected:
        raise ValueError(f"{what} is not a list of {expected} items")
    out: list[list[dict[str, Any]] | None] = []
    for i, row in enumerate(column):
        if row is None:
            out.append(None)
            continue
        if not isinstance(row, list):
            raise ValueError(f"{what}[{i}] is not a list of criteria or null")
        for j, c in enumerate(row):
            if (
                not isinstance(c, dict)
                or not isinstance(c.get("verdict"), bool)
                or not is_number(c.get("probability"))
                or not is_number(c.get("weight"))
            ):
                raise ValueError(f"{what}[{i}][{j}] is {c!r}, not a criterion's verdict")
        out.append([dict(c) for c in row])
    return out


def _breakdown(payload: dict[str, Any], expected: int) -> dict[str, Any]:
    """The breakdown fields present in an answer, checked (absent or null: None)."""
    out: dict[str, Any] = {}
    checks: dict[str, Callable[[object], Any]] = {
        "components": lambda c: _named(c, expected, "components", _scores),
        "objectives": lambda c: _named(c, expected, "objectives", _numbers),
        "step_scores": lambda c: _per_item(c, expected, "step_scores", _numbers),
        "step_ends": lambda c: _per_item(c, expected, "step_ends", _offsets),
        "steps_dropped": lambda c: _offsets(c, expected, "steps_dropped"),
        "criteria": lambda c: _named(c, expected, "criteria", _criteria),
    }
    for key in BREAKDOWN:
        column = payload.get(key)
        if column is None:
            continue
        check = checks.get(key)
        out[key] = check(column) if check is not None else _scores(column, expected, key)
    scores, ends = out.get("step_scores"), out.get("step_ends")
    if (scores is None) != (ends is None):
        raise ValueError("step_scores and step_ends come together")
    for i, (row, offsets) in enumerate(zip(scores or [], ends or [], strict=True)):
        if len(row) != len(offsets):
            raise ValueError(f"item {i}: {len(row)} step_scores but {len(offsets)} step_ends")
        if any(b < a for a, b in itertools.pairwise(offsets)):
            raise ValueError(f"item {i}: step_ends {offsets} are not in order")
    return out


def find_max_client_batch(info: object) -> int | None:
    """``max_client_batch`` from ``/info``, at the top level or one object down."""
    if not isinstance(info, dict):
        return None
    candidates = [info] + [v for v in info.values() if isinstance(v, dict)]
    for mapping in candidates:
        value = mapping.get("max_client_batch")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
