"""Batcher behaviour with a fake scorer at the run_batch seam."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import pytest

import reward_server.scheduling.batcher as batcher_module
from reward_server.errors import NotRunningError, QueueFullError
from reward_server.scheduling import Batcher, BatchLimits, BatchStats
from reward_server.scheduling.fairness import MAX_RETRY_AFTER, MIN_RETRY_AFTER

T = TypeVar("T")
FAIL = -1  # a row holding this token makes the fake scorer raise


def run(coro: Awaitable[T]) -> T:
    """Run one test coroutine with a generous overall guard against hangs."""

    async def guarded() -> T:
        return await asyncio.wait_for(coro, 30)

    return asyncio.run(guarded())


def expected(row: Sequence[int]) -> float:
    """The fake score of a row: depends on every token and on the length."""
    return float(sum((i + 1) * t for i, t in enumerate(row)) + 0.5 * len(row))


class FakeScorer:
    """Scores rows deterministically, records batches, can block, fail or misbehave."""

    def __init__(self) -> None:
        self.batches: list[list[list[int]]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.drop_one = False

    def __call__(self, batch: list[Sequence[int]]) -> list[float]:
        self.batches.append([list(r) for r in batch])
        self.entered.set()
        self.gate.wait()
        if any(FAIL in r for r in batch):
            raise ValueError("boom")
        out = [expected(r) for r in batch]
        return out[:-1] if self.drop_one else out

    def hold(self) -> None:
        """Make the next batches block until release()."""
        self.entered.clear()
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()

    async def wait_entered(self) -> None:
        await asyncio.to_thread(self.entered.wait)

    def shapes(self) -> list[list[int]]:
        return [[len(r) for r in b] for b in self.batches]


class Recorder:
    """A BatchObserver that keeps its calls, and optionally raises."""

    def __init__(self, explode: bool = False) -> None:
        self.calls: list[BatchStats] = []
        self.dropped: list[int] = []
        self.explode = explode

    def on_dropped(self, rows: int) -> None:
        self.dropped.append(rows)

    def on_batch(self, stats: BatchStats) -> None:
        self.calls.append(stats)
        if self.explode:
            raise RuntimeError("observer bug")


def make(scorer: FakeScorer, **kwargs: Any) -> Batcher:
    opts: dict[str, Any] = {
        "max_batch_tokens": 64,
        "max_batch_size": 4,
        "max_wait_ms": 2,
        "max_queue": 1000,
    }
    opts.update(kwargs)
    names = ("max_batch_tokens", "max_batch_size", "max_wait_ms", "max_queue")
    return Batcher(scorer, BatchLimits(**{name: opts.pop(name) for name in names}), **opts)


async def until(cond: Callable[[], bool]) -> None:
    """Yield to the loop until ``cond()`` holds (no timing involved)."""
    while not cond():
        await asyncio.sleep(0)


def rand_rows(rng: random.Random, n: int, max_len: int = 20) -> list[list[int]]:
    return [[rng.randint(1, 999) for _ in range(rng.randint(1, max_len))] for _ in range(n)]


# ---------------------------------------------------------------------- order and limits


def test_order_preserved_across_concurrent_submits() -> None:
    scorer = FakeScorer()
    rng = random.Random(0)
    requests = [rand_rows(rng, rng.randint(1, 9)) for _ in range(40)]

    async def main() -> list[list[float]]:
        batcher = make(scorer)
        await batcher.start()
        results = await asyncio.gather(*(batcher.submit(r) for r in requests))
        await batcher.stop()
        return results

    results = run(main())
    for rows, scores in zip(requests, results, strict=True):
        assert scores == [expected(r) for r in rows]
    assert len(scorer.batches) > 1
    assert sum(len(b) for b in scorer.batches) == sum(len(r) for r in requests)


def test_limits_respected_and_oversized_item_runs_alone() -> None:
    scorer = FakeScorer()
    rng = random.Random(1)
    requests = [rand_rows(rng, 5, max_len=30) for _ in range(20)]
    requests.append([[7] * 100])  # alone over the 64-token budget

    async def main() -> None:
        batcher = make(scorer, max_batch_tokens=64, max_batch_size=4)
        await batcher.start()
        results = await asyncio.gather(*(batcher.submit(r) for r in requests))
        await batcher.stop()
        for rows, scores in zip(requests, results, strict=True):
            assert scores == [expected(r) for r in rows]

    run(main())
    shapes = scorer.shapes()
    assert [100] in shapes
    for shape in shapes:
        assert len(shape) <= 4
        assert len(shape) == 1 or max(shape) * len(shape) <= 64
        assert shape == sorted(shape)


def test_window_is_length_sorted_across_micro_batches() -> None:
    scorer = FakeScorer()
    rng = random.Random(2)
    requests = [rand_rows(rng, 2, max_len=15) for _ in range(8)]  # 16 rows, one window

    async def main() -> None:
        batcher = make(scorer, max_batch_tokens=100, max_batch_size=4, max_wait_ms=0)
        await batcher.start()
        scorer.hold()
        first = asyncio.create_task(batcher.submit([[1]]))
        await scorer.wait_entered()
        tasks = [asyncio.create_task(batcher.submit(r)) for r in requests]
        await until(lambda: batcher.queued == 16)
        scorer.release()
        await asyncio.gather(first, *tasks)
        for rows, task in zip(requests, tasks, strict=True):
            assert task.result() == [expected(r) for r in rows]
        await batcher.stop()

    run(main())
    later = [n for shape in scorer.shapes()[1:] for n in shape]
    assert later == sorted(len(r) for rows in requests for r in rows)
    assert all(len(s) <= 4 and max(s) * len(s) <= 100 for s in scorer.shapes())


def test_full_batch_does_not_wait_for_max_wait() -> None:
    scorer = FakeScorer()

    async def main() -> None:
        # A minute of max_wait: only a full batch (or the guard in run()) ends the wait.
        batcher = make(scorer, max_batch_size=3, max_wait_ms=60_000)
        await batcher.start()
        assert await batcher.submit([[1], [2], [3]]) == [
            expected([1]),
            expected([2]),
            expected([3]),
        ]
        await batcher.stop()

    run(main())


def test_lone_request_goes_out_with_zero_wait() -> None:
    scorer = FakeScorer()

    async def main() -> None:
        batcher = make(scorer, max_wait_ms=0)
        await batcher.start()
        for k in range(1, 6):
            assert await batcher.submit([[k] * k]) == [expected([k] * k)]
        await batcher.stop()

    run(main())
    assert scorer.shapes() == [[1], [2], [3], [4], [5]]


# ---------------------------------------------------------------------- failures


def test_failing_batch_fails_only_its_requests() -> None:
    scorer = FakeScorer()

    async def main() -> None:
        batcher = make(scorer, max_batch_size=1)
        await batcher.start()
        bad = batcher.submit([[5], [FAIL], [6]])
        good = batcher.submit([[1, 2], [3]])
        results = await asyncio.gather(bad, good, return_exceptions=True)
        assert isinstance(results[0], ValueError) and str(results[0]) == "boom"
        assert results[1] == [expected([1, 2]), expected([3])]
        assert await batcher.submit([[9]]) == [expected([9])]  # the next batch runs
        assert batcher.queued == 0
        await batcher.stop()

    run(main())
    # The failed request's later item was dropped instead of scored.
    assert [6] not in [r for b in scorer.batches for r in b]


def test_output_length_mismatch_fails_the_batch() -> None:
    scorer = FakeScorer()

    async def main() -> None:
        batcher = make(scorer)
        await batcher.start()
        scorer.drop_one = True
        with pytest.raises(RuntimeError, match="returned 1 results for 2 inputs"):
            await batcher.submit([[1], [2]])
        scorer.drop_one = False
        assert await batcher.submit([[1], [2]]) == [expected([1]), expected([2])]
        await batcher.stop()

    run(main())


def test_non_numeric_output_fails_the_batch() -> None:
    async def main() -> None:
        batcher = Batcher(
            lambda rows: [None] * len(rows),  # type: ignore[arg-type,misc]
            BatchLimits(max_batch_tokens=64, max_batch_size=4, max_wait_ms=0, max_queue=10),
        )
        await batcher.start()
        with pytest.raises(TypeError):
            await batcher.submit([[1]])
        assert batcher.running
        await batcher.stop()

    run(main())


def test_cancelled_submit_is_dropped_before_it_runs() -> None:
    scorer = FakeScorer()

    async def main() -> None:
        batcher = make(scorer, max_wait_ms=0)
        await batcher.start()
        scorer.hold()
        first = asyncio.create_task(batcher.submit([[1]]))
        await scorer.wait_entered()
        doomed = asyncio.create_task(batcher.submit([[42, 42], [43]]))
        kept = asyncio.create_task(batcher.submit([[2, 2]]))
        await until(lambda: batcher.queued == 3)
        doomed.cancel()
        await asyncio.gather(doomed, return_exceptions=True)
        assert doomed.cancelled()
        assert batcher.queued == 1
        scorer.release()
        assert await first == [expected([1])]
        assert await kept == [expected([2, 2])]
        await batcher.stop()

    run(main())
    rows = [r for b in scorer.batches for r in b]
    assert [42, 42] not in rows and [43] not in rows


# ---------------------------------------------------------------------- admission and stop


def test_queue_full_is_all_or_nothing() -> None:
    scorer = FakeScorer()

    async def main() -> None:
        batcher = make(scorer, max_queue=4, max_wait_ms=0)
        await batcher.start()
        scorer.hold()
        first = asyncio.create_task(batcher.submit([[1]]))
        await scorer.wait_entered()
        waiting = asyncio.create_task(batcher.submit([[2], [3], [4]]))
        await until(lambda: batcher.queued == 3)
        with pytest.raises(QueueFullError) as err:
            await batcher.submit([[5], [6]])
        assert err.value.retry_after == 1.0  # no pass measured yet: one second
        assert batcher.queued == 3  # nothing of the refused request was admitted
        last = asyncio.create_task(batcher.submit([[7]]))  # exactly fills the queue
        await until(lambda: batcher.queued == 4)
        scorer.release()
        assert await first == [expected([1])]
        assert await waiting == [expected([2]), expected([3]), expected([4])]
        assert await last == [expected([7])]
        await batcher.stop()

    run(main())
    assert [5] not in [r for b in scorer.batches for r in b]


def test_submit_before_start_and_after_stop() -> None:
    scorer = FakeScorer()

    async def main() -> None:
        batcher = make(scorer)
        assert not batcher.running
        with pytest.raises(NotRunningError):
            await batcher.submit([[1]])
        await batcher.start()
        assert batcher.running
        await batcher.stop()
        assert not batcher.running
        with pytest.raises(NotRunningError):
            await batcher.submit([[1]])

    run(main())


def test_stop_drain_finishes_queued_work() -> None:
    scorer = FakeScorer()
    rng = random.Random(3)
    requests = [rand_rows(rng, 3) for _ in range(10)]

    async def main() -> None:
        batcher = make(scorer, max_wait_ms=0)
        await batcher.start()
        scorer.hold()
        first = asyncio.create_task(batcher.submit([[1]]))
        await scorer.wait_entered()
        tasks = [asyncio.create_task(batcher.submit(r)) for r in requests]
        await until(lambda: batcher.queued == 30)
        stopping = asyncio.create_task(batcher.stop(drain=True))
        await asyncio.sleep(0)
        assert not batcher.running
        with pytest.raises(NotRunningError):
            await batcher.submit([[9]])
        scorer.release()
        await stopping
        assert await first == [expected([1])]
        for rows, task in zip(requests, tasks, strict=True):
            assert task.result() == [expected(r) for r in rows]

    run(main())


def test_stop_without_drain_fails_queued_work() -> None:
    scorer = FakeScorer()

    async def main() -> None:
        batcher = make(scorer, max_wait_ms=0)
        await batcher.start()
        scorer.hold()
        first = asyncio.create_task(batcher.submit([[1]]))
        await scorer.wait_entered()
        queued = asyncio.create_task(batcher.submit([[2], [3]]))
        await until(lambda: batcher.queued == 2)
        stopping = asyncio.create_task(batcher.stop(drain=False))
        with pytest.raises(NotRunningError):
            await queued
        scorer.release()
        await stopping
        assert await first == [expected([1])]  # the running batch still completes
        assert batcher.queued == 0

    run(main())
    assert scorer.shapes() == [[1]]


# ---------------------------------------------------------------------- observer


def test_observer_sees_every_batch_including_failures() -> None:
    scorer = FakeScorer()
    observer = Recorder()

    async def main() -> None:
        batcher = make(scorer, max_batch_size=2, max_wait_ms=0, observer=observer)
        await batcher.start()
        await batcher.submit([[1, 2, 3], [4]])
        with pytest.raises(ValueError):
            await batcher.submit([[FAIL]])
        await batcher.stop()

    run(main())
    ok, failed = observer.calls
    assert ok.rows == 2 and ok.real_tokens == 4 and ok.padded_tokens == 6
    assert len(ok.queue_wait_s) == 2 and all(w >= 0 for w in ok.queue_wait_s)
    assert ok.inference_s >= 0 and ok.error is None
    assert failed.rows == 1 and isinstance(failed.error, ValueError)


def test_observer_exception_breaks_nothing() -> None:
    scorer = FakeScorer()
    observer = Recorder(explode=True)

    async def main() -> None:
        batcher = make(scorer, max_wait_ms=0, observer=observer)
        await batcher.start()
        for k in range(3):
            assert await batcher.submit([[k]]) == [expected([k])]
        with pytest.raises(ValueError):
            await batcher.submit([[FAIL]])
        assert await batcher.submit([[5]]) == [expected([5])]
        assert batcher.running
        await batcher.stop()

    run(main())
    assert len(observer.calls) == 5


class Clock:
    """The batcher's clock (``reward_server.scheduling.batcher.time``): it moves only when a pass runs."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class TimedScorer(FakeScorer):
    """A FakeScorer whose passes take ``seconds_per_row`` of the batcher's clock per row."""

    def __init__(self, clock: Clock, seconds_per_row: float) -> None:
        super().__init__()
        self.clock = clock
        self.seconds_per_row = seconds_per_row

    def __call__(self, batch: list[Sequence[int]]) -> list[float]:
        out = super().__call__(batch)
        self.clock.now += self.seconds_per_row * len(batch)
        return out


def refused_retry_after(
    monkeypatch: pytest.MonkeyPatch, seconds_per_row: list[float], excess: int
) -> float:
    """Retry-After of a submit refused by ``excess`` items, after one measured pass of 4 rows
    per entry of ``seconds_per_row`` (each that fast), with a full queue of 4 waiting."""
    clock = Clock()
    monkeypatch.setattr(batcher_module, "time", clock)
    scorer = TimedScorer(clock, seconds_per_row[0])

    async def main() -> float:
        batcher = make(scorer, max_queue=4, max_wait_ms=0)
        await batcher.start()
        for speed in seconds_per_row:  # the measured passes
            scorer.seconds_per_row = speed
            assert await batcher.submit([[1], [2], [3], [4]]) == [
                expected([k]) for k in (1, 2, 3, 4)
            ]
        scorer.hold()
        first = asyncio.create_task(batcher.submit([[1]]))
        await scorer.wait_entered()
        rest = asyncio.create_task(batcher.submit([[2], [3], [4], [5]]))
        await until(lambda: batcher.queued == 4)
        with pytest.raises(QueueFullError) as err:
            await batcher.submit([[9]] * excess)  # refused by exactly `excess` items
        assert "retry after" in str(err.value)
        scorer.release()
        await asyncio.gather(first, rest)
        await batcher.stop()
        return err.value.retry_after

    return run(main())


def test_retry_after_follows_throughput(monkeypatch: pytest.MonkeyPatch) -> None:
    # Retry-After = items over the limit / measured rows per second.
    assert refused_retry_after(monkeypatch, [0.5], excess=1) == pytest.approx(0.5)
    assert refused_retry_after(monkeypatch, [0.5], excess=3) == pytest.approx(1.5)
    # A ten times slower scorer asks for ten times the wait, for the same queue.
    assert refused_retry_after(monkeypatch, [0.05], excess=3) == pytest.approx(0.15)
    # The rate is a moving average of the passes: 2 rows/s, then 20 rows/s -> 0.8*2 + 0.2*20.
    assert refused_retry_after(monkeypatch, [0.5, 0.05], excess=3) == pytest.approx(3 / 5.6)
    # Clamped to what a client can act on.
    assert refused_retry_after(monkeypatch, [100.0], excess=3) == MAX_RETRY_AFTER
    assert refused_retry_after(monkeypatch, [1e-4], excess=1) == MIN_RETRY_AFTER


def test_empty_row_is_refused_at_submit() -> None:
    scorer = FakeScorer()

    async def main() -> None:
        batcher = make(scorer)
        await batcher.start()
        with pytest.raises(ValueError, match="empty row"):
            await batcher.submit([[1], []])
        assert batcher.queued == 0
        assert await batcher.submit([]) == []
        await batcher.stop()

    run(main())
    assert scorer.batches == []


def test_invalid_limits_rejected() -> None:
    with pytest.raises(ValueError):
        Batcher(
            lambda rows: [],
            BatchLimits(max_batch_tokens=0, max_batch_size=1, max_wait_ms=0, max_queue=1),
        )
    with pytest.raises(ValueError):
        Batcher(
            lambda rows: [],
            BatchLimits(max_batch_tokens=1, max_batch_size=1, max_wait_ms=-1, max_queue=1),
        )
