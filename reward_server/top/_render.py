"""A :class:`~reward_server.top._frame.Frame` as rich renderables: a header, the totals,
and tables of endpoints, models, tenants and reward signals."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from reward_server.top._frame import (
    PERCENTILES,
    Agreement,
    Frame,
    RewardRow,
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


#: A table's column: its header, and the cell of a row.
Column = tuple[str, Callable[[Any], str]]

#: How a row's field is shown (the others as they are).
FORMATS: dict[str, Callable[[Any], str]] = {
    "requests_s": _rate,
    "items_s": _rate,
    "errors_s": _rate,
    "failed_s": _rate,
    "masked_s": _rate,
    "queued": _count,
    "items": _count,
    "requests": _count,
    "in_progress": _count,
    "latency": _seconds,
    "wait_p90": _seconds,
}


def _columns(headers: str, fields: str) -> tuple[Column, ...]:
    """Columns from their headers and the row fields they show, each joined by "|"; a
    field ``name.i`` shows item ``i`` of a tuple."""

    def cell(field: str) -> Callable[[Any], str]:
        name, _, index = field.partition(".")
        fmt = FORMATS.get(name, str)
        if index:
            return lambda row: fmt(getattr(row, name)[int(index)])
        return lambda row: fmt(getattr(row, name))

    names, shown = headers.split("|"), fields.split("|")
    return tuple((header, cell(f)) for header, f in zip(names, shown, strict=True))


_PERCENTILES = "|".join(f"p{round(q * 100)}" for q in PERCENTILES)
_LATENCY = "|".join(f"latency.{i}" for i in range(len(PERCENTILES)))
ENDPOINT_COLUMNS = _columns(
    f"endpoint|req/s|items/s|errors/s|{_PERCENTILES}|in flight|requests",
    f"endpoint|requests_s|items_s|errors_s|{_LATENCY}|in_progress|requests",
)
MODEL_COLUMNS = _columns(
    "model|items/s|queued|failed/s|masked/s|items", "model|items_s|queued|failed_s|masked_s|items"
)
TENANT_COLUMNS = _columns(
    "tenant|items/s|req/s|errors/s|queued|wait p90|items",
    "tenant|items_s|requests_s|errors_s|queued|wait_p90|items",
)


def _listing(title: str, columns: Sequence[Column], rows: Iterable[Any]) -> Table:
    """A table of ``rows``, a line each, with ``columns``' cells."""
    table = _table(title, [header for header, _ in columns])
    for row in rows:
        table.add_row(*(cell(row) for _, cell in columns))
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
    side.add_row(
        _listing("Models", MODEL_COLUMNS, frame.models),
        _listing("Tenants", TENANT_COLUMNS, frame.tenants),
    )
    endpoints = _listing(
        "Endpoints (latency over the last interval)", ENDPOINT_COLUMNS, frame.endpoints
    )
    gap = Text("")
    parts += [_totals(frame), gap, endpoints, gap, side, gap]
    parts.append(_rewards(frame.rewards))
    if frame.agreements:
        parts.append(_agreements(frame.agreements))
    return Group(*parts)
