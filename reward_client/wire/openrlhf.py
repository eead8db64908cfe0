"""OpenRLHF's remote reward model (protocol ``openrlhf``): ``POST /get_reward``.

Texts go as ``query``; pairs are joined as query + response; no conversations; labels as
``labels``. The
answer's ``rewards`` are the scores; it reports neither tokens nor truncation per item:
the result says 0 tokens and not truncated. This project's ``/get_reward`` answers a
masked item with a fill value and ``extra_logs["masked"]`` 1.0 for it: the item's score is
None here (reason unknown).
"""

from __future__ import annotations

from typing import Any

from reward_client.results import ScoreResult
from reward_client.wire.base import WireRequest, chunked, masked_at, number

__all__ = ["parse", "requests"]


def requests(columns: dict[str, list[Any]], size: int) -> list[WireRequest]:
    """``/get_reward`` requests of at most ``size`` texts each (with their labels)."""
    texts = columns.get("texts") or [
        q + r for q, r in zip(columns["queries"], columns["responses"], strict=True)
    ]
    labels = columns.get("labels")
    if labels is None:
        return chunked("/get_reward", texts, size, lambda c: {"query": c})
    rows = list(zip(texts, labels, strict=True))
    return chunked(
        "/get_reward",
        rows,
        size,
        lambda c: {"query": [t for t, _ in c], "labels": [x for _, x in c]},
    )


def parse(payload: object, items: int) -> ScoreResult:
    """Scores of a ``/get_reward`` answer; ValueError naming what is wrong with it."""
    if not isinstance(payload, dict):
        raise ValueError(f"expected a JSON object, got {type(payload).__name__}")
    rewards = payload.get("rewards")
    if not isinstance(rewards, list) or len(rewards) != items:
        raise ValueError(f"'rewards' missing or not {items} values")
    scores: list[float | None] = [number(r, f"reward {i}") for i, r in enumerate(rewards)]
    result = ScoreResult(scores, [0] * items, [False] * items)
    return masked_at(result, _masked(payload.get("extra_logs"), items))


def _masked(extra_logs: object, items: int) -> list[int]:
    """The positions ``extra_logs["masked"]`` flags (1.0), if the answer has it."""
    flags = extra_logs.get("masked") if isinstance(extra_logs, dict) else None
    if flags is None:
        return []
    if not isinstance(flags, list) or len(flags) != items:
        raise ValueError(f"extra_logs.masked is not a list of {items} flags")
    return [i for i, flag in enumerate(flags) if number(flag, f"extra_logs.masked[{i}]")]
