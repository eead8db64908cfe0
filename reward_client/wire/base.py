"""What every wire format shares: one request (:class:`WireRequest`), chunking, numbers,
the deadline and mask headers."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from reward_client.results import UNKNOWN_REASON, ScoreResult

__all__ = [
    "DEADLINE_HEADER",
    "MASKED_HEADER",
    "WireRequest",
    "chunked",
    "is_count",
    "is_number",
    "masked_at",
    "number",
    "parse_masked_header",
]

#: The request header carrying the caller's remaining time budget in milliseconds; the
#: reward server answers by then, with the items it could not finish masked ``deadline``.
DEADLINE_HEADER = "X-Request-Timeout-Ms"

#: The answer header in which the reward server's vLLM- and TEI-shaped routes, which cannot
#: carry null, list the positions of masked items (``0,5,7``; absent when none is).
MASKED_HEADER = "X-Reward-Masked"


@dataclass(frozen=True, slots=True)
class WireRequest:
    """One POST: its path, JSON body and how many items it scores."""

    path: str
    body: dict[str, Any]
    items: int


def chunked(
    path: str, values: list[Any], size: int, body: Callable[[list[Any]], dict[str, Any]]
) -> list[WireRequest]:
    """One request per ``size`` values, its body made by ``body``."""
    chunks = [values[i : i + size] for i in range(0, len(values), size)]
    return [WireRequest(path, body(chunk), len(chunk)) for chunk in chunks]


def is_number(value: object) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_count(value: object) -> bool:
    """A non-negative int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def number(value: object, what: str) -> float:
    """``value`` as a float if it is a finite number; else ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} is {value!r}, not a finite number")
    return float(value)


def parse_masked_header(value: str | None, items: int) -> list[int]:
    """The item positions an ``X-Reward-Masked`` header lists (none for no header);
    ValueError when one is not a position among ``items``."""
    if value is None or not value.strip():
        return []
    positions = []
    for part in value.split(","):
        try:
            position = int(part.strip())
        except ValueError:
            raise ValueError(f"{MASKED_HEADER} holds {part.strip()!r}, not an item index") from None
        if not 0 <= position < items:
            raise ValueError(f"{MASKED_HEADER} names item {position} of {items}")
        positions.append(position)
    return positions


def masked_at(result: ScoreResult, positions: list[int]) -> ScoreResult:
    """``result`` with the items at ``positions`` masked (score None, reason unknown): the
    fill value a protocol without null carries for them is not a score."""
    if not positions:
        return result
    scores = list(result.scores)
    masked: list[str | None] = list(result.masked or [None] * len(scores))
    for position in positions:
        scores[position] = None
        masked[position] = masked[position] or UNKNOWN_REASON
    return replace(result, scores=scores, masked=masked)
