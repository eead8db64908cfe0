"""The scheduling contract: what a scheduler offers the scoring core, what an engine offers a
scheduler, and the plain values that cross between them (no asyncio work, no torch, no HTTP).

* The scoring core hands token-id rows to a :class:`Scheduler` (``submit``) and gets one value
  per row back, in order: the scheduler checks the count (:func:`check_count`), so nothing
  above it checks again.
* An engine only runs rows. A blocking engine is a function ``run_batch(rows) -> values`` that
  the micro-batcher calls on the compute thread; an engine that batches by itself (vLLM's
  continuous batching) is a :class:`RowRunner` whose ``run_rows`` takes every request's rows as
  they come.
* :class:`BatchLimits` are the settings every scheduler works under; each pass (or, for a
  :class:`RowRunner`, each request) is reported to a :class:`BatchObserver` as
  :class:`BatchStats`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "BatchLimits",
    "BatchObserver",
    "BatchRunner",
    "BatchStats",
    "RowRunner",
    "Scheduler",
    "check_count",
]

#: A blocking engine's pass: one value per row of token ids, in order (run on the compute
#: thread by the micro-batcher).
BatchRunner = Callable[[list[Sequence[int]]], Sequence[Any]]


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """The limits a scheduler works under (from the server's settings)."""

    max_batch_tokens: int  # padded tokens of one pass: longest row x rows
    max_batch_size: int  # rows of one pass
    max_wait_ms: float  # longest wait for company before a partial pass
    max_queue: int  # items admitted and not yet started; beyond it QueueFullError


@dataclass(frozen=True, slots=True)
class BatchStats:
    """What one micro-batch did, for metrics: sizes, waits, time and outcome."""

    rows: int
    real_tokens: int
    padded_tokens: int
    queue_wait_s: tuple[float, ...]  # per row: time from submit to the pass starting
    inference_s: float
    error: BaseException | None  # None when the pass succeeded
    cached_tokens: int = 0  # prompt tokens an engine's prefix cache served (vLLM)
    # per row, as queue_wait_s: the tenant it came from (empty: not known)
    tenants: tuple[str, ...] = ()


class BatchObserver(Protocol):
    """Receives one call per micro-batch, for metrics."""

    def on_batch(self, stats: BatchStats) -> None:
        """Called after each micro-batch, successful or not."""
        ...

    def on_dropped(self, rows: int) -> None:
        """Called when a request ends (its client gone, its deadline passed, another model
        failed) with ``rows`` of its rows not started: they never reach the model."""
        ...


class Scheduler(Protocol):
    """Takes the token-id rows of every request and returns their values, one per row, in
    order: admission (the queue limit, QueueFullError; a tenant's, TenantLimitError),
    batching and the passes."""

    @property
    def running(self) -> bool:
        """True once started and until stop() begins."""
        ...

    @property
    def queued(self) -> int:
        """Items admitted and not yet started."""
        ...

    def queued_by_tenant(self) -> dict[str, int]:
        """The same, by tenant (tenants with none are left out)."""
        ...

    async def start(self) -> None:
        """Start taking work (on the running event loop)."""
        ...

    async def stop(self, *, drain: bool = True) -> None:
        """Refuse new work; finish (drain) or fail what is queued."""
        ...

    async def submit(self, items: Sequence[Sequence[int]]) -> list[Any]:
        """One value per item, in order, all or nothing (cancelling drops the unstarted
        ones)."""
        ...


@runtime_checkable
class RowRunner(Protocol):
    """An engine that batches by itself (vLLM): it runs the rows of each request as they
    come, and the scheduler keeps admission, fairness and shutdown."""

    #: The event loop the engine's results arrive on (the scheduler sets it at start).
    loop: asyncio.AbstractEventLoop | None

    @property
    def errored(self) -> bool:
        """True once the engine has died (every later request would fail)."""
        ...

    def check_rows(self, rows: Sequence[Sequence[int]]) -> None:
        """ValueError for a row the engine must not see."""
        ...

    async def run_rows(self, rows: Sequence[Sequence[int]]) -> tuple[list[Any], int]:
        """Every row's value, in order (all or nothing), and the prompt tokens the engine's
        prefix cache served."""
        ...


def check_count(values: object, rows: int) -> list[Any]:
    """``values`` as a list when it holds one value per row; else RuntimeError (an engine
    bug, answered as 500): the one check that a scheduler's answers fit its rows."""
    if not isinstance(values, Sequence) or len(values) != rows:
        got = len(values) if isinstance(values, Sequence) else type(values).__name__
        raise RuntimeError(f"scorer returned {got} results for {rows} inputs")
    return list(values)
