"""The figures one refresh of ``reward-server top`` shows, from two scrapes of ``/metrics``
and the server's ``/info``: plain data, rendered by :mod:`reward_server.top._render`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reward_server.top._scrape import Delta, Snapshot

__all__ = [
    "MANAGEMENT",
    "QUANTILES",
    "Agreement",
    "EndpointRow",
    "Frame",
    "ModelRow",
    "RewardRow",
    "TenantRow",
    "build_frame",
    "model_names",
]

#: Endpoints that serve no scoring work (the view's own polls among them): left out of the
#: request rates and the endpoint table.
MANAGEMENT = frozenset({"/health", "/info", "/metrics", "/docs", "/openapi.json", "/v1/models"})
#: The quantiles of the reward-signal gauges, in the order shown.
QUANTILES = ("0.05", "0.25", "0.5", "0.75", "0.95")
#: The latency percentiles shown.
PERCENTILES = (0.5, 0.9, 0.99)

REQUESTS = "reward_server_requests_total"
DURATION = "reward_server_request_duration_seconds"
SIGNAL = "reward_server_reward_"


@dataclass(frozen=True)
class EndpointRow:
    endpoint: str
    requests: float  # answered so far
    requests_s: float | None
    items_s: float | None
    errors_s: float | None  # answers with status >= 400
    latency: tuple[float | None, ...]  # PERCENTILES of the request duration, seconds
    in_progress: float


@dataclass(frozen=True)
class TenantRow:
    tenant: str
    items: float
    items_s: float | None
    requests_s: float | None
    errors_s: float | None
    queued: float
    wait_p90: float | None  # seconds an item waited before its forward pass


@dataclass(frozen=True)
class ModelRow:
    model: str
    items: float
    items_s: float | None
    queued: float
    failed_s: float | None  # verifier and remote errors
    masked_s: float | None


@dataclass(frozen=True)
class RewardRow:
    """A model's reward signals over its window of recent items, for one tenant."""

    model: str
    tenant: str
    window: float | None  # None: the server exports no reward signals for it
    quantiles: tuple[float | None, ...]
    mean: float | None
    stddev: float | None
    chars_p50: float | None
    length_correlation: float | None
    masked_ratio: float | None
    failed_ratio: float | None

    @classmethod
    def no_data(cls, model: str) -> RewardRow:
        """A served model the server exports no reward signals for (yet)."""
        return cls(model, "", None, (), *[None] * 6)


@dataclass(frozen=True)
class Agreement:
    model: str
    other: str
    tenant: str
    value: float


@dataclass
class Frame:
    """One refresh: what the server said, or why it could not be asked."""

    url: str
    interval_s: float
    problem: str | None = None  # a line saying why there are no figures now
    info: dict[str, Any] = field(default_factory=dict)
    seconds: float | None = None  # between the two scrapes the rates come from
    ready: bool | None = None
    items: float = 0.0
    requests: float = 0.0
    items_s: float | None = None
    requests_s: float | None = None
    errors_s: float | None = None
    error_ratio: float | None = None
    queued: float = 0.0
    in_progress: float = 0.0
    endpoints: list[EndpointRow] = field(default_factory=list)
    models: list[ModelRow] = field(default_factory=list)
    tenants: list[TenantRow] = field(default_factory=list)
    rewards: list[RewardRow] = field(default_factory=list)
    agreements: list[Agreement] = field(default_factory=list)


def model_names(info: dict[str, Any]) -> list[str]:
    """The served models' names from /info, and a composite's combined name ("a+b") first."""
    names = [str(m["name"]) for m in info.get("models") or [] if isinstance(m, dict)]
    if len(names) > 1:
        return ["+".join(names), *names]
    return names


def _work(endpoint: str) -> bool:
    return endpoint not in MANAGEMENT


def _sum_work(values: dict[str, float]) -> float:
    return sum(v for endpoint, v in values.items() if _work(endpoint))


def _endpoints(now: Snapshot, delta: Delta | None) -> list[EndpointRow]:
    answered = now.by(REQUESTS, "endpoint")
    rows = []
    for endpoint in sorted(e for e in answered if _work(e) and answered[e]):
        errors = None
        if delta is not None:
            by_status = delta.rates_by(REQUESTS, "status", endpoint=endpoint)
            errors = sum(v for status, v in by_status.items() if status[:1] in ("4", "5"))
        rows.append(
            EndpointRow(
                endpoint=endpoint,
                requests=answered[endpoint],
                requests_s=delta.rate(REQUESTS, endpoint=endpoint) if delta else None,
                items_s=delta.rate("reward_server_items_total", endpoint=endpoint)
                if delta
                else None,
                errors_s=errors,
                latency=tuple(
                    delta.quantile(q, DURATION, endpoint=endpoint) if delta else None
                    for q in PERCENTILES
                ),
                in_progress=now.total("reward_server_requests_in_progress", endpoint=endpoint)
                or 0.0,
            )
        )
    return rows


def _tenants(now: Snapshot, delta: Delta | None) -> list[TenantRow]:
    items = now.by("reward_server_tenant_items_total", "tenant")
    queued = now.by("reward_server_tenant_queue_items", "tenant")
    answered = now.by("reward_server_tenant_requests_total", "tenant")
    names = sorted({*items, *queued, *answered})
    req_s = delta.rates_by("reward_server_tenant_requests_total", "tenant") if delta else {}
    items_s = delta.rates_by("reward_server_tenant_items_total", "tenant") if delta else {}
    errors_s = delta.rates_by("reward_server_tenant_errors_total", "tenant") if delta else {}
    wait = "reward_server_tenant_queue_wait_seconds"
    return [
        TenantRow(
            tenant=name,
            items=items.get(name, 0.0),
            items_s=items_s.get(name, 0.0) if delta else None,
            requests_s=req_s.get(name, 0.0) if delta else None,
            errors_s=errors_s.get(name, 0.0) if delta else None,
            queued=queued.get(name, 0.0),
            wait_p90=delta.quantile(0.9, wait, tenant=name) if delta else None,
        )
        for name in names
    ]


def _models(now: Snapshot, delta: Delta | None, served: list[str]) -> list[ModelRow]:
    items = now.by("reward_server_model_items_total", "model")
    queued = now.by("reward_server_model_queue_items", "model")
    names = [*(n for n in served if "+" not in n), *sorted({*items, *queued} - set(served))]
    items_s = delta.rates_by("reward_server_model_items_total", "model") if delta else {}
    failed: dict[str, float] = {}
    for family in ("reward_server_verifier_errors_total", "reward_server_remote_errors_total"):
        for name, value in (delta.rates_by(family, "model") if delta else {}).items():
            failed[name] = failed.get(name, 0.0) + value
    masked = delta.rates_by("reward_server_masked_items_total", "model") if delta else {}
    return [
        ModelRow(
            model=name,
            items=items.get(name, 0.0),
            items_s=items_s.get(name, 0.0) if delta else None,
            queued=queued.get(name, 0.0),
            failed_s=failed.get(name, 0.0) if delta else None,
            masked_s=masked.get(name, 0.0) if delta else None,
        )
        for name in names
    ]


def _gauge(now: Snapshot, name: str, **labels: str) -> float | None:
    return now.total(SIGNAL + name, **labels)


def _rewards(now: Snapshot, served: list[str]) -> list[RewardRow]:
    pairs = sorted(
        {
            (labels.get("model", ""), labels.get("tenant", ""))
            for labels, _ in now.series(SIGNAL + "window_items")
        }
    )
    rows = []
    for model, tenant in pairs:
        at = {"model": model, "tenant": tenant}
        rows.append(
            RewardRow(
                model=model,
                tenant=tenant,
                window=_gauge(now, "window_items", **at),
                quantiles=tuple(_gauge(now, "score", quantile=q, **at) for q in QUANTILES),
                mean=_gauge(now, "score_mean", **at),
                stddev=_gauge(now, "score_stddev", **at),
                chars_p50=_gauge(now, "response_chars", quantile="0.5", **at),
                length_correlation=_gauge(now, "length_correlation", **at),
                masked_ratio=_gauge(now, "masked_ratio", **at),
                failed_ratio=_gauge(now, "failed_ratio", **at),
            )
        )
    seen = {model for model, _ in pairs}
    order = {name: i for i, name in enumerate(served)}
    rows += [RewardRow.no_data(name) for name in served if name not in seen]
    rows.sort(key=lambda r: (order.get(r.model, len(order)), r.model, r.tenant))
    return rows


def _agreements(now: Snapshot) -> list[Agreement]:
    return sorted(
        (
            Agreement(
                labels.get("model", ""), labels.get("other", ""), labels.get("tenant", ""), value
            )
            for labels, value in now.series(SIGNAL + "component_agreement")
        ),
        key=lambda a: (a.model, a.other, a.tenant),
    )


def build_frame(
    url: str,
    interval_s: float,
    info: dict[str, Any],
    now: Snapshot,
    before: Snapshot | None,
) -> Frame:
    """The figures of scrape ``now``, with rates since scrape ``before`` (None: not yet)."""
    delta = Delta(before, now) if before is not None else None
    served = model_names(info)
    frame = Frame(url=url, interval_s=interval_s, info=info)
    frame.seconds = delta.seconds if delta else None
    ready = now.total("reward_server_ready")
    frame.ready = None if ready is None else ready > 0
    frame.endpoints = _endpoints(now, delta)
    frame.items = _sum_work(now.by("reward_server_items_total", "endpoint"))
    frame.requests = sum(row.requests for row in frame.endpoints)
    frame.in_progress = sum(row.in_progress for row in frame.endpoints)
    frame.queued = now.total("reward_server_queue_items") or 0.0
    if delta is not None:
        frame.items_s = _sum_work(delta.rates_by("reward_server_items_total", "endpoint"))
        frame.requests_s = sum(row.requests_s or 0.0 for row in frame.endpoints)
        frame.errors_s = sum(row.errors_s or 0.0 for row in frame.endpoints)
        if frame.requests_s > 0:
            frame.error_ratio = frame.errors_s / frame.requests_s
    frame.models = _models(now, delta, served)
    frame.tenants = _tenants(now, delta)
    frame.rewards = _rewards(now, served)
    frame.agreements = _agreements(now)
    return frame
