"""Prometheus metrics of one app instance (its own registry, so apps never share counters)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    exposition,
    generate_latest,
)

PREFIX = "reward_server"
CONTENT_TYPE = exposition.CONTENT_TYPE_LATEST

_ROWS_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
_RATIO_BUCKETS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
_TIME_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    """Counters and histograms of the server; also the batcher's ``BatchObserver``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            f"{PREFIX}_requests",
            "HTTP requests by endpoint and status.",
            ["endpoint", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            f"{PREFIX}_request_duration_seconds",
            "HTTP request latency by endpoint.",
            ["endpoint"],
            buckets=_TIME_BUCKETS,
            registry=r,
        )
        self.in_progress = Gauge(
            f"{PREFIX}_requests_in_progress",
            "HTTP requests being handled, by endpoint.",
            ["endpoint"],
            registry=r,
        )
        self.errors = Counter(
            f"{PREFIX}_errors",
            "Error answers by status and kind.",
            ["status", "type"],
            registry=r,
        )
        self.items = Counter(
            f"{PREFIX}_items", "Items scored successfully, by endpoint.", ["endpoint"], registry=r
        )
        self.tokens = Counter(f"{PREFIX}_tokens", "Tokens scored (unpadded).", registry=r)
        self.truncated = Counter(f"{PREFIX}_truncated_items", "Items truncated.", registry=r)
        self.batches = Counter(
            f"{PREFIX}_batches",
            "Forward passes by outcome (ok or error).",
            ["outcome"],
            registry=r,
        )
        self.batch_rows = Histogram(
            f"{PREFIX}_batch_rows", "Rows per forward pass.", buckets=_ROWS_BUCKETS, registry=r
        )
        self.padded_tokens = Counter(
            f"{PREFIX}_batch_padded_tokens", "Padded tokens run through the model.", registry=r
        )
        self.padding_efficiency = Histogram(
            f"{PREFIX}_batch_padding_efficiency",
            "Real tokens / padded tokens per forward pass (1.0 = no padding).",
            buckets=_RATIO_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            f"{PREFIX}_queue_wait_seconds",
            "Time an item waited before its forward pass.",
            buckets=_TIME_BUCKETS,
            registry=r,
        )
        self.inference = Histogram(
            f"{PREFIX}_inference_seconds",
            "Duration of one forward pass.",
            buckets=_TIME_BUCKETS,
            registry=r,
        )
        self.queued = Gauge(f"{PREFIX}_queue_items", "Items waiting to be scored.", registry=r)
        self.ready = Gauge(f"{PREFIX}_ready", "1 when the server accepts work.", registry=r)

    def track_queue(self, queued: Callable[[], float]) -> None:
        """Read the queue length from ``queued`` whenever metrics are scraped."""
        self.queued.set_function(queued)

    def on_batch(
        self,
        *,
        rows: int,
        real_tokens: int,
        padded_tokens: int,
        queue_wait_s: Sequence[float],
        inference_s: float,
        error: BaseException | None,
    ) -> None:
        """Record one forward pass (BatchObserver protocol of the batcher)."""
        self.batches.labels(outcome="ok" if error is None else "error").inc()
        self.batch_rows.observe(rows)
        self.padded_tokens.inc(padded_tokens)
        if padded_tokens > 0:
            self.padding_efficiency.observe(real_tokens / padded_tokens)
        for wait in queue_wait_s:
            self.queue_wait.observe(wait)
        self.inference.observe(inference_s)

    def render(self) -> bytes:
        """The Prometheus text exposition of this registry."""
        return generate_latest(self.registry)
