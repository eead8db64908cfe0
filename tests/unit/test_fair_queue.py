"""The one fair queue in front of every executor's seats (issue 49, item 1):
:class:`~reward_server.scheduling.fair_queue.FairQueue` (a sparse tenant first, else deficit
round robin by weight; discard, close, blocking take across threads),
:class:`~reward_server.scheduling.seats.Seats` (capacity, a piece larger than what is free,
cancelling a waiting piece, closing, grants from another thread) and
:class:`~reward_server.scheduling.fairness.Admission` (the queue limit, a tenant's share, one
Retry-After). The executors on top (a verifier pool, a code verifier, a remote component's
connections) are tested with their own: test_verifiers.py, test_code_fairness.py,
test_remote_component.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from reward_server.config.tenants import Tenant
from reward_server.errors import NotRunningError, QueueFullError, TenantLimitError
from reward_server.scheduling import Admission, FairQueue, Seats
from reward_server.scheduling.fairness import MAX_RETRY_AFTER

T = TypeVar("T")
A, B, C = Tenant("A"), Tenant("B"), Tenant("C")


def run(coro: Awaitable[T]) -> T:
    async def guarded() -> T:
        return await asyncio.wait_for(coro, 30)

    return asyncio.run(guarded())


def drain(queue: FairQueue[str]) -> list[str]:
    out = []
    while (value := queue.pop()) is not None:
        out.append(value)
    return out


# --------------------------------------------------------------------------- the order


def test_a_sparse_tenant_goes_before_a_flood() -> None:
    queue: FairQueue[str] = FairQueue(quantum=1, burst=4)
    queue.put(A, [(f"a{i}", 1.0) for i in range(20)])
    assert [queue.pop() for _ in range(3)] == ["a0", "a1", "a2"]  # A served: not sparse
    queue.put(B, [("b0", 1.0), ("b1", 1.0)])  # arrives to an empty queue, served less
    assert [queue.pop() for _ in range(3)] == ["b0", "b1", "a3"]
    # Within its burst only: of C's six entries four go first, then it takes turns with A.
    queue.put(C, [(f"c{i}", 1.0) for i in range(6)])
    assert drain(queue)[:8] == ["c0", "c1", "c2", "c3", "c4", "a4", "c5", "a5"]


def test_a_tenant_served_as_much_as_the_other_lately_waits_for_turns() -> None:
    queue: FairQueue[str] = FairQueue(quantum=1, burst=8)
    queue.put(A, [(f"a{i}", 1.0) for i in range(20)])
    queue.pop()
    # B sends one request after another: its first goes first (B was served less than A);
    # after that it has had more than A lately, and takes turns with A's backlog.
    served = []
    for request in range(4):
        queue.put(B, [(f"b{request}.{i}", 1.0) for i in range(2)])
        served += [queue.pop(), queue.pop()]
    assert served == ["b0.0", "b0.1", "b1.0", "a1", "b1.1", "a2", "b2.0", "a3"]


def test_weights_share_the_seats_two_to_one_while_both_wait() -> None:
    queue: FairQueue[str] = FairQueue(quantum=2)
    heavy = Tenant("A", weight=2.0)
    queue.put(heavy, [("a", 1.0)] * 30)
    queue.put(B, [("b", 1.0)] * 30)  # A waits too: B is not sparse, both take turns
    head = drain(queue)[:30]
    assert head.count("a") == 20 and head.count("b") == 10


def test_one_tenant_alone_is_first_in_first_out_whatever_the_costs() -> None:
    queue: FairQueue[int] = FairQueue(quantum=1)
    queue.put(A, [(i, float(cost)) for i, cost in enumerate([5, 1, 9, 2])])
    assert drain(queue) == [0, 1, 2, 3]
    assert queue.queued == 0 and len(queue) == 0


def test_discard_close_and_the_counts() -> None:
    queue: FairQueue[str] = FairQueue(quantum=1)
    entries = queue.put(A, [("x", 2.0), ("y", 3.0)])
    queue.put(B, [("z", 1.0)])
    assert queue.queued == 6 and len(queue) == 3
    assert queue.queued_by_tenant() == {"A": 5.0, "B": 1.0}
    assert queue.discard(entries[0]) and not queue.discard(entries[0])
    assert queue.queued == 4 and queue.queued_by_tenant() == {"A": 3.0, "B": 1.0}
    assert sorted(queue.close()) == ["y", "z"]
    assert queue.queued == 0 and queue.pop() is None and queue.take(5) is None  # no wait
    with pytest.raises(NotRunningError, match="the queue is closed"):
        queue.put(A, [("late", 1.0)])


def test_take_waits_for_work_from_another_thread_and_for_close() -> None:
    queue: FairQueue[str] = FairQueue(quantum=1)
    began = time.monotonic()
    assert queue.take(0.05) is None and time.monotonic() - began >= 0.05
    got: list[str | None] = []
    takers = [threading.Thread(target=lambda: got.append(queue.take())) for _ in range(2)]
    for taker in takers:
        taker.start()
    queue.put(A, [("job", 1.0)])
    time.sleep(0.05)
    queue.close()  # the other taker wakes with None
    for taker in takers:
        taker.join(5)
    assert sorted(got, key=str) == [None, "job"]


# --------------------------------------------------------------------------- seats


def test_seats_go_in_fair_order_and_a_cancelled_wait_leaves_the_queue() -> None:
    async def main() -> list[str]:
        seats = Seats(1, quantum=1)
        order: list[str] = []
        gate = asyncio.Event()

        async def piece(tenant: Tenant, name: str) -> None:
            async with seats.seat(tenant):
                order.append(name)
                await gate.wait()

        flood = [asyncio.create_task(piece(A, f"a{i}")) for i in range(6)]
        await asyncio.sleep(0.01)
        light = asyncio.create_task(piece(B, "b"))
        gone = asyncio.create_task(piece(C, "c"))
        await asyncio.sleep(0.01)
        assert seats.taken == 1 and seats.waiting == 7
        gone.cancel()
        await asyncio.gather(gone, return_exceptions=True)
        assert seats.waiting == 6 and seats.queued_by_tenant() == {"A": 5.0, "B": 1.0}
        gate.set()
        await asyncio.gather(*flood, light)
        assert seats.taken == 0 and seats.waiting == 0
        return order

    assert run(main()) == ["a0", "b", "a1", "a2", "a3", "a4", "a5"]


def test_a_piece_larger_than_what_is_free_goes_whole_and_waits_its_turn() -> None:
    async def main() -> None:
        seats = Seats(4)
        granted: list[int] = []
        first = seats.ask(A, lambda: granted.append(3), size=3)
        big = seats.ask(A, lambda: granted.append(6), size=6)  # 3 taken < 4: goes
        third = seats.ask(A, lambda: granted.append(1), size=1)  # 9 taken: waits
        assert granted == [3, 6] and seats.taken == 9 and seats.waiting == 1
        seats.release(first)
        assert granted == [3, 6] and seats.taken == 6  # still 6 >= 4
        seats.release(big)
        seats.release(big)  # once only
        assert granted == [3, 6, 1] and seats.taken == 1
        seats.release(third)
        assert seats.taken == 0

    run(main())


def test_closed_seats_fail_their_waiters_and_refuse_new_ones() -> None:
    async def main() -> None:
        seats = Seats(1, closed="the engine stopped")
        holder = seats.ask(A, lambda: None)
        waiter = asyncio.create_task(_hold(seats, B))
        await asyncio.sleep(0.01)
        seats.close()
        with pytest.raises(NotRunningError, match="the engine stopped"):
            await waiter
        with pytest.raises(NotRunningError):
            await _hold(seats, B)
        seats.release(holder)
        assert seats.taken == 0

    run(main())


async def _hold(seats: Seats, tenant: Tenant) -> None:
    async with seats.seat(tenant):
        pass


def test_a_seat_freed_on_another_thread_wakes_the_waiter_on_its_loop() -> None:
    async def main() -> float:
        seats = Seats(1)
        holder = seats.ask(A, lambda: None)
        timer = threading.Timer(0.1, seats.release, args=(holder,))
        began = time.monotonic()
        timer.start()
        async with seats.seat(B):
            waited = time.monotonic() - began
        timer.join()
        return waited

    assert 0.09 <= run(main()) < 5


# --------------------------------------------------------------------------- admission


def test_admission_limit_share_and_retry_after() -> None:
    admission = Admission(10, unit="runs")
    limited = Tenant("A", queue_share=0.3)  # 3 runs
    admission.admit(limited, 2)
    with pytest.raises(TenantLimitError, match="has 2 runs queued, its share of the queue is 3"):
        admission.admit(limited, 2)
    with pytest.raises(QueueFullError) as full:
        admission.admit(B, 9)
    assert full.value.retry_after == 1.0  # nothing measured yet
    admission.finished(1, now=100.0)
    admission.finished(4, now=101.0)  # 4 runs/s
    with pytest.raises(QueueFullError) as full:
        admission.admit(B, 10)
    assert full.value.retry_after == pytest.approx(0.5)  # 2 over at 4/s
    admission.learn(1, 100.0)  # a pass of 0.01/s: 0.8 * 4 + 0.2 * 0.01
    assert admission.rate == pytest.approx(3.202)
    with pytest.raises(QueueFullError) as full:
        admission.admit(B, 1000)
    assert full.value.retry_after == MAX_RETRY_AFTER
    assert admission.queued == 2 and admission.queued_by_tenant() == {"A": 2}
    with admission.admitted(B, 3):
        assert admission.queued_by_tenant() == {"A": 2, "B": 3}
    assert admission.queued == 2


def test_admitted_releases_on_failure_without_counting_it_finished() -> None:
    admission = Admission(5)
    with pytest.raises(RuntimeError), admission.admitted(A, 5):
        raise RuntimeError("boom")
    assert admission.queued == 0 and admission.rate is None
    admission.admit(A, 5)  # the whole queue again
