"""Admission, fair hand-off and lifecycle for an engine that batches by itself (a
:class:`~reward_server.scheduling.contract.RowRunner`: vLLM's async engine, for a reward
model or a judge).

The engine batches the rows of all requests continuously; what the server keeps is its
admission limit (``max_queue``: 429 with a Retry-After from the measured rate), cancelling the
rows of a client that hung up, draining on SIGTERM and one metrics record per request.

Tenants: the engine serves what it holds first come, first served, so a tenant that floods it
would make every other wait behind the whole flood. The scheduler therefore hands the engine
at most ``max_in_engine`` rows at a time (enough to keep its batches full): its rows are the
engine's :class:`~reward_server.scheduling.seats.Seats`, and which request gets them next is
the fair queue's order (:class:`~reward_server.scheduling.fair_queue.FairQueue`: a sparse
tenant's request first, else deficit round robin on tokens), as for every other executor.
Admission is the common one too (:class:`~reward_server.scheduling.fairness.Admission`: the
queue limit, each tenant's share of it and its rate limit).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from reward_server.config.tenants import Tenant, current_tenant
from reward_server.errors import NotRunningError
from reward_server.scheduling.contract import (
    BatchLimits,
    BatchObserver,
    BatchStats,
    RowRunner,
    check_count,
)
from reward_server.scheduling.fairness import Admission, TokenBuckets
from reward_server.scheduling.seats import Seats

__all__ = ["DEFAULT_MAX_IN_ENGINE", "DEFAULT_QUANTUM_TOKENS", "AdmissionScheduler"]

#: Rows handed to vLLM at a time. vLLM runs up to ``max_num_seqs`` rows per step (256 by
#: default on most GPUs); twice that keeps the next step's rows waiting inside vLLM, while a
#: request that arrives behind a flood waits for at most these rows, not the whole flood.
DEFAULT_MAX_IN_ENGINE = 512

#: A tenant's turn, in tokens handed to vLLM per unit of its weight.
DEFAULT_QUANTUM_TOKENS = 16384


class AdmissionScheduler:
    """Admission, fair hand-off and lifecycle around an engine's own batching (the Scheduler
    protocol).

    ``queued`` counts rows admitted and not finished, waiting here or in vLLM: vLLM does not
    say when a row starts, so admission bounds everything in flight by ``max_queue`` (and a
    tenant's share of it). The observer gets one record per request (vLLM's own passes are
    not visible here), its queue wait being the time before vLLM got the request.
    """

    def __init__(
        self,
        model: RowRunner,
        limits: BatchLimits,
        *,
        observer: BatchObserver | None = None,
        max_in_engine: int = DEFAULT_MAX_IN_ENGINE,
        quantum_tokens: int = DEFAULT_QUANTUM_TOKENS,
        buckets: TokenBuckets | None = None,
    ) -> None:
        """``model``: the engine that runs the rows; ``limits``: of them only ``max_queue``
        applies (the engine forms its own batches). ``buckets``: the tenants' rate-limit
        buckets, shared by the app's schedulers (None: this scheduler's own)."""
        if max_in_engine < 1:
            raise ValueError("max_in_engine must be positive")
        self._model = model
        self.limits = limits
        self.max_queue = limits.max_queue
        self.max_in_engine = max_in_engine
        self._observer = observer
        self._closing = False
        self._idle: asyncio.Event | None = None
        self._tasks: set[asyncio.Future[tuple[list[Any], int]]] = set()
        self._seats = Seats(max_in_engine, quantum=quantum_tokens, closed="reward engine stopped")
        self._admission = Admission(limits.max_queue, buckets, unit="rows")

    async def start(self) -> None:
        """Bind the engine to the running event loop; idle until the first submit."""
        if self._idle is not None:
            raise RuntimeError("scheduler already started")
        self._model.loop = asyncio.get_running_loop()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def running(self) -> bool:
        """True once started, until stop() begins or vLLM's engine dies."""
        return self._idle is not None and not self._closing and not self._model.errored

    @property
    def queued(self) -> int:
        """Rows admitted and not finished (waiting for their turn or in vLLM)."""
        return self._admission.queued

    def queued_by_tenant(self) -> dict[str, int]:
        """Rows admitted and not finished, by tenant."""
        return self._admission.queued_by_tenant()

    async def stop(self, *, drain: bool = True) -> None:
        """Refuse new work; wait for the rows admitted (drain) or cancel them."""
        self._closing = True
        if not drain:
            self._seats.close()  # the requests waiting for their turn fail
            for task in list(self._tasks):
                task.cancel()
        if self._idle is not None:
            await self._idle.wait()

    async def submit(self, items: Sequence[Sequence[int]]) -> list[Any]:
        """Values of ``items`` (scores, a judge's answers) in order, all or nothing;
        QueueFullError beyond the limit (TenantLimitError beyond the tenant's own)."""
        if not items:
            return []
        tenant = current_tenant.get()
        tokens = sum(len(row) for row in items)
        idle = self._admit(items, tenant, tokens)
        n = len(items)
        enqueued = time.monotonic()
        started: float | None = None
        task: asyncio.Future[tuple[list[Any], int]] | None = None
        error: BaseException | None = None
        cached = 0
        try:
            async with self._seats.seat(tenant, cost=tokens, size=n):
                started = time.monotonic()
                task = asyncio.ensure_future(self._model.run_rows(items))
                self._tasks.add(task)
                values, cached = await task
                return check_count(values, n)
        except BaseException as exc:
            if task is not None:
                task.cancel()
            error = exc
            raise
        finally:
            if task is not None:
                self._tasks.discard(task)
            dropped = started is None and isinstance(error, asyncio.CancelledError)
            if dropped and self._observer is not None:
                self._observer.on_dropped(n)  # never handed to vLLM
            self._admission.release(tenant.name, n)
            if self._admission.queued == 0:
                idle.set()
            if started is not None:
                self._observe(tenant.name, items, tokens, (enqueued, started), error, cached)

    def _admit(self, items: Sequence[Sequence[int]], tenant: Tenant, tokens: int) -> asyncio.Event:
        """Count ``items`` in, or raise: not running, a bad row, the queue is full or the
        tenant is over its share of it or its rate."""
        idle = self._idle
        if idle is None or not self.running:
            state = "stopping" if self._closing else "not running"
            raise NotRunningError(f"reward engine is {state}")
        self._model.check_rows(items)
        self._admission.admit(tenant, len(items), tokens)
        idle.clear()
        return idle

    def _observe(
        self,
        tenant: str,
        rows: Sequence[Sequence[int]],
        tokens: int,
        times: tuple[float, float],
        error: BaseException | None,
        cached: int,
    ) -> None:
        """Learn the rate and report the request as one pass (no padding in vLLM)."""
        n = len(rows)
        enqueued, started = times
        seconds = time.monotonic() - started
        if error is None:
            self._admission.finished(n)
        if self._observer is None or isinstance(error, asyncio.CancelledError):
            return
        self._observer.on_batch(
            BatchStats(
                rows=n,
                real_tokens=tokens,
                padded_tokens=tokens,
                queue_wait_s=(started - enqueued,) * n,
                inference_s=seconds,
                error=error,
                cached_tokens=cached,
                tenants=(tenant,) * n,
            )
        )
