"""The micro-batcher's waiting room: one queue of items per tenant, and whose turn is next.

:class:`~reward_server.scheduling.batcher.Batcher` hands each admitted submit to
:meth:`TenantQueues.add`, which makes it a :class:`Request` (the future its caller awaits)
and queues one :class:`Item` per row at the end of the tenant's queue. The batcher's consumer
takes items back out as a :class:`Window` of one tenant: either the tenant served alone,
gathered by the batcher's own waiting rules through :meth:`TenantQueues.pop_live` and
:meth:`TenantQueues.take`, or, while several tenants have work, one fair turn
(:meth:`TenantQueues.turn`: deficit round robin on tokens,
:class:`~reward_server.scheduling.fairness.DeficitRoundRobin`), so backlogged tenants share the
passes in proportion to their weights. Results go back through :meth:`Item.deliver`.

Plain data structures used on the event loop's thread only: no awaits and no locks. Items
whose request has already ended (failed, cancelled) stay in their queue until they reach
its head, where :meth:`TenantQueues.head` drops them, so ending a request costs O(1).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from reward_server.config.tenants import Tenant
from reward_server.scheduling.fairness import DeficitRoundRobin, Served

__all__ = ["Item", "Request", "TenantQueues", "Window"]


@dataclass(eq=False, slots=True)
class Request:
    """One submit call: its future, results so far, and items not yet started."""

    future: asyncio.Future[list[Any]]
    results: list[Any]
    remaining: int  # items without a result yet
    unstarted: int  # items admitted whose micro-batch has not started
    tenant: str  # the name of the tenant that submitted it


@dataclass(eq=False, slots=True)
class Item:
    """One row of a request, waiting in the queue."""

    ids: Sequence[int]
    length: int
    request: Request
    index: int
    enqueued: float = field(default=0.0)
    seq: int = 0  # arrival order, to put unstarted items back where they were

    def deliver(self, value: Any) -> None:
        """Put this row's result in its request; complete the request once it has all."""
        req = self.request
        if req.future.done():
            return
        req.results[self.index] = value
        req.remaining -= 1
        if req.remaining == 0:
            req.future.set_result(req.results)


@dataclass(eq=False, slots=True)
class Window:
    """Items taken together to be sorted and cut into micro-batches."""

    items: list[Item]
    tenant: str  # whose turn (the only tenant of the window)
    contended: bool  # formed as a fair turn while several tenants had work


@dataclass(eq=False, slots=True)
class _TenantQueue:
    """One tenant's waiting items, oldest first, and its latest record (weight, limits)."""

    tenant: Tenant
    items: deque[Item] = field(default_factory=deque)
    tokens: int = 0  # of the items in ``items``
    last_submit: float = 0.0  # monotonic time of its latest submit
    served: Served = field(default_factory=Served)  # tokens served lately

    # Arrived to an empty queue while none of its work was running, and not served since:
    # a sparse tenant's request (see TenantQueues.gives_way).
    fresh: bool = False

    def recent(self, now: float) -> float:
        """Tokens served lately, decayed to ``now``."""
        return self.served.recent(now)

    def popleft(self) -> Item:
        item = self.items.popleft()
        self.tokens -= item.length
        return item


class TenantQueues:
    """Each tenant's waiting items, oldest first, and the deficit round robin over them.

    A turn is worth ``quantum`` tokens per unit of a tenant's weight (the batcher gives one
    micro-batch's token budget). Tenants are known by name; each queue keeps the tenant's
    latest record, so a keys file reloaded with a new weight takes effect at the next submit.
    """

    def __init__(self, quantum: int) -> None:
        self._queues: dict[str, _TenantQueue] = {}  # by tenant name
        self._drr = DeficitRoundRobin(quantum=quantum)
        self._seq = itertools.count()

    def add(self, tenant: Tenant, rows: Sequence[Sequence[int]], now: float) -> Request:
        """Queue ``rows`` (one admitted submit, not empty) at the end of ``tenant``'s queue,
        which joins the ring; the request whose future will hold their results, in order."""
        n = len(rows)
        request = Request(
            future=asyncio.get_running_loop().create_future(),
            results=[math.nan] * n,
            remaining=n,
            unstarted=n,
            tenant=tenant.name,
        )
        queue = self._queues.get(tenant.name)
        if queue is None:
            queue = self._queues[tenant.name] = _TenantQueue(tenant)
        queue.tenant = tenant  # a reloaded keys file may have changed its weight
        if self._drr.current != tenant.name and self.head(tenant.name) is None:
            queue.fresh = True
        queue.last_submit = now
        queue.items.extend(
            Item(
                ids=ids,
                length=len(ids),
                request=request,
                index=i,
                enqueued=now,
                seq=next(self._seq),
            )
            for i, ids in enumerate(rows)
        )
        queue.tokens += sum(len(ids) for ids in rows)
        self._drr.wake(tenant.name)
        return request

    def drain(self) -> Iterator[Item]:
        """Take every queued item out (live or not), tenant by tenant, oldest first."""
        for queue in self._queues.values():
            while queue.items:
                yield queue.popleft()

    def head(self, name: str) -> int | None:
        """Tokens of tenant ``name``'s next live item (dropping dead ones), or None."""
        queue = self._queues.get(name)
        if queue is None:
            return None
        while queue.items:
            item = queue.items[0]
            if not item.request.future.done():
                return item.length
            queue.popleft()
        return None

    def pop_live(self, name: str) -> Item | None:
        """Tenant ``name``'s next queued item whose request is still waiting, or None."""
        if self.head(name) is None:
            return None
        return self._queues[name].popleft()

    def with_work(self) -> list[str]:
        """Names of the tenants with live items queued."""
        return [name for name in self._queues if self.head(name) is not None]

    def others_have_work(self, name: str) -> bool:
        """True when a tenant other than ``name`` has live items queued."""
        return any(other != name and self.head(other) is not None for other in self._queues)

    def weight(self, name: str) -> float:
        """Tenant ``name``'s weight, from its latest record."""
        return self._queues[name].tenant.weight

    def put_back(self, name: str, items: list[Item]) -> None:
        """Return unstarted items to the front of their tenant's queue, in arrival order."""
        queue = self._queues[name]
        queue.items.extendleft(sorted(items, key=lambda it: it.seq, reverse=True))
        queue.tokens += sum(it.length for it in items)

    def take(self, name: str, window: list[Item], max_rows: int, max_tokens: int) -> None:
        """Add tenant ``name``'s waiting live items to ``window``, oldest first, while it
        holds fewer than ``max_rows`` items and ``max_tokens`` tokens (the last may pass it)."""
        tokens = sum(it.length for it in window)
        while len(window) < max_rows and tokens < max_tokens:
            item = self.pop_live(name)
            if item is None:
                break
            window.append(item)
            tokens += item.length

    def serve(self, name: str) -> None:
        """Start a turn of ``name``, the only tenant with work (no credit is spent)."""
        self._drr.serve(name)
        self._queues[name].fresh = False

    def turn(self, max_rows: int) -> Window:
        """The next tenant's turn of deficit round robin: its items while its credit covers
        them, at most ``max_rows``. Only while several tenants have work."""
        name = self._drr.begin(self.head, self.weight)
        assert name is not None  # called only while several tenants have work
        self._queues[name].fresh = False
        window: list[Item] = []
        while len(window) < max_rows:
            head = self.head(name)
            if head is None or not self._drr.charge(name, head):
                break
            item = self.pop_live(name)
            assert item is not None
            window.append(item)
        return Window(window, name, contended=True)

    def backlog(self, name: str) -> int:
        """Tokens of tenant ``name``'s queued items (items of requests that ended early
        count until they reach the head, where they are dropped)."""
        queue = self._queues.get(name)
        return 0 if queue is None else queue.tokens

    def note_served(self, name: str, tokens: int, now: float) -> None:
        """Count ``tokens`` of tenant ``name`` run in a pass that started at ``now``."""
        queue = self._queues.get(name)
        if queue is not None:
            queue.served.add(tokens, now)

    def others_recent(self, name: str, since: float) -> bool:
        """True when a tenant other than ``name`` has submitted since ``since``."""
        return any(
            other != name and queue.last_submit >= since for other, queue in self._queues.items()
        )

    def turn_tokens(self, name: str) -> float:
        """One fair turn of tenant ``name``: the quantum times its weight, tokens."""
        return self._drr.quantum * self.weight(name)

    def gives_way(self, window: Window, remaining: list[Item]) -> bool:
        """Whether ``window``, with ``remaining`` of its items not started, should stop
        before its next pass and put them back (a pass boundary is the only place to stop).

        Two reasons. A window formed while its tenant was alone gives way to any tenant that
        arrived once it has run one fair turn's tokens: fair turns follow. And a *sparse* tenant
        (one whose work arrived to an empty queue, has not been served since, fits in one
        fair turn of its own, and has lately been served fewer tokens per unit of weight
        than the running tenant) goes first at the next pass boundary, unless the running
        tenant is within one turn too and has less left to run (weighted
        shortest-remaining-first: the two never preempt each other back and forth). So a
        light tenant's request waits for one pass of a flooding tenant's work, not for a
        whole window or turn of it (fair queueing's sparse-flow rule; a flooding tenant's
        queue never empties, so it is never sparse), and a tenant that sends one small
        request after another without pause cannot use the rule to take more than its
        share: once it has had as much as the other lately, it waits for turns like anyone.
        """
        name = window.tenant
        others = [other for other in self.with_work() if other != name]
        if not others or not remaining:
            return False
        left = sum(it.length for it in remaining)
        ran = sum(it.length for it in window.items) - left
        if not window.contended and ran >= self.turn_tokens(name):
            return True  # a window formed alone has had one fair turn: turns follow
        own_weight = self.weight(name)
        running_sparse = left + self.backlog(name) <= self.turn_tokens(name)
        now = time.monotonic()
        own_recent = self._queues[name].recent(now) / own_weight
        for other in others:
            queue = self._queues[other]
            backlog = self.backlog(other)
            if not queue.fresh or backlog > self.turn_tokens(other):
                continue
            if queue.recent(now) / queue.tenant.weight >= own_recent:
                continue
            if not running_sparse or backlog / self.weight(other) < left / own_weight:
                return True
        return False

    def give_way(self, window: Window, remaining: list[Item]) -> None:
        """Put ``remaining`` back at the front of the window's tenant's queue; a fair turn
        gets back the credit they were charged."""
        self.put_back(window.tenant, remaining)
        if window.contended:
            self._drr.refund(window.tenant, sum(it.length for it in remaining))

    def end_turn(self, name: str) -> None:
        """End ``name``'s turn: back in the ring if it still has work, else out of it."""
        self._drr.end(name, self.head(name) is not None)
