"""The HTTP layer's series: items scored by endpoint, requests by endpoint and status, their
latency, those being handled, error answers, and the requests that authenticated, by tenant. They live in the
app's one registry, beside the core's (:class:`~reward_server.scoring.metrics.Metrics`).

Each exists at 0 from the start for the label values known then
(:mod:`reward_server.scoring.known_labels`): every counted endpoint, the statuses of the error
table (and 200), each error type, every tenant in force.
"""

from __future__ import annotations

from reward_server.errors import UnauthorizedError
from reward_server.http.errors import ERRORS
from reward_server.scoring.known_labels import zeros
from reward_server.scoring.metrics import TIME_BUCKETS, Metrics, counter, gauge, histogram

__all__ = ["ENDPOINTS", "OTHER_ENDPOINT", "HttpMetrics", "app_metrics"]

#: Endpoints counted by name in metrics; anything else is :data:`OTHER_ENDPOINT` (a bounded
#: label set).
ENDPOINTS = frozenset(
    {
        *("/score", "/get_reward", "/health", "/info", "/metrics", "/docs", "/openapi.json"),
        *("/classify", "/v1/classify", "/pooling", "/v1/models", "/predict", "/slime/reward"),
        *("/run_code", "/verify", "/seed_session"),
        # OpenAI's graders API; /v1/graders: the endpoint graders' items (their requests,
        # one path per kind: grader entry, are "other")
        *("/v1/fine_tuning/alpha/graders/run", "/v1/fine_tuning/alpha/graders/validate"),
        "/v1/graders",
    }
)
OTHER_ENDPOINT = "other"
#: The error answers' (status, type), from the one error table.
_ERROR_TYPES = sorted(set(ERRORS.values()))
#: The statuses counted from the start: success and every status of the error table (an
#: authenticated request's: all but the missing or wrong key's).
_STATUSES = sorted({200, *(status for status, _ in _ERROR_TYPES)})
_TENANT_STATUSES = [s for s in _STATUSES if s != ERRORS[UnauthorizedError][0]]


class HttpMetrics:
    """Counted by the scoring routes, the metrics middleware and the error answers."""

    def __init__(self, core: Metrics) -> None:
        registry, endpoint, tenant = core.registry, ("endpoint",), ("tenant",)
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
        self._zeros(core)

    def _zeros(self, core: Metrics) -> None:
        """The series of the label values known at start, at 0."""
        endpoints = [{"endpoint": e} for e in (*sorted(ENDPOINTS), OTHER_ENDPOINT)]
        for metric in (self.items, self.request_seconds, self.in_progress):
            zeros(metric, endpoints)
        zeros(self.requests, ({**e, "status": str(s)} for e in endpoints for s in _STATUSES))
        zeros(self.errors, ({"status": str(s), "type": t} for s, t in _ERROR_TYPES))
        answers = [{**e, "status": str(s)} for e in endpoints for s in _TENANT_STATUSES]
        core.per_tenant(self.tenant_requests, answers)
        failed = ({"status": str(s)} for s in _TENANT_STATUSES if s >= 400)
        core.per_tenant(self.tenant_errors, failed)

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
    return core, HttpMetrics(core)
