"""Seats: how many pieces of one executor's work may run at once (worker slots, sandbox slots,
connections to a remote service, rows inside vLLM), and the one fair queue in front of them.

A piece of work asks for a seat (:meth:`Seats.seat`, an async context manager, or
:meth:`Seats.ask` with a callback), waits in the
:class:`~reward_server.scheduling.fair_queue.FairQueue` with its tenant and cost, and is
granted a seat when one is free and its turn has come; it gives the seat back when done
(:meth:`Seats.release`), which grants the next. A piece occupies ``size`` seats (vLLM's rows;
1 elsewhere): a piece is granted while fewer than ``capacity`` seats are taken, so one larger
than what is free still goes whole once its turn comes. Cancelling a waiting piece takes it
out of the queue (nothing waits behind a request that ended, or one past its deadline).

Thread-safe: pieces may ask on one event loop and be granted from another thread (a grant
wakes its waiter on the waiter's own loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from reward_server.config.tenants import Tenant
from reward_server.errors import NotRunningError
from reward_server.scheduling.fair_queue import Entry, FairQueue

__all__ = ["Seat", "Seats"]


@dataclass(eq=False, slots=True)
class Seat:
    """One piece's claim: waiting, then granted (its seats taken) until released."""

    size: int
    on_grant: Callable[[], None]
    granted: bool = False
    released: bool = False
    entry: Entry[Seat] | None = field(default=None, repr=False)


class Seats:
    """``capacity`` seats and the fair queue in front of them (see the module docstring).

    ``quantum`` and ``burst``: the queue's turn and a sparse tenant's first helping, per unit
    of weight, in the pieces' cost; ``closed``: the message of the NotRunningError a piece
    gets once the seats are closed.
    """

    def __init__(
        self,
        capacity: int,
        *,
        quantum: float = 1.0,
        burst: float | None = None,
        closed: str = "closed",
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self.closed_message = closed
        self._queue: FairQueue[Seat] = FairQueue(quantum, burst=burst, closed_message=closed)
        self._lock = threading.Lock()
        self.taken = 0  # seats taken now

    @property
    def waiting(self) -> int:
        """Pieces waiting for a seat."""
        return len(self._queue)

    def queued_by_tenant(self) -> dict[str, float]:
        """The cost waiting for a seat, by tenant."""
        return self._queue.queued_by_tenant()

    def ask(
        self, tenant: Tenant, on_grant: Callable[[], None], *, cost: float = 1.0, size: int = 1
    ) -> Seat:
        """Queue a piece of ``tenant``'s work; ``on_grant`` is called (on whichever thread
        frees a seat, or here) once it has its seats. NotRunningError once closed."""
        seat = Seat(size, on_grant)
        with self._lock:
            [seat.entry] = self._queue.put(tenant, [(seat, cost)])
        self._grant()
        return seat

    def cancel(self, seat: Seat) -> bool:
        """Take a waiting piece out of the queue (True). False when it was granted already:
        its seats are then the caller's to release."""
        with self._lock:
            if seat.granted:
                return False
            assert seat.entry is not None
            self._queue.discard(seat.entry)
            seat.released = True
            return True

    def release(self, seat: Seat) -> None:
        """Give a granted piece's seats back (once) and grant the next pieces."""
        with self._lock:
            if not seat.granted or seat.released:
                return
            seat.released = True
            self.taken -= seat.size
        self._grant()

    def close(self) -> None:
        """Refuse new pieces; the waiting ones are never granted (their waiters see
        NotRunningError through :meth:`seat`; a callback's owner fails its own)."""
        with self._lock:
            left = self._queue.close()
        for seat in left:
            seat.released = True
            seat.on_grant()

    def _grant(self) -> None:
        granted: list[Seat] = []
        with self._lock:
            while self.taken < self.capacity:
                seat = self._queue.pop()
                if seat is None:
                    break
                seat.granted = True
                self.taken += seat.size
                granted.append(seat)
        for seat in granted:
            seat.on_grant()

    @contextlib.asynccontextmanager
    async def seat(
        self, tenant: Tenant, *, cost: float = 1.0, size: int = 1
    ) -> AsyncIterator[None]:
        """Hold ``size`` seats for the block, after waiting for them in fair order;
        cancelling the wait takes the piece out of the queue (a request's deadline ends its
        work this way); NotRunningError when the seats are closed."""
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()

        def wake() -> None:
            loop.call_soon_threadsafe(_resolve, ready)

        seat = self.ask(tenant, wake, cost=cost, size=size)
        try:
            await ready
        except BaseException:
            if not self.cancel(seat):
                self.release(seat)
            raise
        if not seat.granted:  # closed while it waited
            raise NotRunningError(self.closed_message)
        try:
            yield
        finally:
            self.release(seat)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
