"""Reward signals: what the rewards the server gives out look like over a recent window, per
model and tenant, for the dashboards and alerts that watch for reward hacking.

For each (model, tenant) the last ``window`` items are kept (a count window, so a quiet
tenant's signals do not empty while it pauses): each item's score (None when masked), its
response's length in characters, and whether the model failed on it. ``model`` is each served
model by name and, for a composite, the combined reward under the answer's name. At a scrape
the window is summarised (:meth:`RewardSignals.snapshot`): score and length quantiles, mean
and standard deviation, the masked and failed shares, and the Pearson correlation of score
with length: length hacking (a policy that learned the reward model likes long answers) shows
as that correlation rising while the scores climb.

For each pair of models scored together in one request (a composite's components, weight-0
monitors included), the last ``window`` items both scored are kept as pairs of scores; their
Spearman rank correlation is the components' agreement: a reward model and a verifier that
stop ranking the same responses alike are the other early sign of a hacked reward model.

For each rubric judge (``mode: rubric``), per tenant and category, the last ``window`` items
whose rubric has a criterion of that category are kept as whether the item failed one: the
share failing each category (an "essential" share falling while the score climbs is a judge
being gamed on the easy criteria).

Characters, not tokens: the models of a composite use different tokenizers, and the
response's text is the one thing they share. Everything here is bounded: models come from the
models file, tenants from the keys file, and each series holds ``window`` items.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

__all__ = [
    "MIN_ITEMS",
    "QUANTILES",
    "AgreementSummary",
    "Distribution",
    "RecentSummary",
    "RewardSignals",
    "RubricSummary",
    "SignalsSnapshot",
    "pearson",
    "spearman",
]

#: The quantiles of score and response length each window reports.
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
#: Fewest scored items (or pairs) a correlation is reported for: below it the figure is noise.
MIN_ITEMS = 10


@dataclass(frozen=True, slots=True)
class Distribution:
    """Values' quantiles (in :data:`QUANTILES`' order), mean and population standard
    deviation."""

    quantiles: tuple[float, ...]
    mean: float
    std: float

    @classmethod
    def of(cls, values: np.ndarray) -> Distribution:
        """The distribution of ``values`` (not empty)."""
        quantiles = tuple(float(q) for q in np.quantile(values, QUANTILES))
        return cls(quantiles, float(values.mean()), float(values.std()))


@dataclass(frozen=True, slots=True)
class RecentSummary:
    """One (model, tenant)'s recent items at a scrape."""

    model: str
    tenant: str
    #: Items held: scored, masked or failed.
    items: int
    #: Shares of :attr:`items` masked (no score) and failed (masked, or filled with the
    #: entry's ``on_error`` number).
    masked_ratio: float
    failed_ratio: float
    #: The scored items' scores and responses' lengths in characters (None: none scored).
    scores: Distribution | None
    chars: Distribution | None
    #: Pearson correlation of score with length (None: under :data:`MIN_ITEMS` scored items,
    #: or either does not vary).
    length_correlation: float | None


@dataclass(frozen=True, slots=True)
class AgreementSummary:
    """Two models' agreement for one tenant at a scrape (``model`` < ``other``)."""

    model: str
    other: str
    tenant: str
    #: Items both models scored in the window.
    items: int
    #: Spearman rank correlation of their scores (None: under :data:`MIN_ITEMS` items, or
    #: either model's scores do not vary).
    agreement: float | None


@dataclass(frozen=True, slots=True)
class RubricSummary:
    """One rubric judge's recent items of one category, for one tenant, at a scrape."""

    model: str
    tenant: str
    category: str
    #: Items held (each with a criterion of the category).
    items: int
    #: Share of them that failed a criterion of the category.
    failed_ratio: float


@dataclass(frozen=True, slots=True)
class SignalsSnapshot:
    """Every window at a scrape."""

    recent: tuple[RecentSummary, ...] = ()
    agreements: tuple[AgreementSummary, ...] = ()
    rubrics: tuple[RubricSummary, ...] = ()


def pearson(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float | None:
    """The Pearson correlation of ``x`` and ``y``; None when either is constant."""
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return None
    a = a - a.mean()
    b = b - b.mean()
    denominator = float(np.sqrt((a * a).sum() * (b * b).sum()))
    # Rounding can carry a perfect correlation a hair past 1.
    return max(-1.0, min(1.0, float((a * b).sum() / denominator)))


def _ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks, ties sharing their mean rank (as Spearman's coefficient wants)."""
    v = np.asarray(values, dtype=np.float64)
    order = np.argsort(v, kind="mergesort")
    ranks = np.empty(len(v), dtype=np.float64)
    ranks[order] = np.arange(1, len(v) + 1, dtype=np.float64)
    _, inverse, counts = np.unique(v, return_inverse=True, return_counts=True)
    sums = np.zeros(len(counts))
    np.add.at(sums, inverse, ranks)
    return (sums / counts)[inverse]


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation of ``x`` and ``y`` (Pearson's of their tie-averaged
    ranks); None when either is constant."""
    return pearson(_ranks(x), _ranks(y))


T = TypeVar("T")


class _Recent(Generic[T]):
    """The last ``size`` values added: a ring, the oldest overwritten."""

    __slots__ = ("_next", "_values", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._values: list[T] = []
        self._next = 0  # where the next value goes once the ring is full

    def extend(self, values: Iterable[T]) -> None:
        for value in values:
            if len(self._values) < self.size:
                self._values.append(value)
            else:
                self._values[self._next] = value
                self._next = (self._next + 1) % self.size

    def values(self) -> list[T]:
        """Oldest first."""
        return self._values[self._next :] + self._values[: self._next]


@dataclass(slots=True)
class _Item:
    score: float | None  # None: masked
    chars: int
    failed: bool


def _summary(model: str, tenant: str, items: Sequence[_Item]) -> RecentSummary:
    n = len(items)
    scored = [item for item in items if item.score is not None]
    scores_d = chars_d = correlation = None
    if scored:
        scores = np.array([item.score for item in scored], dtype=np.float64)
        chars = np.array([item.chars for item in scored], dtype=np.float64)
        scores_d, chars_d = Distribution.of(scores), Distribution.of(chars)
        if len(scored) >= MIN_ITEMS:
            correlation = pearson(scores, chars)
    share = 1 / n if n else 0.0
    masked = (n - len(scored)) * share
    failed = sum(item.failed for item in items) * share
    return RecentSummary(model, tenant, n, masked, failed, scores_d, chars_d, correlation)


class RewardSignals:
    """The windows, filled by the scoring pipeline after each request and summarised at a
    scrape. ``window`` 0 keeps nothing (the series are left out)."""

    def __init__(self, window: int = 1000) -> None:
        self.window = window
        self._items: dict[tuple[str, str], _Recent[_Item]] = {}
        self._pairs: dict[tuple[str, str, str], _Recent[tuple[float, float]]] = {}
        self._rubrics: dict[tuple[str, str, str], _Recent[bool]] = {}
        # The pipeline records on the event loop; a scrape may read from another thread.
        self._lock = threading.Lock()

    def record(
        self,
        tenant: str,
        model: str,
        scores: Sequence[float | None],
        failed: Sequence[bool],
        chars: Sequence[int],
    ) -> None:
        """Add one request's items as ``model`` scored them (None: masked) for ``tenant``."""
        if self.window <= 0:
            return
        with self._lock:
            recent = self._items.get((model, tenant))
            if recent is None:
                recent = self._items[(model, tenant)] = _Recent(self.window)
            recent.extend(
                _Item(score, n, fail) for score, fail, n in zip(scores, failed, chars, strict=True)
            )

    def record_agreement(self, tenant: str, scores: dict[str, Sequence[float | None]]) -> None:
        """Add one request's items as several models scored them (None: masked), each pair
        of models the items both scored."""
        if self.window <= 0 or len(scores) < 2:
            return
        with self._lock:
            for a, b in itertools.combinations(sorted(scores), 2):
                pairs = self._pairs.get((a, b, tenant))
                if pairs is None:
                    pairs = self._pairs[(a, b, tenant)] = _Recent(self.window)
                both = zip(scores[a], scores[b], strict=True)
                pairs.extend((x, y) for x, y in both if x is not None and y is not None)

    def record_rubric(
        self, tenant: str, model: str, categories: Iterable[Sequence[tuple[str, bool]]]
    ) -> None:
        """Add one request's items as a rubric judge judged them: per item, each category
        of its rubric and whether the item failed it."""
        if self.window <= 0:
            return
        with self._lock:
            for item in categories:
                for category, failed in item:
                    recent = self._rubrics.get((model, tenant, category))
                    if recent is None:
                        recent = self._rubrics[(model, tenant, category)] = _Recent(self.window)
                    recent.extend([failed])

    def snapshot(self) -> SignalsSnapshot:
        """Every window summarised now."""
        with self._lock:
            items = {key: recent.values() for key, recent in self._items.items()}
            pairs = {key: recent.values() for key, recent in self._pairs.items()}
            rubrics = {key: recent.values() for key, recent in self._rubrics.items()}
        recent = tuple(
            _summary(model, tenant, held) for (model, tenant), held in sorted(items.items())
        )
        agreements = []
        for (a, b, tenant), held in sorted(pairs.items()):
            agreement = None
            if len(held) >= MIN_ITEMS:
                xs, ys = zip(*held, strict=True)
                agreement = spearman(xs, ys)
            agreements.append(AgreementSummary(a, b, tenant, len(held), agreement))
        by_category = tuple(
            RubricSummary(model, tenant, category, len(held), sum(held) / len(held))
            for (model, tenant, category), held in sorted(rubrics.items())
            if held
        )
        return SignalsSnapshot(recent, tuple(agreements), by_category)
