"""One scrape of ``/metrics`` and the figures two scrapes give: rates of counters and
quantiles of histograms over the time between them, computed the way Prometheus's
``rate()`` and ``histogram_quantile()`` do."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Delta", "Labels", "Snapshot", "histogram_quantile", "increase"]

#: A sample's labels.
Labels = Mapping[str, str]


@dataclass(frozen=True)
class Snapshot:
    """The samples of one scrape, by sample name (``..._total``, ``..._bucket``), taken at
    ``time`` (seconds of a monotonic clock)."""

    time: float
    samples: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, time: float) -> Snapshot:
        """The samples of a Prometheus text exposition."""
        samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
        return cls(time, samples)

    def has(self, name: str) -> bool:
        return bool(self.samples.get(name))

    def series(self, name: str, **match: str) -> list[tuple[dict[str, str], float]]:
        """The samples of ``name`` whose labels include ``match``."""
        return [
            (labels, value)
            for labels, value in self.samples.get(name, [])
            if all(labels.get(k) == v for k, v in match.items())
        ]

    def total(self, name: str, **match: str) -> float | None:
        """The sum of the matching samples; None when there is none."""
        found = self.series(name, **match)
        return sum(value for _, value in found) if found else None

    def by(self, name: str, label: str, **match: str) -> dict[str, float]:
        """The matching samples summed by the value of ``label`` (samples without it left out)."""
        sums: dict[str, float] = {}
        for labels, value in self.series(name, **match):
            if label in labels:
                sums[labels[label]] = sums.get(labels[label], 0.0) + value
        return sums

    def buckets(self, name: str, **match: str) -> dict[float, float]:
        """Cumulative bucket counts of histogram ``name`` (without ``_bucket``) by upper bound,
        summed over the matching series (as ``sum by (le)`` does)."""
        sums: dict[float, float] = {}
        for labels, value in self.series(f"{name}_bucket", **match):
            bound = float(labels["le"])
            sums[bound] = sums.get(bound, 0.0) + value
        return sums


def increase(current: float, previous: float | None) -> float:
    """How much a counter grew: a counter that went down was reset (the server restarted),
    and counts from zero, as Prometheus's ``increase()`` takes it."""
    if previous is None or current < previous:
        return current
    return current - previous


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus's ``histogram_quantile``: the ``q``-quantile of cumulative bucket counts by
    upper bound, interpolated linearly inside the bucket that holds it. None without
    observations; the highest finite bound when the rank falls in the +Inf bucket."""
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    bounds = sorted(buckets)
    if len(bounds) < 2 or bounds[-1] != math.inf:
        return None
    counts = [buckets[b] for b in bounds]
    for i in range(1, len(counts)):  # repair counts that are not monotonic, as Prometheus does
        counts[i] = max(counts[i], counts[i - 1])
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    index = next(i for i, count in enumerate(counts) if count >= rank)
    if index == len(bounds) - 1:
        return bounds[-2]
    if index == 0 and bounds[0] <= 0:
        return bounds[0]
    start = bounds[index - 1] if index > 0 else 0.0
    below = counts[index - 1] if index > 0 else 0.0
    end, count = bounds[index], counts[index]
    if count <= below:  # only for q = 0 over empty low buckets
        return start
    return start + (end - start) * (rank - below) / (count - below)


@dataclass(frozen=True)
class Delta:
    """What happened between two scrapes: counter rates per second and histogram quantiles
    of the observations made in between."""

    previous: Snapshot
    current: Snapshot

    @property
    def seconds(self) -> float:
        return max(self.current.time - self.previous.time, 1e-9)

    def rate(self, name: str, **match: str) -> float | None:
        """Per-second increase of the matching samples' sum; None when the server has none."""
        now = self.current.total(name, **match)
        if now is None:
            return None
        return increase(now, self.previous.total(name, **match)) / self.seconds

    def rates_by(self, name: str, label: str, **match: str) -> dict[str, float]:
        """Per-second increase by the value of ``label``."""
        before = self.previous.by(name, label, **match)
        return {
            key: increase(value, before.get(key)) / self.seconds
            for key, value in self.current.by(name, label, **match).items()
        }

    def bucket_increase(self, name: str, **match: str) -> dict[float, float]:
        """The cumulative bucket counts of the observations made between the scrapes."""
        now = self.current.buckets(name, **match)
        before = self.previous.buckets(name, **match)
        if now.get(math.inf, 0.0) < before.get(math.inf, 0.0):  # reset: all of now is new
            return now
        return {bound: increase(value, before.get(bound)) for bound, value in now.items()}

    def quantile(self, q: float, name: str, **match: str) -> float | None:
        """The ``q``-quantile of histogram ``name`` over the observations between the scrapes."""
        return histogram_quantile(q, self.bucket_increase(name, **match))
