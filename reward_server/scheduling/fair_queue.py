"""The one fair queue in front of every executor but the micro-batcher: work of every tenant
waiting for a seat (a worker process, a sandbox slot, a connection, room in vLLM), taken in
one fair order.

A scheduler puts its work in as entries, each with the tenant that sent it and its cost (the
scheduler's unit: tokens, items, tests, calls); whoever has a free seat takes the next entry
(:meth:`FairQueue.take`, blocking, for worker threads; :meth:`FairQueue.pop`, for
:class:`~reward_server.scheduling.seats.Seats`). Which entry is next:

* **a sparse tenant first**: work that arrives to an empty queue from a tenant that has been
  served less than every backlogged tenant lately (per unit of weight: :class:`Served`) goes
  first, up to ``burst * weight`` of cost, so a light tenant's request waits for a seat to
  free, not for the backlog of a tenant flooding the server (fair queueing's new-flow rule,
  as FQ-CoDel's). A tenant that sends one request after another without pause cannot use
  it to take more than its share: once it has been served as much as the others lately, it
  waits for turns like anyone.
* **else turns**: deficit round robin over the tenants with work
  (:class:`~reward_server.scheduling.fairness.DeficitRoundRobin`, ``quantum * weight`` a
  turn), so backlogged tenants share the seats in proportion to their weights, whatever the
  sizes of their entries.

Thread-safe (one lock): a verifier pool's worker threads take work that requests on the
event loop put in. Cancelling is explicit (:meth:`FairQueue.discard`: the entry leaves the
queue at once), closing drains it (:meth:`FairQueue.close`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from reward_server.config.tenants import Tenant
from reward_server.errors import NotRunningError
from reward_server.scheduling.fairness import DeficitRoundRobin, Served

__all__ = ["Entry", "FairQueue"]

T = TypeVar("T")


@dataclass(eq=False, slots=True)
class Entry(Generic[T]):
    """One piece of work waiting in the queue: its value, its cost, whose it is."""

    value: T
    cost: float
    tenant: str


@dataclass(eq=False, slots=True)
class _Flow(Generic[T]):
    """One tenant's entries, oldest first, and what it has been served lately."""

    tenant: Tenant  # its latest record (weight)
    entries: deque[Entry[T]] = field(default_factory=deque)
    cost: float = 0.0  # of its entries
    served: Served = field(default_factory=Served)
    allowance: float = 0.0  # cost it may still take first, while a sparse tenant


class FairQueue(Generic[T]):
    """Entries of every tenant, taken in fair order (see the module docstring).

    ``quantum``: a turn's cost per unit of weight; ``burst``: what a sparse tenant may take
    first per unit of weight (default: ``quantum``); ``closed_message``: the
    :class:`~reward_server.errors.NotRunningError` of a put after :meth:`close`.
    """

    def __init__(
        self,
        quantum: float,
        *,
        burst: float | None = None,
        closed_message: str = "the queue is closed",
    ) -> None:
        self._drr = DeficitRoundRobin(quantum)
        self.burst = quantum if burst is None else burst
        if self.burst <= 0:
            raise ValueError("burst must be positive")
        self.closed_message = closed_message
        self._cond = threading.Condition()
        self._flows: dict[str, _Flow[T]] = {}
        self._sparse: deque[str] = deque()  # sparse tenants, next first
        self.closed = False  # set by close(): puts are refused, takes do not wait
        self._cost = 0.0
        self._count = 0

    # -- state ---------------------------------------------------------------------------

    @property
    def queued(self) -> float:
        """The cost of the entries waiting."""
        return self._cost

    def __len__(self) -> int:
        return self._count

    def queued_by_tenant(self) -> dict[str, float]:
        """The cost of the entries waiting, by tenant (tenants with none left out)."""
        with self._cond:
            return {name: flow.cost for name, flow in self._flows.items() if flow.entries}

    # -- putting in and taking out ---------------------------------------------------------

    def put(self, tenant: Tenant, work: Sequence[tuple[T, float]]) -> list[Entry[T]]:
        """Queue ``work`` (values and their costs) of ``tenant``, in order, at the end of its
        queue; NotRunningError once closed. The entries are the handles to discard them."""
        with self._cond:
            if self.closed:
                raise NotRunningError(self.closed_message)
            flow = self._flows.get(tenant.name)
            if flow is None:
                flow = self._flows[tenant.name] = _Flow(tenant)
            flow.tenant = tenant  # a reloaded keys file may have changed its weight
            arrived = not flow.entries
            entries = [Entry(value, cost, tenant.name) for value, cost in work]
            flow.entries.extend(entries)
            added = sum(entry.cost for entry in entries)
            flow.cost += added
            self._cost += added
            self._count += len(entries)
            if arrived and entries:
                self._arrive(flow)
            self._cond.notify(len(entries))
        return entries

    def _arrive(self, flow: _Flow[T]) -> None:
        """A tenant's work arrived to its empty queue: sparse, or its turn in the ring."""
        name = flow.tenant.name
        if self._drr.holds(name) or name in self._sparse:
            return
        if self._goes_first(flow):
            flow.allowance = self.burst * flow.tenant.weight
            self._sparse.append(name)
        else:
            self._drr.wake(name)

    def _goes_first(self, flow: _Flow[T]) -> bool:
        """Whether ``flow`` has been served less lately, per unit of weight, than every
        tenant waiting for its turn (False when none waits: its turn comes at once)."""
        now = time.monotonic()
        own = flow.served.recent(now) / flow.tenant.weight
        others = [
            other
            for name, other in self._flows.items()
            if other is not flow and other.entries and self._drr.holds(name)
        ]
        return bool(others) and all(
            own < other.served.recent(now) / other.tenant.weight for other in others
        )

    def pop(self) -> T | None:
        """The next entry's value in fair order (None: nothing waits)."""
        with self._cond:
            entry = self._next()
            return None if entry is None else entry.value

    def take(self, timeout: float | None = None) -> T | None:
        """The next entry's value, waiting up to ``timeout`` seconds (None: until one comes)
        for one; None when none came in time or the queue is closed and empty."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                entry = self._next()
                if entry is not None:
                    return entry.value
                if self.closed:
                    return None
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)

    def discard(self, entry: Entry[T]) -> bool:
        """Take ``entry`` out if it still waits (True); False when it was taken already."""
        with self._cond:
            flow = self._flows.get(entry.tenant)
            if flow is None:
                return False
            try:
                flow.entries.remove(entry)
            except ValueError:
                return False
            self._drop(flow, entry)
            if not flow.entries and entry.tenant in self._sparse:
                self._sparse.remove(entry.tenant)
                flow.allowance = 0.0
            return True

    def close(self) -> list[T]:
        """Refuse new entries, wake every waiting :meth:`take`; the values still queued."""
        with self._cond:
            self.closed = True
            left = [entry.value for flow in self._flows.values() for entry in flow.entries]
            for flow in self._flows.values():
                flow.entries.clear()
                flow.cost = 0.0
            self._cost, self._count = 0.0, 0
            self._sparse.clear()
            self._cond.notify_all()
        return left

    # -- the order (under the lock) ----------------------------------------------------------

    def _next(self) -> Entry[T] | None:
        """Take the next entry out: a sparse tenant's, else the turn's."""
        while self._sparse:
            name = self._sparse.popleft()
            flow = self._flows[name]
            head = flow.entries[0]  # a sparse tenant has work: it leaves the list once not
            if head.cost > flow.allowance:
                # Its allowance is spent: turns from now on, like anyone with a backlog.
                flow.allowance = 0.0
                self._drr.wake(name)
                continue
            flow.allowance -= head.cost
            entry = self._take_head(flow)
            if flow.entries:
                self._sparse.append(name)  # sparse tenants take one entry each in turn
            else:
                flow.allowance = 0.0  # its next work is judged afresh when it comes
            return entry
        return self._next_in_turn()

    def _next_in_turn(self) -> Entry[T] | None:
        drr = self._drr
        while True:
            name = drr.current
            if name is None:
                name = drr.begin(self._head_cost, self._weight)
                if name is None:
                    return None
            head = self._head_cost(name)
            if head is None or not drr.charge(name, head):
                drr.end(name, head is not None)
                continue
            return self._take_head(self._flows[name])

    def _head_cost(self, name: str) -> float | None:
        flow = self._flows.get(name)
        return flow.entries[0].cost if flow is not None and flow.entries else None

    def _weight(self, name: str) -> float:
        return self._flows[name].tenant.weight

    def _take_head(self, flow: _Flow[T]) -> Entry[T]:
        entry = flow.entries.popleft()
        self._drop(flow, entry)
        flow.served.add(entry.cost, time.monotonic())
        return entry

    def _drop(self, flow: _Flow[T], entry: Entry[T]) -> None:
        flow.cost -= entry.cost
        self._cost -= entry.cost
        self._count -= 1
