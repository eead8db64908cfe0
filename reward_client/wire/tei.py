"""text-embeddings-inference (protocol ``tei``): ``POST /predict`` bodies and answers.

Texts go as ``[text]``, pairs as ``[text, text_pair]``; TEI takes no conversations. Raw
logits always (``raw_scores: true``); the reward model has one label. TEI reports neither
tokens nor truncation per item: the result says 0 tokens and not truncated.
"""

from __future__ import annotations

from typing import Any

from reward_client.results import ScoreResult
from reward_client.wire.base import WireRequest, chunked, number

__all__ = ["parse", "requests"]


def requests(columns: dict[str, list[Any]], size: int, truncate: bool | None) -> list[WireRequest]:
    """``/predict`` requests of at most ``size`` texts or pairs each."""
    if "texts" in columns:
        sequences = [[t] for t in columns["texts"]]
    else:
        sequences = [list(p) for p in zip(columns["queries"], columns["responses"], strict=True)]
    extra = {} if truncate is None else {"truncate": truncate}
    return chunked(
        "/predict", sequences, size, lambda c: {"inputs": c, "raw_scores": True, **extra}
    )


def parse(payload: object, items: int) -> ScoreResult:
    """Scores of a ``/predict`` answer; ValueError naming what is wrong with it."""
    if not isinstance(payload, list) or len(payload) != items:
        raise ValueError(f"expected a list of {items} predictions")
    scores: list[float | None] = []
    for i, predictions in enumerate(payload):
        if not isinstance(predictions, list) or len(predictions) != 1:
            raise ValueError(
                f"item {i}: expected one label's prediction (a one-label reward model)"
            )
        entry = predictions[0]
        scores.append(
            number(entry.get("score") if isinstance(entry, dict) else None, f"item {i} score")
        )
    return ScoreResult(scores, [0] * items, [False] * items)
