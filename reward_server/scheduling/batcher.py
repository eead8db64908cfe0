"""Dynamic micro-batching of token-id rows across concurrent requests (asyncio, no torch).

One admission counter, one queue, one consumer task. The consumer blocks for the first item,
collects more until a micro-batch is full (``max_batch_size`` rows or the padded-token budget
``max_len * rows <= max_batch_tokens``) or ``max_wait_ms`` has passed since the oldest item
arrived, then also takes whatever else is already waiting (up to a window of a few batches),
sorts the window by length and cuts it into micro-batches, and runs them one at a time on
one worker thread (the registry's compute thread). Results go back by index; a failing micro-batch fails only the
requests that had an item in it.

Where to cut a sorted window is a trade-off the device decides: every forward pass has a
fixed cost (weights read, kernel launches, framework overhead) and a cost per padded token.
The batcher fits ``seconds = overhead + per_token * padded_tokens`` to the passes it has run
(a robust Theil-Sen fit) and cuts each window where that cost is lowest: on a GPU the
overhead is worth thousands of tokens and windows stay whole up to the limits; on a CPU it
is worth a few dozen tokens, so long and short texts go to separate passes instead of
padding the short ones.

When requests arrive further apart than ``max_wait_ms`` (one client waiting for its own
answers), waiting for company is pure latency, so the first item goes out at once.

Tenants: items wait in one queue per tenant (:data:`current_tenant` at submit).
While one tenant alone has work, windows form as above from its queue. When several have
work, each window is one tenant's turn of deficit round robin on tokens
(:class:`~reward_server.scheduling.fairness.DeficitRoundRobin`: ``max_batch_tokens * weight``
tokens a turn), so backlogged tenants share the passes in proportion to their weights and
a tenant that floods the server gets only what the others leave. A window may stop at a
pass boundary and put its unstarted items back at the front of their queue
(:meth:`~reward_server.scheduling.tenant_queues.TenantQueues.gives_way`): one formed while
its tenant was alone, once it has run a turn's tokens and another tenant waits; and any
window, for a *sparse* tenant (a request of at most a turn that arrived to an empty queue,
from a tenant served less than the running one lately), which so waits for the running
pass only. While tenants share the server, passes are kept to ten times a pass's fixed
cost in tokens (:func:`shared_pass_tokens`: on a CPU a few hundred tokens, on a GPU the
usual limit) and run oldest first. The queues and the turns live in
:class:`~reward_server.scheduling.tenant_queues.TenantQueues`. Admission is per
tenant too: a tenant over its queue share or its rate limit gets
:class:`~reward_server.errors.TenantLimitError` (429) while the others are admitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from reward_server.config.tenants import current_tenant
from reward_server.errors import NotRunningError
from reward_server.scheduling.contract import (
    BatchLimits,
    BatchObserver,
    BatchRunner,
    BatchStats,
    check_count,
)
from reward_server.scheduling.fairness import RECENT_S, Admission, TokenBuckets
from reward_server.scheduling.tenant_queues import Item, Request, TenantQueues, Window

logger = logging.getLogger(__name__)

__all__ = [
    "Batcher",
    "fill_sizes",
    "fit_pass_cost",
    "partition",
    "shared_pass_tokens",
    "split_overhead_tokens",
]

#: Sharing (see shared_pass_tokens): passes are kept to this many times a pass's fixed
#: cost in tokens while another tenant has submitted within RECENT_S.
SHARED_PASS_OVERHEADS = 10.0


def shared_pass_tokens(overhead_tokens: float | None, max_batch_tokens: int) -> int:
    """The padded-token limit of passes while tenants share the server (another tenant than
    the window's has submitted within ``RECENT_S``).

    A light tenant's request waits for the pass that is running when it arrives (it goes
    first at the next pass boundary: TenantQueues.gives_way), so shared passes are kept to
    ``SHARED_PASS_OVERHEADS`` times the fixed cost of a pass (``overhead_tokens``: the cost
    model's, in padded tokens; None while it is not known): that fixed cost is then about a
    tenth of a pass. Where a pass's overhead is worth thousands of tokens (a GPU) the limit
    stays ``max_batch_tokens``; a tenant alone on the server is never limited.
    """
    if overhead_tokens is None:
        return max_batch_tokens
    return min(max_batch_tokens, math.ceil(SHARED_PASS_OVERHEADS * overhead_tokens))


#: Recent inter-arrival gaps kept to tell sparse arrivals (don't wait) from bursts (do).
_GAPS_KEPT = 32
_MIN_GAPS = 8


class _CostModel:
    """Online robust fit of a forward pass's time: ``overhead + per_token * padded_tokens``.

    Theil-Sen: the slope is the median of the slopes between every pair of recent passes,
    the intercept the median residual, so a few passes slowed down by a busy machine do not
    move it. ``overhead_tokens`` (intercept / slope) is the padding worth one extra pass.
    """

    def __init__(
        self,
        keep: int = 64,
        min_samples: int = 16,
        refit_every: int = 8,
        fixed: float | None = None,
    ) -> None:
        self._samples: deque[tuple[int, float]] = deque(maxlen=keep)
        self._min_samples = min_samples
        self._refit_every = refit_every
        self._since_fit = 0
        self._fixed = fixed
        # None: not known (yet); windows are then only cut at the limits.
        self.overhead_tokens: float | None = fixed

    def add(self, padded_tokens: int, seconds: float) -> None:
        """Record one successful pass; refit now and then (unless the overhead is fixed)."""
        if self._fixed is not None:
            return
        self._samples.append((padded_tokens, seconds))
        self._since_fit += 1
        if len(self._samples) >= self._min_samples and self._since_fit >= self._refit_every:
            self._since_fit = 0
            self.overhead_tokens = self._fit()
            logger.debug(
                "cost model: one pass costs as much as %s padded tokens",
                "?" if self.overhead_tokens is None else f"{self.overhead_tokens:.0f}",
            )

    def _fit(self) -> float | None:
        fit = fit_pass_cost(list(self._samples), min_pairs=self._min_samples)
        return None if fit is None else split_overhead_tokens(*fit)


#: Never split for less padding than this: guards against an over-eager noisy fit.
MIN_OVERHEAD_TOKENS = 8.0


def split_overhead_tokens(overhead_s: float, per_token_s: float) -> float:
    """The padding one extra pass is worth, as the batcher uses it (at least the minimum)."""
    return max(MIN_OVERHEAD_TOKENS, overhead_s / per_token_s)


def fit_pass_cost(
    points: Sequence[tuple[int, float]], min_pairs: int = 16
) -> tuple[float, float] | None:
    """Theil-Sen fit of ``seconds = overhead + per_token * padded_tokens`` over passes.

    Returns ``(overhead_s, per_token_s)``, or None when the passes are too alike to tell
    (fewer than ``min_pairs`` pairs of different sizes) or the slope is not positive.
    """
    slopes = [
        (t2 - t1) / (p2 - p1)
        for i, (p1, t1) in enumerate(points)
        for p2, t2 in points[i + 1 :]
        if p2 != p1
    ]
    if len(slopes) < min_pairs:
        return None
    slope = statistics.median(slopes)
    if slope <= 0:
        return None
    return statistics.median(t - slope * p for p, t in points), slope


def partition(
    lengths: Sequence[int], overhead_tokens: float, max_rows: int, max_tokens: int
) -> list[int]:
    """Sizes of the consecutive groups of ascending ``lengths`` with the least total cost.

    Cost of a group: ``overhead_tokens + rows * width`` (width = its last, longest length),
    within ``rows <= max_rows`` and ``rows * width <= max_tokens`` (a lone item may exceed
    the latter). Dynamic programming over the end of the last group, O(n * max_rows).
    """
    n = len(lengths)
    best = [0.0] + [math.inf] * n
    start = [0] * (n + 1)
    for j in range(1, n + 1):
        width = lengths[j - 1]
        for i in range(j - 1, max(0, j - max_rows) - 1, -1):
            rows = j - i
            if rows > 1 and rows * width > max_tokens:
                break
            cost = best[i] + overhead_tokens + rows * width
            if cost <= best[j]:  # ties: the larger group
                best[j] = cost
                start[j] = i
    sizes: list[int] = []
    j = n
    while j > 0:
        sizes.append(j - start[j])
        j = start[j]
    return sizes[::-1]


def fill_sizes(lengths: Sequence[int], max_rows: int, max_tokens: int) -> list[int]:
    """Sizes of the groups of ascending ``lengths`` filled in order up to the limits
    (``rows <= max_rows``, ``rows * width <= max_tokens``; a lone item may exceed the latter)."""
    sizes: list[int] = []
    rows = 0
    for length in lengths:
        # Ascending, so this item sets the padded width of the group it joins.
        if rows and (rows >= max_rows or length * (rows + 1) > max_tokens):
            sizes.append(rows)
            rows = 0
        rows += 1
    return [*sizes, rows] if rows else sizes


class Batcher:
    """Form micro-batches from concurrent submits and run them one at a time off the loop."""

    def __init__(
        self,
        run_batch: BatchRunner,
        limits: BatchLimits,
        *,
        observer: BatchObserver | None = None,
        sort_window: int = 4,
        split_overhead_tokens: float | None = None,
        executor: Executor | None = None,
        convert: Callable[[Any], Any] = float,
        buckets: TokenBuckets | None = None,
    ) -> None:
        """``run_batch``: the engine's pass over rows of token ids; ``limits``: the batch and
        queue limits. ``convert``: checks and converts each row's result (a float by default; a
        list of every label's logit for a scorer's ``logits_batch``). ``split_overhead_tokens``:
        what one extra forward pass costs, in padded tokens; None learns it from the passes
        run (the usual choice). ``executor``: where ``run_batch`` runs (one worker: the
        registry's compute thread, which the caller shuts down); None starts a private thread,
        shut down by :meth:`stop`. ``buckets``: the tenants' rate-limit buckets, shared by
        the app's schedulers (None: this batcher's own)."""
        max_batch_tokens, max_batch_size = limits.max_batch_tokens, limits.max_batch_size
        max_wait_ms, max_queue = limits.max_wait_ms, limits.max_queue
        if max_batch_tokens < 1 or max_batch_size < 1 or max_queue < 1:
            raise ValueError("max_batch_tokens, max_batch_size and max_queue must be positive")
        if max_wait_ms < 0 or sort_window < 1:
            raise ValueError("max_wait_ms must be >= 0 and sort_window >= 1")
        if split_overhead_tokens is not None and split_overhead_tokens < 0:
            raise ValueError("split_overhead_tokens must be >= 0")
        self._run_batch = run_batch
        self._convert = convert
        self.limits = limits
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self.max_queue = max_queue
        self.sort_window = sort_window
        self._observer = observer
        # A turn is worth one micro-batch's token budget per unit of weight.
        self._tenants = TenantQueues(quantum=max_batch_tokens)
        # Admitted items of live requests whose micro-batch has not started; the rate
        # (items per second of inference) gives the Retry-After of a refusal.
        self._admission = Admission(max_queue, buckets)
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._abort = False  # stop(drain=False): fail instead of run what has not started
        self._started = False
        self._cost = _CostModel(fixed=split_overhead_tokens)
        self._gaps: deque[float] = deque(maxlen=_GAPS_KEPT)  # seconds between submits
        self._last_submit: float | None = None
        # One dedicated thread runs every forward pass: its math library's thread team and
        # caches stay warm, and passes never overlap.
        self._executor: Executor | None = executor
        self._owns_executor = executor is None

    # ------------------------------------------------------------------ lifecycle

    @property
    def running(self) -> bool:
        """True once started and until stop() begins (or the consumer dies)."""
        return (
            self._started and not self._closing and self._task is not None and not self._task.done()
        )

    @property
    def queued(self) -> int:
        """Items admitted and waiting for their micro-batch to start."""
        return self._admission.queued

    async def start(self) -> None:
        """Start the consumer task on the running event loop."""
        if self._started:
            raise RuntimeError("batcher already started")
        self._started = True
        self._wakeup = asyncio.Event()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="reward-batch")
        self._task = asyncio.create_task(self._consume(), name="reward-batcher")
        self._task.add_done_callback(self._on_consumer_done)

    async def stop(self, *, drain: bool = True) -> None:
        """Refuse new submits; finish queued work (drain) or fail it; end the consumer."""
        self._closing = True
        if not drain:
            self._abort = True
            self._fail_queued(NotRunningError("reward batcher stopped"))
        if self._wakeup is not None:
            self._wakeup.set()
        task = self._task
        if task is not None and not task.done():
            await asyncio.shield(task)
        if self._executor is not None and self._owns_executor:
            self._executor.shutdown(wait=False)

    def _on_consumer_done(self, task: asyncio.Task[None]) -> None:
        """If the consumer ever dies, fail whatever is still queued instead of hanging."""
        if not task.cancelled() and task.exception() is not None:
            logger.error("batcher consumer died", exc_info=task.exception())
        self._fail_queued(NotRunningError("reward batcher is not running"))

    def _fail_queued(self, exc: BaseException) -> None:
        """Fail every request that still has items in the queue."""
        for item in self._tenants.drain():
            self._finish_request(item.request, exc)

    def queued_by_tenant(self) -> dict[str, int]:
        """Items admitted and waiting for their micro-batch to start, by tenant."""
        return self._admission.queued_by_tenant()

    # ------------------------------------------------------------------ submit

    async def submit(self, items: Sequence[Sequence[int]]) -> list[Any]:
        """Queue rows all-or-nothing and wait for their scores, in input order."""
        if not self.running or self._wakeup is None:
            raise NotRunningError(
                "reward batcher is stopping" if self._closing else "reward batcher is not running"
            )
        n = len(items)
        if n == 0:
            return []
        if any(
            len(row) == 0 for row in items
        ):  # an empty row would fail its whole micro-batch, neighbours too
            raise ValueError("cannot score an empty row (zero tokens)")
        tenant = current_tenant.get()
        self._admission.admit(tenant, n, sum(len(row) for row in items))
        now = time.monotonic()
        if self._last_submit is not None:
            self._gaps.append(now - self._last_submit)
        self._last_submit = now
        request = self._tenants.add(tenant, items, now)
        self._wakeup.set()
        try:
            return await request.future
        except asyncio.CancelledError:
            dropped = request.unstarted
            self._finish_request(request, None)
            if dropped and self._observer is not None:
                self._observer.on_dropped(dropped)
            raise

    def _finish_request(self, request: Request, exc: BaseException | None) -> None:
        """End a request early (failure or cancellation): release its unstarted items."""
        self._admission.release(request.tenant, request.unstarted)
        request.unstarted = 0
        if not request.future.done():
            if exc is None:
                request.future.cancel()
            else:
                request.future.set_exception(exc)

    # ------------------------------------------------------------------ consumer

    async def _consume(self) -> None:
        """Collect windows of items and run their micro-batches until stopped."""
        assert self._wakeup is not None
        while True:
            window = await self._collect()
            if window is None:
                return
            tenants = self._tenants
            shared = tenants.others_recent(window.tenant, time.monotonic() - RECENT_S)
            limit = self.max_batch_tokens
            if shared:
                limit = shared_pass_tokens(self._cost.overhead_tokens, limit)
            batches = self._split(window.items, limit)
            if shared:
                # Oldest work first: a window cut short puts its later passes back, and
                # they must not be the same long rows each time while newer short ones go
                # ahead (alone, a window runs whole, shortest rows first).
                batches.sort(key=lambda batch: min(it.seq for it in batch))
            # Before each pass, while another tenant waits, the window may give way to it
            # (TenantQueues.gives_way); the rest goes back to the front of its queue.
            for i, batch in enumerate(batches):
                if tenants.others_have_work(window.tenant):
                    rest = [it for b in batches[i:] for it in b]
                    if tenants.gives_way(window, rest):
                        tenants.give_way(window, rest)
                        break
                try:
                    await self._run(batch)
                except Exception:  # a bug here must not kill the consumer
                    logger.exception("unexpected error while running a micro-batch")
            self._tenants.end_turn(window.tenant)

    async def _collect(self) -> Window | None:
        """Block for work, then gather a window: one tenant's fair turn when several have
        work, else the batching rules below on the one tenant's queue."""
        assert self._wakeup is not None
        while True:
            if self._abort:
                return None
            busy = self._tenants.with_work()
            if len(busy) > 1:
                return self._tenants.turn(self.max_batch_size * self.sort_window)
            if busy:
                break
            if self._closing:
                return None
            self._wakeup.clear()
            await self._wakeup.wait()
        name = busy[0]
        self._tenants.serve(name)
        first = self._tenants.pop_live(name)
        assert first is not None
        window = [first]
        max_len = first.length
        deadline = first.enqueued + self.max_wait_s

        def batch_full() -> bool:
            # One full micro-batch is ready: more waiting would not make it bigger.
            rows = len(window)
            return rows >= self.max_batch_size or max_len * (rows + 1) > self.max_batch_tokens

        # Phase 1: wait (up to the oldest item's deadline) until one micro-batch is full;
        # not at all when requests arrive further apart than the wait (nobody would come).
        sparse = self._arrivals_sparse()
        while not batch_full():
            item = self._tenants.pop_live(name)
            if item is not None:
                window.append(item)
                max_len = max(max_len, item.length)
                continue
            timeout = deadline - time.monotonic()
            if timeout <= 0 or self._closing or sparse or self._tenants.others_have_work(name):
                break
            self._wakeup.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout)
        # Phase 2: take what is already waiting, up to the sort window, without waiting.
        sort = self.sort_window
        self._tenants.take(name, window, self.max_batch_size * sort, self.max_batch_tokens * sort)
        return Window(window, name, contended=False)

    def _arrivals_sparse(self) -> bool:
        """True when the typical gap between submits is longer than ``max_wait_ms``."""
        if len(self._gaps) < _MIN_GAPS:
            return False
        return statistics.median(self._gaps) > self.max_wait_s

    def _split(self, window: list[Item], limit: int) -> list[list[Item]]:
        """Sort by length and cut into micro-batches under the row limit and ``limit``
        padded tokens.

        Once the cost model knows the device, cuts go where they cost least (see
        :func:`partition`); until then each micro-batch is filled up to the limits.
        """
        window.sort(key=lambda it: it.length)
        lengths = [it.length for it in window]
        overhead = self._cost.overhead_tokens
        if overhead is not None and len(window) > 1:
            sizes = partition(lengths, overhead, self.max_batch_size, limit)
        else:
            sizes = fill_sizes(lengths, self.max_batch_size, limit)
        starts = list(itertools.accumulate(sizes, initial=0))
        return [window[a:b] for a, b in itertools.pairwise(starts)]

    async def _run(self, batch: list[Item]) -> None:
        """Run one micro-batch in the worker thread and deliver its results or its error."""
        live = [it for it in batch if not it.request.future.done()]
        if not live:
            return
        if self._abort:
            self._fail(live, NotRunningError("reward batcher stopped"))
            return
        started = time.monotonic()
        for it in live:
            it.request.unstarted -= 1
            self._admission.release(it.request.tenant, 1)
        self._tenants.note_served(live[0].request.tenant, sum(it.length for it in live), started)
        width = max(it.length for it in live)
        error: BaseException | None = None
        try:
            scores = await self._score([it.ids for it in live])
        except Exception as exc:
            error = exc
        inference_s = time.monotonic() - started
        if error is None:
            self._learn(len(live), width * len(live), inference_s)
            for it, value in zip(live, scores, strict=True):
                it.deliver(value)
        else:
            logger.error("micro-batch of %d rows failed: %s", len(live), error)
            self._fail(live, error)
        self._observe(
            BatchStats(
                rows=len(live),
                real_tokens=sum(it.length for it in live),
                padded_tokens=width * len(live),
                queue_wait_s=tuple(started - it.enqueued for it in live),
                inference_s=inference_s,
                error=error,
                tenants=tuple(it.request.tenant for it in live),
            )
        )

    async def _score(self, inputs: list[Sequence[int]]) -> list[Any]:
        """``run_batch(inputs)`` on the worker thread, checked for one result per input."""
        loop = asyncio.get_running_loop()
        outputs = await loop.run_in_executor(self._executor, self._run_batch, inputs)
        return [self._convert(v) for v in check_count(outputs, len(inputs))]

    def _learn(self, rows: int, padded_tokens: int, seconds: float) -> None:
        """Update the throughput estimate (for Retry-After) and the pass-cost model."""
        self._admission.learn(rows, seconds)
        self._cost.add(padded_tokens, seconds)

    def _fail(self, live: list[Item], exc: BaseException) -> None:
        """Fail every request with an item in ``live`` (each once)."""
        for req in {id(it.request): it.request for it in live}.values():
            self._finish_request(req, exc)

    def _observe(self, stats: BatchStats) -> None:
        """Tell the observer, which must never break the batcher."""
        if self._observer is None:
            return
        try:
            self._observer.on_batch(stats)
        except Exception:
            logger.exception("batch observer failed")
