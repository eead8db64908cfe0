"""Sharing the server between tenants (issue 23): weighted fair batching across tenants in
the micro-batcher and in the vLLM engine's hand-off, per-tenant queue shares and rate
limits (429 with a Retry-After from the tenant's own budget), queue wait by tenant.

The real Batcher and AdmissionScheduler are under test; fakes stand only at their seams (the
pass a batcher runs, the rows vLLM runs). A row's tokens say whose it is (1: tenant A,
2: tenant B), so the order the seam sees tells who was served when. A rate-limited tenant
in a real server: test_fair_scheduling_server.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import pytest

from reward_server.config.tenants import DEFAULT_TENANT, Tenant, current_tenant
from reward_server.errors import NotRunningError, QueueFullError, TenantLimitError
from reward_server.scheduling import AdmissionScheduler, Batcher, BatchLimits
from reward_server.scheduling.batcher import shared_pass_tokens
from reward_server.scheduling.fairness import DeficitRoundRobin, TokenBuckets
from reward_server.scoring.metrics import Metrics

T = TypeVar("T")
A, B = 1, 2  # token of each tenant's rows


def run(coro: Awaitable[T]) -> T:
    """Run one test coroutine with a guard against hangs."""

    async def guarded() -> T:
        return await asyncio.wait_for(coro, 30)

    return asyncio.run(guarded())


def rows(who: int, count: int, length: int = 10) -> list[list[int]]:
    return [[who] * length for _ in range(count)]


async def as_tenant(tenant: Tenant, submit: Any, items: Sequence[Sequence[int]]) -> list[Any]:
    """``submit(items)`` in a request of ``tenant`` (what the auth dependency does)."""
    current_tenant.set(tenant)  # this task's own context: other tasks are not touched
    return list(await submit(items))


def spawn(tenant: Tenant, submit: Any, items: Sequence[Sequence[int]]) -> asyncio.Task[list[Any]]:
    return asyncio.ensure_future(as_tenant(tenant, submit, items))


class GatedScorer:
    """A fake pass: records whose rows each pass held; blocks while held."""

    def __init__(self) -> None:
        self.passes: list[list[int]] = []  # per pass, each row's owner
        self.gate = threading.Event()
        self.entered = threading.Event()

    def __call__(self, batch: list[Sequence[int]]) -> list[float]:
        self.passes.append([row[0] for row in batch])
        self.entered.set()
        assert self.gate.wait(20)
        return [float(sum(row)) for row in batch]

    def tokens(self, who: int, passes: Sequence[list[int]], length: int = 10) -> int:
        return sum(owner == who for p in passes for owner in p) * length


def batcher(scorer: GatedScorer, **kw: Any) -> Batcher:
    options: dict[str, Any] = {
        "max_batch_tokens": 40,  # 4 rows of 10 tokens
        "max_batch_size": 4,
        "max_wait_ms": 0,
        "max_queue": 1000,
        "split_overhead_tokens": 1000.0,  # fill each pass to the limits
        "buckets": TokenBuckets(),
    }
    options.update(kw)
    names = ("max_batch_tokens", "max_batch_size", "max_wait_ms", "max_queue")
    return Batcher(scorer, BatchLimits(**{name: options.pop(name) for name in names}), **options)


def limits(max_queue: int) -> BatchLimits:
    """An admission scheduler's limits: ``max_queue`` (the engine forms its own batches)."""
    return BatchLimits(max_batch_tokens=1, max_batch_size=1, max_wait_ms=0, max_queue=max_queue)


async def settle() -> None:
    """Let submitted tasks queue their items."""
    for _ in range(5):
        await asyncio.sleep(0)


# --------------------------------------------------------------------------- batcher


def test_a_tenant_arriving_behind_a_flood_is_served_in_the_next_pass() -> None:
    async def main() -> None:
        scorer = GatedScorer()
        b = batcher(scorer)
        await b.start()
        ta, tb = Tenant("A"), Tenant("B")
        flood = [spawn(ta, b.submit, rows(A, 8))]
        await asyncio.to_thread(scorer.entered.wait, 10)  # A's first pass is running
        flood += [spawn(ta, b.submit, rows(A, 8)) for _ in range(19)]
        await settle()
        small = spawn(tb, b.submit, rows(B, 4))
        await settle()
        assert b.queued_by_tenant().get("B", 0) == 4
        scorer.gate.set()
        assert await small == [10.0 * B] * 4
        await asyncio.gather(*flood)
        await b.stop()
        # 160 rows of A were queued before B's 4; B's rows all went in the second pass.
        b_passes = [i for i, p in enumerate(scorer.passes) if B in p]
        assert b_passes == [1]
        assert scorer.passes[1] == [B] * 4
        assert len(scorer.passes) == 41

    run(main())


def test_a_window_no_larger_than_a_turn_is_not_cut_by_a_newcomer() -> None:
    async def main() -> None:
        scorer = GatedScorer()
        b = batcher(scorer, max_batch_size=1)  # one row per pass; a turn is 40 tokens
        await b.start()
        small = spawn(Tenant("B"), b.submit, rows(B, 3))  # 30 tokens, three passes
        await asyncio.to_thread(scorer.entered.wait, 10)
        flood = spawn(Tenant("A"), b.submit, rows(A, 8))
        await settle()
        scorer.gate.set()
        await asyncio.gather(small, flood)
        await b.stop()
        assert scorer.passes[:3] == [[B]] * 3  # B's request finished before A's turn

    run(main())


@pytest.mark.parametrize(("b_rows", "first_b_pass"), [(1, 2), (4, 2), (5, 5)])
def test_a_light_tenant_goes_first_at_the_next_pass_within_one_turn(
    b_rows: int, first_b_pass: int
) -> None:
    # One row per pass, so a fair turn (40 tokens) is four passes. A and C flood; B sends
    # one request while A's first pass runs. Up to one turn (4 rows) B is sparse and takes
    # the pass after C's first (C has then been served more than B lately), inside the
    # turn of C's that was due; with 5 rows it is not, and waits for its turn of round
    # robin like anyone (C's four passes first, its fifth row in its next turn).
    async def main() -> None:
        scorer = GatedScorer()
        b = batcher(scorer, max_batch_size=1)
        await b.start()
        C = 3
        first = spawn(Tenant("A"), b.submit, rows(A, 1))
        await asyncio.to_thread(scorer.entered.wait, 10)
        tasks = [spawn(Tenant("A"), b.submit, rows(A, 2)) for _ in range(20)]
        tasks += [spawn(Tenant("C"), b.submit, rows(C, 2)) for _ in range(20)]
        await settle()
        light = spawn(Tenant("B"), b.submit, rows(B, b_rows))
        await settle()
        scorer.gate.set()
        assert await light == [10.0 * B] * b_rows
        await asyncio.gather(first, *tasks)
        await b.stop()
        b_passes = [i for i, p in enumerate(scorer.passes) if B in p]
        turn = min(b_rows, 4)  # B's rows that one turn covers run back to back
        assert b_passes[:turn] == list(range(first_b_pass, first_b_pass + turn))
        assert scorer.passes[1:first_b_pass] == [[C]] * (first_b_pass - 1)

    run(main())


def test_back_to_back_small_requests_get_no_more_than_a_fair_share() -> None:
    # One row per pass. B sends one request of a turn's size (four passes) after another
    # without pause (its queue empties between them, so each is "sparse"): it goes first
    # only while it has been served less than A lately, so while both have work the
    # tokens still split about evenly, not four of B's passes to each of A's.
    async def main() -> None:
        scorer = GatedScorer()
        b = batcher(scorer, max_batch_size=1)
        await b.start()
        first = spawn(Tenant("A"), b.submit, rows(A, 1))
        await asyncio.to_thread(scorer.entered.wait, 10)
        flood = [spawn(Tenant("A"), b.submit, rows(A, 4)) for _ in range(30)]
        await settle()

        async def closed_loop() -> None:
            current_tenant.set(Tenant("B"))
            for _ in range(15):
                assert await b.submit(rows(B, 4)) == [10.0 * B] * 4

        light = asyncio.ensure_future(closed_loop())
        await settle()
        scorer.gate.set()
        await asyncio.gather(first, light, *flood)
        await b.stop()
        passes = scorer.passes[1:]
        last_a = max(i for i, p in enumerate(passes) if A in p)
        last_b = max(i for i, p in enumerate(passes) if B in p)
        both = passes[: min(last_a, last_b) + 1]
        ratio = scorer.tokens(B, both) / scorer.tokens(A, both)
        assert 0.6 <= ratio <= 1.4, ratio

    run(main())


def test_passes_are_kept_small_while_another_tenant_is_about() -> None:
    # A pass's fixed cost is worth 2 tokens here, so shared passes hold at most 20 padded
    # tokens (two rows); alone, a tenant's window of equal rows runs in one full pass.
    assert shared_pass_tokens(None, 400) == 400
    assert shared_pass_tokens(2.0, 400) == 20
    assert shared_pass_tokens(1e6, 400) == 400

    async def main() -> None:
        scorer = GatedScorer()
        b = batcher(scorer, max_batch_tokens=400, max_batch_size=40, split_overhead_tokens=2.0)
        await b.start()
        scorer.gate.set()
        alone = [spawn(Tenant("A"), b.submit, rows(A, 2)) for _ in range(8)]
        await asyncio.gather(*alone)
        assert max(len(p) for p in scorer.passes) == 16  # A alone: one pass of all 16 rows
        scorer.passes.clear()
        await spawn(Tenant("B"), b.submit, rows(B, 1))  # B has been about just now
        shared = [spawn(Tenant("A"), b.submit, rows(A, 2)) for _ in range(8)]
        await asyncio.gather(*shared)
        await b.stop()
        a_passes = [p for p in scorer.passes if A in p]
        assert sum(map(len, a_passes)) == 16 and max(map(len, a_passes)) == 2

    run(main())


def test_weights_2_to_1_give_2_to_1_tokens_while_both_wait() -> None:
    async def main() -> None:
        scorer = GatedScorer()
        b = batcher(scorer)
        await b.start()
        ta, tb = Tenant("A", weight=2.0), Tenant("B", weight=1.0)
        first = spawn(DEFAULT_TENANT, b.submit, [[3] * 10])
        await asyncio.to_thread(scorer.entered.wait, 10)
        tasks = [spawn(ta, b.submit, rows(A, 4)) for _ in range(30)]
        tasks += [spawn(tb, b.submit, rows(B, 4)) for _ in range(30)]
        await settle()
        scorer.gate.set()
        await asyncio.gather(first, *tasks)
        await b.stop()
        passes = scorer.passes[1:]
        # While both have work (until A's 120 rows are done), A gets twice B's tokens.
        last_a = max(i for i, p in enumerate(passes) if A in p)
        both = passes[: last_a + 1]
        ratio = scorer.tokens(A, both) / scorer.tokens(B, both)
        assert 1.8 <= ratio <= 2.2, ratio
        # Each pass holds one tenant's turn: fair turns are not mixed.
        assert all(len(set(p)) == 1 for p in passes)

    run(main())


def test_equal_weights_share_tokens_whatever_the_request_sizes() -> None:
    async def main() -> None:
        scorer = GatedScorer()
        b = batcher(scorer)
        await b.start()
        first = spawn(DEFAULT_TENANT, b.submit, [[3] * 10])
        await asyncio.to_thread(scorer.entered.wait, 10)
        # A sends big requests, B many one-row requests: tokens still split 1:1.
        tasks = [spawn(Tenant("A"), b.submit, rows(A, 16)) for _ in range(6)]
        tasks += [spawn(Tenant("B"), b.submit, rows(B, 1)) for _ in range(96)]
        await settle()
        scorer.gate.set()
        await asyncio.gather(first, *tasks)
        await b.stop()
        passes = scorer.passes[1:]
        half = passes[: len(passes) // 2]
        assert scorer.tokens(A, half) == scorer.tokens(B, half)

    run(main())


def test_one_tenant_alone_is_batched_as_before() -> None:
    async def main() -> None:
        scorer = GatedScorer()
        b = batcher(scorer, sort_window=2)
        await b.start()
        first = spawn(Tenant("A"), b.submit, rows(A, 1))
        await asyncio.to_thread(scorer.entered.wait, 10)
        tasks = [spawn(Tenant("A"), b.submit, [[A] * n]) for n in (10, 2, 9, 3, 8, 4, 7, 5)]
        await settle()
        scorer.gate.set()
        await asyncio.gather(first, *tasks)
        await b.stop()
        # One window of two passes, sorted by length: the short rows together.
        assert [len(p) for p in scorer.passes] == [1, 4, 4]
        assert b.queued_by_tenant() == {}

    run(main())


def test_queue_share_refuses_one_tenant_and_admits_the_other() -> None:
    async def main() -> None:
        scorer = GatedScorer()
        b = batcher(scorer, max_queue=10, max_batch_size=2, max_batch_tokens=20)
        await b.start()
        ta = Tenant("A", queue_share=0.5)  # 5 of 10 items
        tb = Tenant("B", queue_share=0.5)
        running = spawn(ta, b.submit, rows(A, 2))
        await asyncio.to_thread(scorer.entered.wait, 10)  # started: no longer queued
        queued = spawn(ta, b.submit, rows(A, 4))
        await settle()
        assert b.queued_by_tenant().get("A", 0) == 4
        with pytest.raises(TenantLimitError) as info:
            await as_tenant(ta, b.submit, rows(A, 2))
        assert isinstance(info.value, QueueFullError)  # a 429 at the edge
        assert "'A'" in str(info.value) and "share of the queue is 5" in str(info.value)
        assert info.value.retry_after > 0
        assert b.queued_by_tenant().get("A", 0) == 4  # all or nothing: nothing of it was counted
        other = spawn(tb, b.submit, rows(B, 4))  # B has its own share
        await settle()
        assert b.queued_by_tenant().get("B", 0) == 4
        # A lone request always fits its tenant's share (not the whole queue, though).
        with pytest.raises(QueueFullError) as full:
            await as_tenant(Tenant("C", queue_share=0.1), b.submit, rows(A, 3))
        assert not isinstance(full.value, TenantLimitError)
        scorer.gate.set()
        await asyncio.gather(running, queued, other)
        assert await as_tenant(ta, b.submit, rows(A, 5)) == [10.0 * A] * 5
        await b.stop()

    run(main())


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_rate_limit_refuses_until_the_bucket_holds_the_tokens() -> None:
    async def main() -> None:
        clock = Clock()
        buckets = TokenBuckets(clock)
        scorer = GatedScorer()
        scorer.gate.set()
        b = batcher(scorer, buckets=buckets)
        await b.start()
        ta = Tenant("A", tokens_per_s=80)  # a bucket of 80 tokens (one second's worth)
        assert await as_tenant(ta, b.submit, rows(A, 6)) == [10.0] * 6  # 60 tokens: 20 left
        queued = b.queued
        with pytest.raises(TenantLimitError) as info:
            await as_tenant(ta, b.submit, rows(A, 6))
        assert info.value.retry_after == pytest.approx(0.5)  # 40 tokens more at 80/s
        assert "rate limit of 80 tokens/s" in str(info.value)
        assert b.queued == queued  # refused whole
        # Another tenant, and the server's default one, are not affected.
        assert await as_tenant(Tenant("B", tokens_per_s=80), b.submit, rows(B, 6))
        assert await as_tenant(DEFAULT_TENANT, b.submit, rows(B, 50))
        clock.now += 0.25
        with pytest.raises(TenantLimitError) as again:
            await as_tenant(ta, b.submit, rows(A, 6))
        assert again.value.retry_after == pytest.approx(0.25)  # a refusal takes nothing
        clock.now += 0.25
        assert await as_tenant(ta, b.submit, rows(A, 6))
        # A request larger than the bucket waits for a full bucket, then leaves a debt.
        clock.now += 5
        assert await as_tenant(ta, b.submit, rows(A, 12))  # 120 tokens: level -40
        with pytest.raises(TenantLimitError) as debt:
            await as_tenant(ta, b.submit, rows(A, 1))
        assert debt.value.retry_after == pytest.approx(0.625)  # from -40 to 10 tokens
        await b.stop()

    run(main())


def test_one_bucket_per_tenant_across_schedulers() -> None:
    async def main() -> None:
        clock = Clock()
        buckets = TokenBuckets(clock)
        scorer = GatedScorer()
        scorer.gate.set()
        first, second = batcher(scorer, buckets=buckets), batcher(scorer, buckets=buckets)
        await first.start()
        await second.start()
        ta = Tenant("A", tokens_per_s=100)
        await as_tenant(ta, first.submit, rows(A, 8))
        with pytest.raises(TenantLimitError):
            await as_tenant(ta, second.submit, rows(A, 8))
        await first.stop()
        await second.stop()

    run(main())


def test_queue_wait_is_recorded_by_tenant() -> None:
    async def main() -> None:
        scorer = GatedScorer()
        scorer.gate.set()
        metrics = Metrics()
        b = batcher(scorer, observer=metrics)
        await b.start()
        await as_tenant(Tenant("A"), b.submit, rows(A, 3))
        await as_tenant(Tenant("B"), b.submit, rows(B, 2))
        await b.stop()
        text = metrics.render().decode()
        assert 'reward_server_tenant_queue_wait_seconds_count{tenant="A"} 3.0' in text
        assert 'reward_server_tenant_queue_wait_seconds_count{tenant="B"} 2.0' in text

    run(main())


def test_cancelled_requests_leave_no_count_behind() -> None:
    async def main() -> None:
        scorer = GatedScorer()
        b = batcher(scorer, max_queue=20)
        await b.start()
        running = spawn(Tenant("A"), b.submit, rows(A, 4))
        await asyncio.to_thread(scorer.entered.wait, 10)
        waiting = spawn(Tenant("A", queue_share=0.5), b.submit, rows(A, 8))
        other = spawn(Tenant("B"), b.submit, rows(B, 4))
        await settle()
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        assert b.queued_by_tenant().get("A", 0) == 0 and b.queued == 4
        scorer.gate.set()
        await asyncio.gather(running, other)
        await b.stop()
        assert [A] * 8 not in scorer.passes

    run(main())


# --------------------------------------------------------------------------- turn order


def test_deficit_round_robin_turns() -> None:
    drr = DeficitRoundRobin(quantum=10)
    heads = {"A": 10, "B": 25}
    for name in heads:
        drr.wake(name)
    # B's head needs three quanta: A gets a turn at each of B's visits meanwhile.
    order = []
    for _ in range(4):
        name = drr.begin(heads.get, lambda _: 1.0)
        assert name is not None and drr.charge(name, heads[name])
        order.append(name)
        drr.end(name, True)
    assert order == ["A", "A", "A", "B"]
    assert drr.deficit("B") == 5.0
    assert drr.begin(heads.get, lambda _: 1.0) == "A"
    drr.end("A", False)  # A's queue ran dry: out of the ring, credit dropped
    assert drr.waiting() == ["B"] and drr.deficit("A") == 0.0
    # A tenant with no work left is passed over and forgotten.
    assert drr.begin({"B": None}.get, lambda _: 1.0) is None and drr.waiting() == []


# --------------------------------------------------------------------------- vLLM


class FakeRows:
    """vLLM at the RowRunner seam: records the requests it gets, finishes them when told."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.order: list[int] = []  # owner of each request, as handed over
        self.lengths: list[int] = []  # its first row's length
        self.finish = asyncio.Event()
        self.holding = 0  # rows handed over and not finished

    @property
    def errored(self) -> bool:
        return False

    def check_rows(self, rows: Sequence[Sequence[int]]) -> None:
        if any(not row for row in rows):
            raise ValueError("empty row")

    async def run_rows(self, rows: Sequence[Sequence[int]]) -> tuple[list[Any], int]:
        self.order.append(rows[0][0])
        self.lengths.append(len(rows[0]))
        self.holding += len(rows)
        try:
            await self.finish.wait()
        finally:
            self.holding -= len(rows)
        return [float(sum(row)) for row in rows], 0


def test_vllm_hands_requests_over_in_fair_order() -> None:
    async def main() -> None:
        engine = FakeRows()
        metrics = Metrics()
        sched = AdmissionScheduler(
            engine,
            limits(max_queue=1000),
            observer=metrics,
            max_in_engine=4,
            quantum_tokens=20,
            buckets=TokenBuckets(),
        )
        await sched.start()
        flood = [spawn(Tenant("A"), sched.submit, rows(A, 2)) for _ in range(10)]
        await settle()
        small = spawn(Tenant("B"), sched.submit, rows(B, 2))
        await settle()
        # vLLM holds 4 rows (A's first two requests); the rest wait their turn here.
        assert engine.order == [A, A] and engine.holding == 4 and sched.queued == 22
        engine.finish.set()
        assert await small == [20.0, 20.0]
        await asyncio.gather(*flood)
        await sched.stop()
        # B's request went in right after A's turn in progress, not behind the flood.
        assert engine.order.index(B) <= 3
        text = metrics.render().decode()
        assert 'reward_server_tenant_queue_wait_seconds_count{tenant="B"} 2.0' in text

    run(main())


def test_vllm_weights_and_single_tenant_order() -> None:
    async def main() -> None:
        engine = FakeRows()
        engine.finish.set()
        sched = AdmissionScheduler(
            engine,
            limits(max_queue=1000),
            observer=None,
            max_in_engine=2,
            quantum_tokens=20,
            buckets=TokenBuckets(),
        )
        await sched.start()
        # One tenant: first come, first handed over (row lengths tell the requests apart).
        lengths = [5, 3, 7, 2, 9]
        await asyncio.gather(*(spawn(Tenant("A"), sched.submit, [[A] * n]) for n in lengths))
        assert engine.lengths == lengths
        engine.finish.clear()
        blocker = spawn(DEFAULT_TENANT, sched.submit, rows(3, 2))
        await settle()
        engine.order.clear()
        tasks = [spawn(Tenant("A", weight=2.0), sched.submit, rows(A, 1)) for _ in range(20)]
        tasks += [spawn(Tenant("B"), sched.submit, rows(B, 1)) for _ in range(20)]
        await settle()
        engine.finish.set()
        await asyncio.gather(blocker, *tasks)
        # Turns of 40 tokens (4 requests) for A, 20 (2) for B, while both wait.
        head = engine.order[:18]
        assert head.count(A) == 12 and head.count(B) == 6
        await sched.stop()

    run(main())


def test_vllm_per_tenant_admission_and_a_request_cancelled_while_waiting() -> None:
    async def main() -> None:
        engine = FakeRows()
        sched = AdmissionScheduler(
            engine, limits(max_queue=10), observer=None, max_in_engine=2, buckets=TokenBuckets()
        )
        await sched.start()
        ta = Tenant("A", queue_share=0.4)  # 4 rows of 10
        first = spawn(ta, sched.submit, rows(A, 2))
        await settle()
        with pytest.raises(TenantLimitError):
            await as_tenant(ta, sched.submit, rows(A, 3))
        waiting = spawn(Tenant("B"), sched.submit, rows(B, 3))
        await settle()
        assert sched.queued == 5 and engine.holding == 2
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        assert sched.queued == 2
        engine.finish.set()
        await first
        await sched.stop()
        assert engine.order == [A]  # the cancelled request never reached vLLM

    run(main())


# --------------------------------------------------------------------------- real server


def test_vllm_stop_drains_or_fails_the_requests_waiting_their_turn() -> None:
    async def main() -> None:
        engine = FakeRows()
        sched = AdmissionScheduler(
            engine, limits(max_queue=100), observer=None, max_in_engine=2, buckets=TokenBuckets()
        )
        await sched.start()
        tasks = [spawn(Tenant("A"), sched.submit, rows(A, 2)) for _ in range(3)]
        await settle()
        assert engine.holding == 2 and sched.queued == 6
        stopping = asyncio.ensure_future(sched.stop())  # drain: the waiting ones still run
        await settle()
        with pytest.raises(NotRunningError):
            await as_tenant(Tenant("B"), sched.submit, rows(B, 1))
        engine.finish.set()
        assert [len(v) for v in await asyncio.gather(*tasks)] == [2, 2, 2]
        await stopping
        assert engine.order == [A, A, A]

        engine2 = FakeRows()
        sched2 = AdmissionScheduler(
            engine2, limits(max_queue=100), observer=None, max_in_engine=2, buckets=TokenBuckets()
        )
        await sched2.start()
        waiting = [spawn(Tenant("A"), sched2.submit, rows(A, 2)) for _ in range(3)]
        await settle()
        await sched2.stop(drain=False)  # the one in vLLM is cancelled, the others fail
        results = await asyncio.gather(*waiting, return_exceptions=True)
        assert isinstance(results[0], asyncio.CancelledError)
        assert all(isinstance(r, NotRunningError) for r in results[1:])
        assert sched2.queued == 0 and engine2.order == [A]

    run(main())
