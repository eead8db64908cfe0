"""Admission, fair hand-off and lifecycle for an engine that batches by itself (a
:class:`~reward_server.scheduling.contract.RowRunner`: vLLM's async engine, for a reward
model or a judge).

The engine batches the rows of all requests continuously; what the server keeps is its
admission limit (``max_queue``: 429 with a Retry-After from the measured rate), cancelling the
rows of a client that hung up, draining on SIGTERM and one metrics record per request.

Tenants: the engine serves what it holds first come, first served, so a tenant that floods it
would make every other wait behind the whole flood. The scheduler therefore hands the engine
at most ``max_in_engine`` rows at a time (enough to keep its batches full) and keeps the rest
in one queue per tenant; which request goes next follows deficit round robin on tokens
across the tenants with work (:class:`~reward_server.scheduling.fairness.DeficitRoundRobin`),
as the micro-batcher's windows do. Admission is per tenant too: its share of ``max_queue``
and its rate limit (:class:`~reward_server.scheduling.fairness.TenantAdmission`).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reward_server.config.tenants import Tenant, current_tenant
from reward_server.errors import NotRunningError, QueueFullError
from reward_server.scheduling.contract import (
    BatchLimits,
    BatchObserver,
    BatchStats,
    RowRunner,
    check_count,
)
from reward_server.scheduling.fairness import DeficitRoundRobin, TenantAdmission, TokenBuckets

__all__ = ["DEFAULT_MAX_IN_ENGINE", "DEFAULT_QUANTUM_TOKENS", "AdmissionScheduler"]

#: Rows handed to vLLM at a time. vLLM runs up to ``max_num_seqs`` rows per step (256 by
#: default on most GPUs); twice that keeps the next step's rows waiting inside vLLM, while a
#: request that arrives behind a flood waits for at most these rows, not the whole flood.
DEFAULT_MAX_IN_ENGINE = 512

#: A tenant's turn, in tokens handed to vLLM per unit of its weight.
DEFAULT_QUANTUM_TOKENS = 16384

#: Bounds of the Retry-After estimate, seconds (as the micro-batcher's).
_MIN_RETRY_AFTER = 0.1
_MAX_RETRY_AFTER = 30.0


@dataclass(eq=False, slots=True)
class _Pending:
    """One request waiting for its turn to be handed to vLLM."""

    rows: Sequence[Sequence[int]]
    tokens: int
    tenant: str
    enqueued: float
    go: asyncio.Future[None]  # set when handed to vLLM; cancelled when the caller left
    started: float | None = None


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
        self._in_flight = 0  # rows admitted and not finished (here or in vLLM)
        self._in_engine = 0  # rows handed to vLLM and not finished
        self._closing = False
        self._idle: asyncio.Event | None = None
        self._tasks: set[asyncio.Future[tuple[list[Any], int]]] = set()
        self._rate: float | None = None  # rows per second, moving average
        self._pending: dict[str, deque[_Pending]] = {}  # by tenant name, oldest first
        self._weights: dict[str, float] = {}
        self._drr = DeficitRoundRobin(quantum_tokens)
        self._admission = TenantAdmission(limits.max_queue, buckets)

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
        return self._in_flight

    def queued_by_tenant(self) -> dict[str, int]:
        """Rows admitted and not finished, by tenant."""
        return self._admission.queued_by_tenant()

    async def stop(self, *, drain: bool = True) -> None:
        """Refuse new work; wait for the rows admitted (drain) or cancel them."""
        self._closing = True
        if not drain:
            for queue in self._pending.values():
                for entry in queue:
                    if not entry.go.done():
                        entry.go.set_exception(NotRunningError("reward engine stopped"))
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
        entry = _Pending(
            items, tokens, tenant.name, time.monotonic(), asyncio.get_running_loop().create_future()
        )
        self._pending.setdefault(tenant.name, deque()).append(entry)
        self._weights[tenant.name] = tenant.weight
        self._drr.wake(tenant.name)
        self._dispatch()
        task: asyncio.Future[tuple[list[Any], int]] | None = None
        error: BaseException | None = None
        cached = 0
        try:
            await entry.go
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
            if entry.started is None:
                entry.go.cancel()  # never handed to vLLM: its turn is skipped
                if self._observer is not None and isinstance(error, asyncio.CancelledError):
                    self._observer.on_dropped(n)
            else:
                self._in_engine -= n
            self._in_flight -= n
            self._admission.release(tenant.name, n)
            if self._in_flight == 0:
                idle.set()
            self._dispatch()
            self._observe(entry, error, cached)

    def _admit(self, items: Sequence[Sequence[int]], tenant: Tenant, tokens: int) -> asyncio.Event:
        """Count ``items`` in, or raise: not running, a bad row, the queue is full or the
        tenant is over its share of it or its rate."""
        idle = self._idle
        if idle is None or not self.running:
            state = "stopping" if self._closing else "not running"
            raise NotRunningError(f"reward engine is {state}")
        self._model.check_rows(items)
        excess = self._in_flight + len(items) - self.max_queue
        if excess > 0:
            raise QueueFullError(self._retry_after(excess))
        others = sum(
            self._weights.get(name, 1.0)
            for name in self._admission.with_work()
            if name != tenant.name
        )
        self._admission.admit(
            tenant,
            len(items),
            tokens,
            rate=self._rate,
            share_of_rate=tenant.weight / (tenant.weight + others),
        )
        self._in_flight += len(items)
        idle.clear()
        return idle

    def _head(self, name: str) -> int | None:
        """Tokens of tenant ``name``'s next waiting request (dropping abandoned ones)."""
        queue = self._pending.get(name)
        while queue:
            if not queue[0].go.done():
                return queue[0].tokens
            queue.popleft()
        return None

    def _weight(self, name: str) -> float:
        return self._weights.get(name, 1.0)

    def _dispatch(self) -> None:
        """Hand waiting requests to vLLM, in fair order, while it holds fewer than
        ``max_in_engine`` rows (a request goes whole, so it may pass the mark)."""
        while self._in_engine < self.max_in_engine:
            name = self._drr.current
            if name is None:
                name = self._drr.begin(self._head, self._weight)
                if name is None:
                    return
            head = self._head(name)
            if head is None or not self._drr.charge(name, head):
                self._drr.end(name, head is not None)
                continue
            entry = self._pending[name].popleft()
            entry.started = time.monotonic()
            self._in_engine += len(entry.rows)
            entry.go.set_result(None)

    def _retry_after(self, excess: int) -> float:
        """Seconds until about ``excess`` rows should have been scored."""
        if not self._rate:
            return 1.0
        return min(_MAX_RETRY_AFTER, max(_MIN_RETRY_AFTER, excess / self._rate))

    def _observe(self, entry: _Pending, error: BaseException | None, cached: int) -> None:
        """Learn the rate and report the request as one pass (no padding in vLLM)."""
        if entry.started is None:
            return  # never reached vLLM (cancelled or stopped while waiting)
        n = len(entry.rows)
        seconds = time.monotonic() - entry.started
        if error is None and seconds > 0:
            rate = n / seconds
            self._rate = rate if self._rate is None else 0.8 * self._rate + 0.2 * rate
        if self._observer is None or isinstance(error, asyncio.CancelledError):
            return
        self._observer.on_batch(
            BatchStats(
                rows=n,
                real_tokens=entry.tokens,
                padded_tokens=entry.tokens,
                queue_wait_s=(entry.started - entry.enqueued,) * n,
                inference_s=seconds,
                error=error,
                cached_tokens=cached,
                tenants=(entry.tenant,) * n,
            )
        )
