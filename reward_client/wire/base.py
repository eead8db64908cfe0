"""What every wire format shares: one request (:class:`WireRequest`), chunking, numbers."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["WireRequest", "chunked", "is_count", "is_number", "number"]


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
