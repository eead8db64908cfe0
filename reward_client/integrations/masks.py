"""Masked items in the frameworks: their fill value, and one warning per call that had any.

The reward server masks an item whose reward could not be computed (its score is None,
with a reason: :class:`~reward_client.ScoreResult`). TRL leaves such a completion out of its
group's baseline (the TRL adapter hands it the None); verl and OpenRLHF have no notion of a
sample without a reward, so their adapters give it a fill value: ``masked_score`` (keyword
argument) or ``REWARD_MASKED_SCORE`` (environment), 0.0 by default, and log how many items
of the call got it.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping

from reward_client.results import ScoreResult

__all__ = ["DEFAULT_MASKED_SCORE", "filled", "masked_score", "report_masked"]

#: The score verl and OpenRLHF get for a masked item unless ``masked_score`` says otherwise.
DEFAULT_MASKED_SCORE = 0.0


def masked_score(kwargs: Mapping[str, object]) -> float:
    """The fill value for masked items: ``masked_score`` among ``kwargs``, else
    ``$REWARD_MASKED_SCORE``, else :data:`DEFAULT_MASKED_SCORE`; a finite number."""
    value = kwargs.get("masked_score")
    if value is None:
        value = os.environ.get("REWARD_MASKED_SCORE") or DEFAULT_MASKED_SCORE
    try:
        fill = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"masked_score must be a number, got {value!r}") from None
    if not math.isfinite(fill):
        raise ValueError(f"masked_score must be finite, got {value!r}")
    return fill


def filled(scores: list[float | None], fill: float) -> list[float]:
    """``scores`` with each masked one (None) replaced by ``fill``."""
    return [fill if score is None else score for score in scores]


def report_masked(logger: logging.Logger, where: str, result: ScoreResult, outcome: str) -> None:
    """One warning when some items of ``result`` are masked: how many, why, and ``outcome``
    (what the framework does with them); nothing when none is."""
    count = result.masked_count
    if not count:
        return
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(result.masked_reasons().items()))
    logger.warning(
        "%s: the reward server masked %d of %d item(s) (%s): %s",
        where,
        count,
        len(result),
        reasons,
        outcome,
    )
