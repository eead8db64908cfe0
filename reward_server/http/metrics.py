"""The HTTP layer's series: items scored by endpoint, requests by endpoint and status, their
latency, those being handled, error answers, and the requests that authenticated, by tenant. They live in the
app's one registry, beside the core's (:class:`~reward_server.scoring.metrics.Metrics`)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from reward_server.scoring.metrics import TIME_BUCKETS, Metrics, counter, gauge, histogram

__all__ = ["HttpMetrics", "app_metrics"]


class HttpMetrics:
    """Counted by the scoring routes, the metrics middleware and the error answers."""

    def __init__(self, registry: CollectorRegistry) -> None:
        endpoint, tenant = ("endpoint",), ("tenant",)
        self.items = counter(registry, "items", "Items scored successfully, by endpoint.", endpoint)
        self.requests = counter(
            registry, "requests", "HTTP requests by endpoint and status.", (*endpoint, "status")
        )
        latency = "HTTP request latency by endpoint."
        self.request_seconds = histogram(
            registry, "request_duration_seconds", latency, TIME_BUCKETS, endpoint
        )
        handled = "HTTP requests being handled, by endpoint."
        self.in_progress = gauge(registry, "requests_in_progress", handled, endpoint)
        errors = "Error answers by status and kind."
        self.errors = counter(registry, "errors", errors, ("status", "type"))
        authenticated = "HTTP requests that authenticated, by tenant, endpoint and status."
        self.tenant_requests = counter(
            registry, "tenant_requests", authenticated, (*tenant, *endpoint, "status")
        )
        tenant_errors = "Error answers to authenticated requests, by tenant and status."
        self.tenant_errors = counter(registry, "tenant_errors", tenant_errors, (*tenant, "status"))

    def on_answer(self, endpoint: str, status: int, seconds: float, tenant: str | None) -> None:
        """Count one answered request (by its tenant too, when it authenticated) and its time."""
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()
        self.request_seconds.labels(endpoint=endpoint).observe(seconds)
        if tenant is not None:
            self.tenant_requests.labels(tenant=tenant, endpoint=endpoint, status=str(status)).inc()
            if status >= 400:
                self.tenant_errors.labels(tenant=tenant, status=str(status)).inc()

    def on_error(self, status: int, kind: str) -> None:
        """Count one error answer."""
        self.errors.labels(status=str(status), type=kind).inc()


def app_metrics(reward_window: int = 1000) -> tuple[Metrics, HttpMetrics]:
    """A new app's metrics: the core's and the HTTP layer's, in one registry of its own
    (``reward_window``: items per model and tenant of the reward signals; 0: none)."""
    core = Metrics(reward_window)
    return core, HttpMetrics(core.registry)
