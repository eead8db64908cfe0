"""Admission and lifecycle around vLLM's own scheduler, for any model the vLLM engine serves
(:class:`~reward_server.engines.vllm.VllmEngine`: a reward model, a judge).

vLLM batches the rows of all requests continuously; what the server keeps is its admission
limit (``max_queue``: 429 with a Retry-After from the measured rate), cancelling the rows of
a client that hung up, draining on SIGTERM and one metrics record per request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any, Protocol

from reward_server.engines import BatchObserver, BatchStats
from reward_server.errors import BatcherClosedError, QueueFullError

__all__ = ["RowRunner", "VllmScheduler"]

#: Bounds of the Retry-After estimate, seconds (as the micro-batcher's).
_MIN_RETRY_AFTER = 0.1
_MAX_RETRY_AFTER = 30.0


class RowRunner(Protocol):
    """What the scheduler needs of a vLLM-served model."""

    loop: asyncio.AbstractEventLoop | None

    @property
    def errored(self) -> bool:
        """True once vLLM's engine core has died."""
        ...

    def check_rows(self, rows: Sequence[Sequence[int]]) -> None:
        """ValueError for a row vLLM must not see."""
        ...

    async def run_rows(self, rows: Sequence[Sequence[int]]) -> tuple[list[Any], int]:
        """Every row's value, in order (all or nothing), and the prompt tokens vLLM's
        prefix cache served."""
        ...


class VllmScheduler:
    """Admission and lifecycle around vLLM's own scheduler (the Scheduler protocol).

    ``queued`` counts rows submitted to vLLM and not finished: vLLM does not say when a row
    starts, so admission bounds everything in flight by ``max_queue``. The observer gets one
    record per request (vLLM's own passes are not visible here).
    """

    def __init__(self, model: RowRunner, *, max_queue: int, observer: BatchObserver | None) -> None:
        self._model = model
        self.max_queue = max_queue
        self._observer = observer
        self._in_flight = 0
        self._closing = False
        self._idle: asyncio.Event | None = None
        self._tasks: set[asyncio.Future[tuple[list[Any], int]]] = set()
        self._rate: float | None = None  # rows per second, moving average

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
        """Rows submitted to vLLM and not finished."""
        return self._in_flight

    async def stop(self, *, drain: bool = True) -> None:
        """Refuse new work; wait for the rows in vLLM (drain) or cancel them."""
        self._closing = True
        if not drain:
            for task in list(self._tasks):
                task.cancel()
        if self._idle is not None:
            await self._idle.wait()

    async def submit(self, items: Sequence[Sequence[int]]) -> list[Any]:
        """Values of ``items`` (scores, a judge's answers) in order, all or nothing;
        QueueFullError beyond the limit."""
        if not items:
            return []
        idle = self._admit(items)
        n = len(items)
        started = time.monotonic()
        task = asyncio.ensure_future(self._model.run_rows(items))
        self._tasks.add(task)
        error: BaseException | None = None
        cached = 0
        try:
            values, cached = await task
            return values
        except BaseException as exc:
            task.cancel()
            error = exc
            raise
        finally:
            self._tasks.discard(task)
            self._in_flight -= n
            if self._in_flight == 0:
                idle.set()
            self._observe(items, time.monotonic() - started, error, cached)

    def _admit(self, items: Sequence[Sequence[int]]) -> asyncio.Event:
        """Count ``items`` in, or raise: not running, a bad row, or the queue is full."""
        idle = self._idle
        if idle is None or not self.running:
            state = "stopping" if self._closing else "not running"
            raise BatcherClosedError(f"reward engine is {state}")
        self._model.check_rows(items)
        excess = self._in_flight + len(items) - self.max_queue
        if excess > 0:
            raise QueueFullError(self._retry_after(excess))
        self._in_flight += len(items)
        idle.clear()
        return idle

    def _retry_after(self, excess: int) -> float:
        """Seconds until about ``excess`` rows should have been scored."""
        if not self._rate:
            return 1.0
        return min(_MAX_RETRY_AFTER, max(_MIN_RETRY_AFTER, excess / self._rate))

    def _observe(
        self,
        items: Sequence[Sequence[int]],
        seconds: float,
        error: BaseException | None,
        cached: int,
    ) -> None:
        """Learn the rate and report the request as one pass (no padding in vLLM)."""
        if error is None and seconds > 0:
            rate = len(items) / seconds
            self._rate = rate if self._rate is None else 0.8 * self._rate + 0.2 * rate
        if self._observer is None or isinstance(error, asyncio.CancelledError):
            return
        tokens = sum(len(row) for row in items)
        self._observer.on_batch(
            BatchStats(
                rows=len(items),
                real_tokens=tokens,
                padded_tokens=tokens,
                queue_wait_s=(),
                inference_s=seconds,
                error=error,
                cached_tokens=cached,
            )
        )
