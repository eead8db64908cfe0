"""The arithmetic of composite rewards: a model's own score from its head's logits, and the
combined score of several models (pure Python: no torch, no HTTP).

For models ``m`` with own scores ``s_m`` (per item)::

    v_m = weight_m * (s_m - mean_m) / std_m        # normalize is optional: mean 0, std 1
    weighted_sum = sum_m v_m,   mean = sum_m v_m / M,   min = min_m v_m
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import get_args

from reward_server.config import AggregateName

__all__ = [
    "AGGREGATES",
    "AggregateName",
    "Weighting",
    "combine",
    "label_weights",
    "own_score",
]

AGGREGATES: tuple[str, ...] = get_args(AggregateName)


@dataclass(frozen=True, slots=True)
class Weighting:
    """How one model's own score enters the combined score: ``weight * (s - mean) / std``."""

    weight: float = 1.0
    mean: float = 0.0
    std: float = 1.0

    def apply(self, score: float) -> float:
        """This model's term ``v_m`` of one item."""
        return self.weight * (score - self.mean) / self.std


def label_weights(labels: Sequence[str], objectives: Mapping[str, float]) -> list[float]:
    """Weights by label index from weights by label name (labels not named weigh 0);
    ValueError naming the names that are not labels of the head."""
    unknown = [name for name in objectives if name not in labels]
    if unknown:
        raise ValueError(
            f"objectives name unknown label(s) {', '.join(map(repr, unknown))}; "
            f"the head's labels are {', '.join(labels)}"
        )
    return [float(objectives.get(label, 0.0)) for label in labels]


def own_score(logits: Sequence[float], label_index: int, weights: Sequence[float] | None) -> float:
    """A sequence model's own score of one item: the raw logit at ``label_index``, or with
    ``weights`` (one per label) the weighted sum of every label's raw logit."""
    if weights is None:
        return float(logits[label_index])
    if len(weights) != len(logits):
        raise ValueError(f"{len(weights)} objective weights for {len(logits)} logits")
    return math.fsum(w * x for w, x in zip(weights, logits, strict=True))


def combine(
    scores: Mapping[str, Sequence[float]],
    weighting: Mapping[str, Weighting],
    aggregate: AggregateName,
) -> list[float]:
    """The combined score per item of the models in ``scores`` (name -> own score per item)."""
    if not scores:
        raise ValueError("no model scores to combine")
    if aggregate not in AGGREGATES:
        raise ValueError(f"unknown aggregate {aggregate!r}; choose {', '.join(AGGREGATES)}")
    lengths = {len(values) for values in scores.values()}
    if len(lengths) != 1:
        raise ValueError(f"the models scored different numbers of items: {sorted(lengths)}")
    # terms[i]: every model's v_m of item i
    terms = [[weighting[name].apply(s) for s in values] for name, values in scores.items()]
    per_item = list(zip(*terms, strict=True))
    if aggregate == "min":
        return [min(vs) for vs in per_item]
    total = [math.fsum(vs) for vs in per_item]
    if aggregate == "mean":
        return [t / len(scores) for t in total]
    return total
