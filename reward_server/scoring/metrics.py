"""Prometheus metrics of one app instance (its own registry, so apps never share series).

Counters and histograms count where things happen (a request's items, each forward pass, the
score cache's hits). The gauges (queues, verifier workers, readiness, the score cache's size,
the tenants in force) are read when Prometheus scrapes, by one collector, from one plain
snapshot of the served models (:class:`RegistryState`, from each served model's and the cache's
``snapshot()``) and the tenants in force. The HTTP layer's series
(:mod:`reward_server.http.metrics`) live in the same registry.

Every series whose label values are known before the first event exists from the start, at 0:
a series that first appears at 1 has no earlier sample, so ``rate()`` and ``increase()`` never
count that first event (an alert on the first errors of a quiet server would stay silent).
Known at start: each served model and the reasons its kind can fail or mask with
(:class:`ModelSeries`, made when the models start: :meth:`Metrics.declare_models`), each
tenant in force (at :meth:`Metrics.watch` and after each reload: :meth:`Metrics.per_tenant`),
each outcome, and in the HTTP layer each endpoint, status and error type. The reward signals
are the exception: a quantile or a correlation of no items is not 0, so they appear with
their first items.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    exposition,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily

from reward_server.scheduling import BatchObserver, BatchStats
from reward_server.scoring.known_labels import OUTCOMES, Labelled, ModelSeries, tenant_names, zeros
from reward_server.scoring.signals import QUANTILES, RewardSignals, SignalsSnapshot

if TYPE_CHECKING:
    from reward_server.config.models_file import ModelSpec
    from reward_server.config.tenants import TenantTable

__all__ = [
    "CONTENT_TYPE",
    "TIME_BUCKETS",
    "CacheState",
    "Metrics",
    "ModelState",
    "RegistryState",
    "counter",
    "gauge",
    "histogram",
]

PREFIX = "reward_server"
CONTENT_TYPE = exposition.CONTENT_TYPE_LATEST

_ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_RATIO_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
TIME_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


def counter(
    registry: CollectorRegistry, name: str, doc: str, labels: Sequence[str] = ()
) -> Counter:
    """A counter ``reward_server_<name>_total`` in ``registry``."""
    return Counter(f"{PREFIX}_{name}", doc, labels, registry=registry)


def histogram(
    registry: CollectorRegistry,
    name: str,
    doc: str,
    buckets: Sequence[float],
    labels: Sequence[str] = (),
) -> Histogram:
    """A histogram ``reward_server_<name>`` in ``registry``."""
    return Histogram(f"{PREFIX}_{name}", doc, labels, buckets=buckets, registry=registry)


def gauge(registry: CollectorRegistry, name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
    """A gauge ``reward_server_<name>`` in ``registry``, set where its value changes."""
    return Gauge(f"{PREFIX}_{name}", doc, labels, registry=registry)


# ---------------------------------------------------------------------- read at a scrape


@dataclass(frozen=True, slots=True)
class ModelState:
    """One started served model at a scrape."""

    name: str
    #: Rows queued, not yet in a pass (a verifier: items being verified; a remote
    #: component: items the remote is scoring).
    queued: int
    #: A verifier's workers ready now (processes, or a code verifier's test slots); None
    #: for the other kinds.
    live_workers: int | None = None
    #: ``queued`` by tenant, for the models whose scheduler keeps tenant queues.
    tenants_queued: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class CacheState:
    """The score cache at a scrape."""

    entries: int = 0
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class RegistryState:
    """The served models at a scrape: whether they accept work, the started ones, the cache."""

    ready: bool = False
    models: tuple[ModelState, ...] = ()
    cache: CacheState = CacheState()

    @property
    def queued(self) -> int:
        """Items waiting, over every model."""
        return sum(model.queued for model in self.models)


class StateSource(Protocol):
    """What the collector reads the served models' state from (the model registry is one)."""

    def snapshot(self) -> RegistryState:
        """The state now."""
        ...


class TenantSource(Protocol):
    """What the collector reads the tenants in force from (``TenantKeys`` is one)."""

    @property
    def table(self) -> TenantTable | None:
        """The tenants in force now (None: no key, every request is the default tenant)."""
        ...


def _in_force(source: TenantSource | None) -> list[str]:
    """The names of the tenants in force (none before :meth:`Metrics.watch` names a source)."""
    return tenant_names(source.table) if source is not None else []


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)


class _StateCollector:
    """The gauges, built from one snapshot each time the registry is collected (zeros
    until :meth:`Metrics.watch` names what to read)."""

    def __init__(self) -> None:
        self.models: StateSource | None = None
        self.tenants: TenantSource | None = None

    def describe(self) -> list[GaugeMetricFamily]:
        """The families, without reading anything (the registry's names)."""
        return list(self._families(RegistryState(), ()))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The families with their values now."""
        state = self.models.snapshot() if self.models is not None else RegistryState()
        return self._families(state, _in_force(self.tenants))

    @staticmethod
    def _families(state: RegistryState, tenants: Sequence[str]) -> Iterator[GaugeMetricFamily]:
        yield _gauge("queue_items", "Items waiting to be scored.", state.queued)
        yield _gauge("ready", "1 when the server accepts work.", 1.0 if state.ready else 0.0)
        model = ["model"]
        queued = GaugeMetricFamily(
            f"{PREFIX}_model_queue_items", "Items waiting, by model.", labels=model
        )
        workers = GaugeMetricFamily(
            f"{PREFIX}_verifier_workers", "Live worker processes of each verifier.", labels=model
        )
        by_tenant = dict.fromkeys(tenants, 0)
        for one in state.models:
            queued.add_metric([one.name], one.queued)
            if one.live_workers is not None:
                workers.add_metric([one.name], one.live_workers)
            for tenant, n in one.tenants_queued:
                by_tenant[tenant] = by_tenant.get(tenant, 0) + n
        yield queued
        yield workers
        tenant_queued = GaugeMetricFamily(
            f"{PREFIX}_tenant_queue_items",
            "Items waiting, by tenant, over every model (every tenant in force, and any other "
            "with items waiting).",
            labels=["tenant"],
        )
        for tenant, n in sorted(by_tenant.items()):
            tenant_queued.add_metric([tenant], n)
        yield tenant_queued
        yield _gauge(
            "score_cache_entries", "Entries the score cache holds now.", state.cache.entries
        )
        yield _gauge(
            "score_cache_bytes",
            "Bytes counted for the score cache's entries now.",
            state.cache.bytes,
        )
        yield _gauge(
            "tenants",
            "Tenants now in force (the keys file's; 1 without --api-keys).",
            len(tenants),
        )


def _signal_families(snapshot: SignalsSnapshot) -> Iterator[GaugeMetricFamily]:
    """The reward signals' gauges from one snapshot (:mod:`reward_server.scoring.signals`):
    each over the window of the last ``--reward-window`` items of a model and tenant."""
    by, quantile = ["model", "tenant"], ["model", "tenant", "quantile"]

    def family(name: str, doc: str, labels: list[str] = by) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"{PREFIX}_reward_{name}", doc, labels=labels)

    items = family("window_items", "Items in the reward window (scored, masked or failed).")
    score = family("score", "Quantiles of the window's scores (masked items left out).", quantile)
    mean = family("score_mean", "Mean of the window's scores.")
    std = family("score_stddev", "Standard deviation of the window's scores.")
    chars = family(
        "response_chars", "Quantiles of the window's response lengths (characters).", quantile
    )
    chars_mean = family("response_chars_mean", "Mean response length (characters).")
    correlation = family(
        "length_correlation",
        "Pearson correlation of score with response length over the window's scored items "
        "(left out under 10 items or without variance): rising = length hacking.",
    )
    masked = family("masked_ratio", "Share of the window's items masked (no score).")
    failed = family(
        "failed_ratio", "Share of the window's items the model failed on (masked or filled)."
    )
    for w in snapshot.recent:
        labels = [w.model, w.tenant]
        items.add_metric(labels, w.items)
        masked.add_metric(labels, w.masked_ratio)
        failed.add_metric(labels, w.failed_ratio)
        if w.scores is not None and w.chars is not None:
            quantiles = zip(QUANTILES, w.scores.quantiles, w.chars.quantiles, strict=True)
            for q, value, length in quantiles:
                score.add_metric([*labels, str(q)], value)
                chars.add_metric([*labels, str(q)], length)
            mean.add_metric(labels, w.scores.mean)
            std.add_metric(labels, w.scores.std)
            chars_mean.add_metric(labels, w.chars.mean)
        if w.length_correlation is not None:
            correlation.add_metric(labels, w.length_correlation)
    agreement = family(
        "component_agreement",
        "Spearman rank correlation of two models' scores over the last items both scored in "
        "one request (model < other; left out under 10 items): falling = they disagree.",
        ["model", "other", "tenant"],
    )
    rubric = family(
        "rubric_failed_ratio",
        "Share of a rubric judge's last items with a criterion of the category that failed one "
        "(not met, or a pitfall committed), by model, tenant and category.",
        ["model", "tenant", "category"],
    )
    rows: list[tuple[GaugeMetricFamily, list[str], float | None]] = [
        (agreement, [a.model, a.other, a.tenant], a.agreement) for a in snapshot.agreements
    ]
    rows += [(rubric, [r.model, r.tenant, r.category], r.failed_ratio) for r in snapshot.rubrics]
    for metric, values, value in rows:
        if value is not None:
            metric.add_metric(values, value)
    yield from (items, score, mean, std, chars, chars_mean, correlation, masked, failed, agreement)
    yield rubric


class _SignalsCollector:
    """The reward signals' gauges, summarised from the windows at each scrape."""

    def __init__(self, signals: RewardSignals) -> None:
        self.signals = signals

    def describe(self) -> list[GaugeMetricFamily]:
        """The families, without reading the windows."""
        return list(_signal_families(SignalsSnapshot()))

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The families with their values now."""
        return _signal_families(self.signals.snapshot())


#: The counters of items by model and reason: (name, help).
_REASON_COUNTERS = (
    (
        "verifier_errors",
        "Items a verifier or judge failed on (on_error), by model and reason (timeout, crash, "
        "error, non_finite, bad_result, sandbox_error, parse_failure, deadline).",
    ),
    (
        "remote_errors",
        "Items a remote component failed on (on_error), by model and reason (remote_error, "
        "timeout, parse_failure, or the remote's own mask reason).",
    ),
    (
        "masked_items",
        "Items a model gave no score (null in scores), by model and reason: a failure of an "
        "entry with on_error: mask, or the request's deadline.",
    ),
)


class Metrics:
    """The core's counters and histograms, and the collector of its gauges, in the app's
    registry; also the batcher's ``BatchObserver``."""

    def __init__(self, reward_window: int = 1000) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        #: The reward signals' windows (filled by the scoring pipeline).
        self.signals = RewardSignals(reward_window)
        self._state = _StateCollector()
        #: The series made for every tenant in force: (metric, its other labels' sets).
        self._per_tenant: list[tuple[Labelled, tuple[Mapping[str, str], ...]]] = []
        # Scoring (the pipeline; the items by endpoint are the HTTP layer's).
        self.tokens = self._counter("tokens", "Tokens scored (unpadded).")
        self.truncated = self._counter("truncated_items", "Items truncated.")
        # Forward passes (the batcher, through on_batch).
        self.batches = self._counter(
            "batches", "Forward passes by outcome (ok or error).", ("outcome",)
        )
        self.batch_rows = self._histogram("batch_rows", "Rows per forward pass.", _ROWS_BUCKETS)
        self.padded_tokens = self._counter(
            "batch_padded_tokens", "Padded tokens run through the model."
        )
        self.padding_efficiency = self._histogram(
            "batch_padding_efficiency",
            "Real tokens / padded tokens per forward pass (1.0 = no padding).",
            _RATIO_BUCKETS,
        )
        self.queue_wait = self._histogram(
            "queue_wait_seconds", "Time an item waited before its forward pass.", TIME_BUCKETS
        )
        self.inference = self._histogram(
            "inference_seconds", "Duration of one forward pass.", TIME_BUCKETS
        )
        zeros(self.batches, ({"outcome": o} for o in OUTCOMES))
        self._model_series()
        self._score_cache_series()
        self._tenant_series()
        self.registry.register(self._state)
        if reward_window > 0:
            self.registry.register(_SignalsCollector(self.signals))

    def watch(self, models: StateSource, tenants: TenantSource) -> None:
        """Read the gauges from ``models``' snapshot and ``tenants`` at every scrape; make
        the series of every tenant in force now."""
        self._state.models = models
        self._state.tenants = tenants
        self._tenant_zeros()

    def per_tenant(self, metric: Labelled, others: Iterable[Mapping[str, str]] = ({},)) -> None:
        """Make ``metric``'s series of every tenant in force (from :meth:`watch` on, and of
        each tenant a reload adds), one per label set of ``others`` (its labels but tenant)."""
        self._per_tenant.append((metric, tuple(others)))
        self._tenant_zeros()

    def _tenant_zeros(self) -> None:
        for tenant in _in_force(self._state.tenants):
            for metric, others in self._per_tenant:
                zeros(metric, ({**labels, "tenant": tenant} for labels in others))

    def declare_models(
        self, specs: Iterable[ModelSpec], cached: Callable[[ModelSpec], bool]
    ) -> None:
        """Make the by-model series of the served models ``specs`` (when they start);
        ``cached``: whether the score cache serves a model of an entry (``caches_kind``)."""
        for model in (ModelSeries.of(spec, cached=cached(spec)) for spec in specs):
            name = {"model": model.name}
            counted: list[Labelled] = [self.model_items, self.model_tokens]
            if model.passes:
                counted += [self.model_batch_rows, self.model_inference]
                counted += [self.model_cached_tokens, self.model_dropped_rows]
                zeros(self.model_batches, ({**name, "outcome": o} for o in OUTCOMES))
            if model.cached:
                counted += [self.score_cache_hits, self.score_cache_misses]
                counted.append(self.score_cache_duplicates)
            for metric in counted:
                zeros(metric, (name,))
            for metric in (self.rubric_items, self.rubric_failed_items):
                zeros(metric, ({**name, "category": c} for c in model.rubric_categories))
            for metric, reasons in (
                (self.verifier_errors, model.verifier_errors),
                (self.remote_errors, model.remote_errors),
                (self.masked_items, model.masked),
            ):
                zeros(metric, ({**name, "reason": r} for r in reasons))

    def _model_series(self) -> None:
        """The series by served model (the server's series above sum over the models) and
        those of verifiers and remote components."""
        model = ("model",)
        self.model_items = self._counter("model_items", "Items scored, by model.", model)
        self.model_tokens = self._counter("model_tokens", "Tokens scored, by model.", model)
        self.model_batches = self._counter(
            "model_batches", "Forward passes by model and outcome.", (*model, "outcome")
        )
        self.model_batch_rows = self._histogram(
            "model_batch_rows", "Rows per forward pass, by model.", _ROWS_BUCKETS, model
        )
        self.model_inference = self._histogram(
            "model_inference_seconds",
            "Duration of one forward pass, by model.",
            TIME_BUCKETS,
            model,
        )
        self.model_cached_tokens = self._counter(
            "model_cached_tokens",
            "Prompt tokens served from the engine's prefix cache instead of computed, by "
            "model (vLLM engine).",
            model,
        )
        # Items failed (verifiers and judges; remote components) and masked, by reason.
        by_reason = (*model, "reason")
        self.verifier_errors, self.remote_errors, self.masked_items = (
            self._counter(name, doc, by_reason) for name, doc in _REASON_COUNTERS
        )
        # Rubric judges: the share of items failing a category is failed / items.
        by_category = (*model, "category")
        self.rubric_items = self._counter(
            "rubric_items",
            "Items a rubric judge scored whose rubric has a criterion of the category, by "
            "model and category (uncategorised: criteria given by weight alone).",
            by_category,
        )
        self.rubric_failed_items = self._counter(
            "rubric_failed_items",
            "Items a rubric judge scored that failed a criterion of the category (not met, or "
            "a pitfall committed), by model and category; / rubric_items = the share failing.",
            by_category,
        )
        self.model_dropped_rows = self._counter(
            "model_dropped_rows",
            "Rows queued for a model whose request ended before they started (client "
            "disconnected, deadline passed, another model failed): never run, by model.",
            model,
        )

    def _tenant_series(self) -> None:
        """The series by tenant: names come from the keys file (--api-keys), or "default"
        without one, so the label set stays bounded. The server-wide series above keep their
        names and sum over the tenants (requests by tenant: :mod:`reward_server.http.metrics`)."""
        tenant = ("tenant",)
        self.tenant_items = self._counter("tenant_items", "Items scored, by tenant.", tenant)
        self.tenant_tokens = self._counter(
            "tenant_tokens", "Tokens scored (unpadded), by tenant.", tenant
        )
        self.tenant_reloads = self._counter(
            "tenant_reloads",
            "Reloads of the keys file by outcome (ok; error: the old tenants stay).",
            ("outcome",),
        )
        self.tenant_queue_wait = self._histogram(
            "tenant_queue_wait_seconds",
            "Time an item waited before its forward pass (vLLM: before vLLM got it), by tenant.",
            TIME_BUCKETS,
            tenant,
        )
        zeros(self.tenant_reloads, ({"outcome": o} for o in OUTCOMES))
        for metric in (self.tenant_items, self.tenant_tokens, self.tenant_queue_wait):
            self.per_tenant(metric)

    def on_tenant_reload(self, ok: bool) -> None:
        """Count one reload of the keys file (after a good one, the new tenants' series)."""
        self.tenant_reloads.labels(outcome="ok" if ok else "error").inc()
        if ok:
            self._tenant_zeros()

    def on_tenant_items(self, tenant: str, items: int, tokens: int) -> None:
        """Count the items and tokens ``tenant`` had scored in one request."""
        self.tenant_items.labels(tenant=tenant).inc(items)
        self.tenant_tokens.labels(tenant=tenant).inc(tokens)

    def _score_cache_series(self) -> None:
        """The score cache's series (:mod:`reward_server.scoring.score_cache`)."""
        model = ("model",)
        self.score_cache_hits = self._counter(
            "score_cache_hits",
            "Items answered from the score cache (scored by an earlier request), by model.",
            model,
        )
        self.score_cache_misses = self._counter(
            "score_cache_misses",
            "Rows the score cache did not hold and the model scored, by model.",
            model,
        )
        self.score_cache_duplicates = self._counter(
            "score_cache_duplicates",
            "Items answered by an identical item of the same request or of a request in "
            "flight (scored once), by model.",
            model,
        )

    def on_score_cache(self, model: str, hits: int, misses: int, duplicates: int) -> None:
        """Count one request's cache hits, misses and in-request duplicates of ``model``."""
        if hits:
            self.score_cache_hits.labels(model=model).inc(hits)
        if misses:
            self.score_cache_misses.labels(model=model).inc(misses)
        if duplicates:
            self.score_cache_duplicates.labels(model=model).inc(duplicates)

    def _counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        return counter(self.registry, name, doc, labels)

    def _histogram(
        self, name: str, doc: str, buckets: Sequence[float], labels: Sequence[str] = ()
    ) -> Histogram:
        return histogram(self.registry, name, doc, buckets, labels)

    def on_verifier_error(self, model: str, reason: str) -> None:
        """Count one item a verifier scored on_error, by reason."""
        self.verifier_errors.labels(model=model, reason=reason).inc()

    def on_rubric_item(self, model: str, categories: Iterable[tuple[str, bool]]) -> None:
        """Count one item a rubric judge scored: each category of its rubric, and whether
        the item failed it."""
        for category, failed in categories:
            self.rubric_items.labels(model=model, category=category).inc()
            if failed:
                self.rubric_failed_items.labels(model=model, category=category).inc()

    def on_masked(self, model: str, reason: str) -> None:
        """Count one item ``model`` masked, by reason."""
        self.masked_items.labels(model=model, reason=reason).inc()

    def on_remote_error(self, model: str, reason: str, items: int = 1) -> None:
        """Count ``items`` a remote component scored on_error, by reason."""
        self.remote_errors.labels(model=model, reason=reason).inc(items)

    def model_observer(self, model: str) -> BatchObserver:
        """The observer of one model's passes: its own series and the server's."""
        return _ModelObserver(self, model)

    def on_model_items(self, model: str, items: int, tokens: int) -> None:
        """Count the items and tokens one model scored for a request."""
        self.model_items.labels(model=model).inc(items)
        self.model_tokens.labels(model=model).inc(tokens)

    def on_batch(self, stats: BatchStats) -> None:
        """Record one forward pass (BatchObserver protocol of the batcher)."""
        self.batches.labels(outcome="ok" if stats.error is None else "error").inc()
        self.batch_rows.observe(stats.rows)
        self.padded_tokens.inc(stats.padded_tokens)
        if stats.padded_tokens > 0:
            self.padding_efficiency.observe(stats.real_tokens / stats.padded_tokens)
        for wait in stats.queue_wait_s:
            self.queue_wait.observe(wait)
        for tenant, wait in zip(stats.tenants, stats.queue_wait_s, strict=False):
            self.tenant_queue_wait.labels(tenant=tenant).observe(wait)
        self.inference.observe(stats.inference_s)

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)


class _ModelObserver:
    """Records one model's passes in its per-model series and in the server's."""

    def __init__(self, metrics: Metrics, model: str) -> None:
        self._metrics = metrics
        self._model = model

    def on_dropped(self, rows: int) -> None:
        """Count rows of this model that never started (BatchObserver protocol)."""
        self._metrics.model_dropped_rows.labels(model=self._model).inc(rows)

    def on_batch(self, stats: BatchStats) -> None:
        """Record one forward pass of this model (BatchObserver protocol)."""
        m, model = self._metrics, self._model
        m.on_batch(stats)
        outcome = "ok" if stats.error is None else "error"
        m.model_batches.labels(model=model, outcome=outcome).inc()
        m.model_batch_rows.labels(model=model).observe(stats.rows)
        m.model_inference.labels(model=model).observe(stats.inference_s)
        if stats.cached_tokens:
            m.model_cached_tokens.labels(model=model).inc(stats.cached_tokens)
