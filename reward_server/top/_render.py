"""A :class:`~reward_server.top._frame.Frame` as rich renderables: a header, the totals,
and tables of endpoints, models, tenants and reward signals."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from reward_server.top._frame import (
    PERCENTILES,
    Agreement,
    EndpointRow,
    Frame,
    ModelRow,
    RewardRow,
    TenantRow,
    model_names,
)

__all__ = ["render"]

#: The alert rules' thresholds (deploy/observability): shown in red past them.
LENGTH_CORRELATION_ALERT = 0.5
AGREEMENT_ALERT = 0.2
NONE = "–"
PENDING = "…"  # a rate before the second scrape


def _rate(value: float | None) -> str:
    if value is None:
        return PENDING
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _seconds(value: float | None) -> str:
    if value is None or math.isnan(value):
        return NONE
    if value < 0.01:
        return f"{value * 1000:.2f} ms"
    if value < 1:
        return f"{value * 1000:.0f} ms"
    return f"{value:.2f} s"


def _count(value: float) -> str:
    return f"{value:,.0f}"


def _score(value: float | None) -> str:
    """Two decimals, so a column of scores lines up; large ones in four figures."""
    if value is None or math.isnan(value):
        return NONE
    return f"{value:.2f}" if abs(value) < 1000 else f"{value:.4g}"


def _share(value: float | None) -> str:
    return NONE if value is None or math.isnan(value) else f"{value * 100:.1f}%"


def _table(title: str, columns: Iterable[str]) -> Table:
    table = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False, expand=False
    )
    table.title_style = "bold"
    for i, column in enumerate(columns):
        table.add_column(column, justify="left" if i == 0 else "right", no_wrap=True)
    return table


def _header(frame: Frame) -> Text:
    names = model_names(frame.info)
    text = Text()
    text.append("reward-server top", style="bold cyan")
    text.append(f"  {frame.url}")
    if names:
        served = names[0] + (f" ({', '.join(names[1:])})" if len(names) > 1 else "")
        text.append(f"  model {served}", style="bold")
    if frame.info.get("version"):
        text.append(f"  v{frame.info['version']}")
    if frame.ready is not None:
        text.append("  ready" if frame.ready else "  NOT READY", "green" if frame.ready else "red")
    text.append(f"   {time.strftime('%H:%M:%S')}, every {frame.interval_s:g} s; q quits", "dim")
    return text


def _totals(frame: Frame) -> Text:
    text = Text()
    parts = [
        ("items/s", _rate(frame.items_s)),
        ("requests/s", _rate(frame.requests_s)),
        ("errors/s", _rate(frame.errors_s)),
        ("error rate", _share(frame.error_ratio) if frame.seconds else PENDING),
        ("in flight", _count(frame.in_progress)),
        ("queued items", _count(frame.queued)),
        ("items total", _count(frame.items)),
        ("requests total", _count(frame.requests)),
    ]
    for label, value in parts:
        style = "bold"
        if label == "error rate" and frame.error_ratio:
            style = "bold red" if frame.error_ratio > 0.05 else "bold yellow"
        text.append(f"{label} ", "dim")
        text.append(value, style)
        text.append("   ")
    return text


def _endpoints(rows: list[EndpointRow]) -> Table:
    latency = [f"p{round(q * 100)}" for q in PERCENTILES]
    table = _table(
        "Endpoints (latency over the last interval)",
        ["endpoint", "req/s", "items/s", "errors/s", *latency, "in flight", "requests"],
    )
    for row in rows:
        table.add_row(
            row.endpoint,
            _rate(row.requests_s),
            _rate(row.items_s),
            _rate(row.errors_s),
            *(_seconds(v) for v in row.latency),
            _count(row.in_progress),
            _count(row.requests),
        )
    return table


def _models(rows: list[ModelRow]) -> Table:
    table = _table("Models", ["model", "items/s", "queued", "failed/s", "masked/s", "items"])
    for row in rows:
        table.add_row(
            row.model,
            _rate(row.items_s),
            _count(row.queued),
            _rate(row.failed_s),
            _rate(row.masked_s),
            _count(row.items),
        )
    return table


def _tenants(rows: list[TenantRow]) -> Table:
    table = _table(
        "Tenants", ["tenant", "items/s", "req/s", "errors/s", "queued", "wait p90", "items"]
    )
    for row in rows:
        table.add_row(
            row.tenant,
            _rate(row.items_s),
            _rate(row.requests_s),
            _rate(row.errors_s),
            _count(row.queued),
            _seconds(row.wait_p90),
            _count(row.items),
        )
    return table


def _correlation(value: float | None) -> Text:
    if value is None or math.isnan(value):
        return Text(NONE)
    return Text(f"{value:+.2f}", "bold red" if value > LENGTH_CORRELATION_ALERT else "")


def _rewards(rows: list[RewardRow]) -> Table:
    columns = ["model", "tenant", "window", "p05", "p25", "p50", "p75", "p95", "mean", "std"]
    table = _table(
        "Reward (scores of each model's last items)",
        [*columns, "chars p50", "len corr", "masked", "failed"],
    )
    for row in rows:
        if row.window is None:
            table.add_row(row.model, row.tenant or NONE, Text("no data", "dim"))
            continue
        quantiles = list(row.quantiles) + [None] * (5 - len(row.quantiles))
        table.add_row(
            row.model,
            row.tenant,
            _count(row.window),
            *(_score(v) for v in quantiles),
            _score(row.mean),
            _score(row.stddev),
            NONE if row.chars_p50 is None else _count(row.chars_p50),
            _correlation(row.length_correlation),
            _share(row.masked_ratio),
            _share(row.failed_ratio),
        )
    return table


def _agreements(rows: list[Agreement]) -> Text:
    text = Text("component agreement (rank correlation): ", "dim")
    for row in rows:
        style = "bold red" if row.value < AGREEMENT_ALERT else "bold"
        text.append(f"{row.model}~{row.other} [{row.tenant}] ")
        text.append(f"{row.value:+.2f}", style)
        text.append("   ")
    return text


def render(frame: Frame) -> RenderableType:
    """The whole view of one refresh."""
    parts: list[RenderableType] = [_header(frame)]
    if frame.problem is not None:
        parts += [Text(""), Text(frame.problem, "bold red")]
        return Group(*parts)
    side = Table.grid(padding=(0, 4))
    side.add_row(_models(frame.models), _tenants(frame.tenants))
    gap = Text("")
    parts += [_totals(frame), gap, _endpoints(frame.endpoints), gap, side, gap]
    parts.append(_rewards(frame.rewards))
    if frame.agreements:
        parts.append(_agreements(frame.agreements))
    return Group(*parts)
