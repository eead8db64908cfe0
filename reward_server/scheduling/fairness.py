"""Sharing one server between tenants: the turn order of weighted fair queueing, admission
(the queue limit, tenant shares, rate limits and one Retry-After) and the rate limits' token
buckets.

Plain data structures with no asyncio and no HTTP, shared by every scheduler: the
micro-:class:`~reward_server.scheduling.batcher.Batcher` (items, forward passes), and the
:class:`~reward_server.scheduling.fair_queue.FairQueue` in front of every other executor's
seats (vLLM's hand-off, verifier workers, sandbox slots, connections to a remote service).
Tenants are told apart by name, so a keys file reloaded with new weights or limits keeps each
tenant's place in the queues and the tokens in its bucket.

* :class:`DeficitRoundRobin`: whose work goes next. Each tenant with work waits in a ring;
  on its turn it is credited ``quantum * weight`` (tokens, items, calls: the scheduler's cost)
  and may send work while its credit (the deficit) covers the next entry's cost (Shreedhar
  and Varghese's deficit round robin), so backlogged tenants get service in proportion to
  their weights, whatever the sizes of their requests, and a tenant that arrives waits for
  at most one turn of each other tenant.
* :class:`Served`: what a tenant has been served lately (a decaying sum), for the sparse
  tenant's rule of both schedulers: work that arrives to an empty queue from a tenant served
  less than the others lately goes first.
* :class:`TokenBuckets`: one bucket per tenant with a ``tokens_per_s`` limit. One set per
  app (the registry makes it and hands it to every served model's scheduler), so a tenant's
  limit holds across the models it scores against, and two apps in one process (tests, Ray
  Serve replicas) never share a bucket.
* :class:`Admission`: admission of one scheduler, all or nothing: its queue limit
  (:class:`~reward_server.errors.QueueFullError`), then the tenant's share of it and its
  rate limit (:class:`~reward_server.errors.TenantLimitError`), each with a Retry-After from
  the rate the scheduler measures (:meth:`Admission.learn`, :meth:`Admission.finished`).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from reward_server.config.tenants import Tenant
from reward_server.errors import QueueFullError, TenantLimitError

__all__ = [
    "MAX_RETRY_AFTER",
    "MIN_RETRY_AFTER",
    "RECENT_S",
    "Admission",
    "DeficitRoundRobin",
    "Served",
    "TokenBuckets",
]

#: Bounds of a Retry-After estimate, seconds.
MIN_RETRY_AFTER = 0.1
MAX_RETRY_AFTER = 30.0

#: The time scale of "lately" for what a tenant has been served (the sparse tenant's rule)
#: and, in the micro-batcher, for "another tenant is about", seconds.
RECENT_S = 2.0

#: The weight of a new measurement in a scheduler's moving average of its rate.
RATE_SMOOTHING = 0.2

#: A rate-limited tenant may send this many seconds' worth of tokens at once (its bucket's
#: size), so a client that waited is not held to a trickle.
BURST_SECONDS = 1.0


class DeficitRoundRobin:
    """The turn order of tenants with work: deficit round robin on tokens.

    The scheduler keeps the queues; this keeps whose turn it is and each tenant's credit.
    :meth:`wake` puts a tenant that has work in the ring (at the end: it waits for one turn
    of each tenant before it); :meth:`begin` ends at the next tenant whose head entry its
    credit covers, crediting each tenant it visits ``quantum * weight``; :meth:`charge` takes
    an entry's tokens from the credit of the tenant being served; :meth:`end` finishes the
    turn (back to the end of the ring if it still has work, else its credit is dropped: a
    tenant cannot save credit while idle). :meth:`serve` starts a turn without credit, for
    a tenant served alone.
    """

    def __init__(self, quantum: float) -> None:
        if quantum <= 0:
            raise ValueError("quantum must be positive")
        self.quantum = quantum
        self._ring: deque[str] = deque()
        self._deficit: dict[str, float] = {}
        self.current: str | None = None  # the tenant being served (out of the ring)

    def wake(self, name: str) -> None:
        """``name`` has work: join the ring unless it is there or being served."""
        if name != self.current and name not in self._ring:
            self._ring.append(name)

    def waiting(self) -> list[str]:
        """Tenants in the ring, next turn first."""
        return list(self._ring)

    def holds(self, name: str) -> bool:
        """Whether ``name`` is in the ring or being served."""
        return name == self.current or name in self._ring

    def deficit(self, name: str) -> float:
        """``name``'s unspent credit, tokens."""
        return self._deficit.get(name, 0.0)

    def begin(
        self, head_tokens: Callable[[str], int | None], weight: Callable[[str], float]
    ) -> str | None:
        """Start the next turn: the next tenant in the ring whose head entry (``head_tokens``:
        its tokens, None when the tenant has no work left) its credit covers; None when no
        tenant has work. Tenants passed over keep their credit and go to the end."""
        # Credit per visit is at least a quantum's share; a head larger than that is served
        # after enough visits (at most head / (quantum * weight) rounds, skipped at once below).
        while self._ring:
            name = self._ring.popleft()
            head = head_tokens(name)
            if head is None:
                self._deficit.pop(name, None)
                continue
            credit = self.quantum * max(weight(name), 1e-9)
            have = self._deficit.get(name, 0.0) + credit
            if head > have and not self._ring:
                # Alone in the ring: nobody else to wait for, so credit every round at once.
                have += math.ceil((head - have) / credit) * credit
            self._deficit[name] = have
            if head <= have:
                self.current = name
                return name
            self._ring.append(name)
        return None

    def serve(self, name: str) -> None:
        """Start a turn of ``name`` without crediting it (it is the only tenant with work)."""
        if name in self._ring:
            self._ring.remove(name)
        self.current = name

    def charge(self, name: str, tokens: int) -> bool:
        """Take ``tokens`` from ``name``'s credit if it covers them; False (nothing taken)
        if not."""
        have = self._deficit.get(name, 0.0)
        if tokens > have:
            return False
        self._deficit[name] = have - tokens
        return True

    def refund(self, name: str, tokens: int) -> None:
        """Give back credit for entries charged but put back in the queue."""
        self._deficit[name] = self._deficit.get(name, 0.0) + tokens

    def end(self, name: str, has_work: bool) -> None:
        """End ``name``'s turn: to the end of the ring with its credit, or out of it."""
        if self.current == name:
            self.current = None
        if has_work:
            self.wake(name)
        else:
            self._deficit.pop(name, None)


@dataclass(slots=True)
class Served:
    """What one tenant has been served lately: a sum that decays by e every ``RECENT_S``."""

    amount: float = 0.0
    at: float = 0.0  # monotonic time of the last update

    def recent(self, now: float) -> float:
        """The amount served lately, decayed to ``now``."""
        return self.amount * math.exp(-(now - self.at) / RECENT_S)

    def add(self, amount: float, now: float) -> None:
        """Count ``amount`` served at ``now``."""
        self.amount = self.recent(now) + amount
        self.at = now


class TokenBuckets:
    """One token bucket per rate-limited tenant, by name (thread-safe: every served model's
    scheduler takes from the same bucket)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._level: dict[str, tuple[float, float]] = {}  # name -> (tokens, at)

    def take(self, tenant: Tenant, tokens: int) -> float:
        """Take ``tokens`` from ``tenant``'s bucket: 0.0 when taken, else the seconds until
        the bucket holds them (nothing taken). A tenant without a limit always gets 0.0.

        The bucket holds at most ``BURST_SECONDS`` of the rate; a request larger than that
        is admitted once the bucket is full and leaves it in debt, so the tenant's average
        rate still holds.
        """
        rate = tenant.tokens_per_s
        if rate is None:
            return 0.0
        size = rate * BURST_SECONDS
        with self._lock:
            now = self._clock()
            level, at = self._level.get(tenant.name, (size, now))
            level = min(size, level + (now - at) * rate)
            need = min(float(tokens), size)
            if level < need:
                self._level[tenant.name] = (level, now)
                return (need - level) / rate
            self._level[tenant.name] = (level - tokens, now)
            return 0.0

    def level(self, tenant: Tenant) -> float | None:
        """Tokens in ``tenant``'s bucket now (None without a limit)."""
        rate = tenant.tokens_per_s
        if rate is None:
            return None
        with self._lock:
            now = self._clock()
            level, at = self._level.get(tenant.name, (rate * BURST_SECONDS, now))
            return min(rate * BURST_SECONDS, level + (now - at) * rate)


@dataclass(slots=True)
class _Share:
    queued: int  # admitted units not finished (or not started: the scheduler says which)
    weight: float  # the tenant's weight at its latest admission


class Admission:
    """Admission of one scheduler: at most ``max_queue`` units (rows, items, runs) admitted
    and not done, a tenant with a ``queue_share`` at most its share of them, a tenant with a
    ``tokens_per_s`` limit within its rate; every refusal a
    :class:`~reward_server.errors.QueueFullError` (a tenant's own limit: its
    :class:`~reward_server.errors.TenantLimitError`) with a Retry-After from the rate the
    scheduler measures. ``unit`` names what is counted, in messages.

    Not thread-safe: each scheduler admits on its own event loop. What "done" means is the
    scheduler's: the micro-batcher releases an item when its pass starts, the others when
    the work is finished.
    """

    def __init__(
        self, max_queue: int, buckets: TokenBuckets | None = None, *, unit: str = "items"
    ) -> None:
        if max_queue < 1:
            raise ValueError("max_queue must be positive")
        self.max_queue = max_queue
        self.unit = unit
        # None: buckets of this scheduler's own (the registry passes the app's).
        self.buckets = TokenBuckets() if buckets is None else buckets
        self.queued = 0  # units admitted and not released
        self.rate: float | None = None  # units per second, a moving average
        self._shares: dict[str, _Share] = {}
        self._last_finish: float | None = None

    def share_limit(self, tenant: Tenant) -> int | None:
        """The most units ``tenant`` may have admitted (None: no share of its own)."""
        if tenant.queue_share is None:
            return None
        return max(1, math.floor(tenant.queue_share * self.max_queue))

    def share_of_rate(self, tenant: Tenant) -> float:
        """The part of the scheduler's rate ``tenant`` gets now: its weight over the weights
        of the tenants with work, itself included."""
        others = sum(share.weight for name, share in self._shares.items() if name != tenant.name)
        return tenant.weight / (tenant.weight + others)

    def admit(self, tenant: Tenant, units: int, tokens: int = 0) -> None:
        """Count ``units`` (``tokens`` in all, for the rate limit) in for ``tenant``, or
        raise: QueueFullError beyond ``max_queue``, TenantLimitError beyond the tenant's
        share or rate. A tenant with nothing admitted is always admitted by its share (a
        whole request must be able to fit), and the rate limit is checked last, so refused
        units take no tokens."""
        excess = self.queued + units - self.max_queue
        if excess > 0:
            raise QueueFullError(self.retry_after(excess))
        share = self._shares.get(tenant.name)
        queued = 0 if share is None else share.queued
        limit = self.share_limit(tenant)
        if limit is not None and queued > 0 and queued + units > limit:
            over = (queued + units - limit) / max(self.share_of_rate(tenant), 1e-3)
            retry = self.retry_after(over)
            raise TenantLimitError(
                retry,
                f"tenant {tenant.name!r} has {queued} {self.unit} queued, its share of the "
                f"queue is {limit}; retry in {math.ceil(retry)} s",
            )
        wait = self.buckets.take(tenant, tokens)
        if wait > 0:
            raise TenantLimitError(
                # Not clamped below: the bucket says exactly when the tokens are there.
                min(MAX_RETRY_AFTER, wait),
                f"tenant {tenant.name!r} is over its rate limit of {tenant.tokens_per_s:g} "
                f"tokens/s; retry in {math.ceil(wait)} s",
            )
        if share is None:
            share = self._shares[tenant.name] = _Share(0, tenant.weight)
        share.queued += units
        share.weight = tenant.weight
        self.queued += units

    def release(self, name: str, units: int) -> None:
        """``units`` of tenant ``name`` are done (or were dropped)."""
        share = self._shares.get(name)
        if share is None or units <= 0:
            return
        self.queued -= units
        share.queued -= units
        if share.queued <= 0:
            del self._shares[name]

    @contextlib.contextmanager
    def admitted(self, tenant: Tenant, units: int, tokens: int = 0) -> Iterator[None]:
        """Admit ``units`` for the block (or raise as :meth:`admit`), release them after it
        and count them :meth:`finished` when it ends without an exception."""
        self.admit(tenant, units, tokens)
        try:
            yield
        except BaseException:
            self.release(tenant.name, units)
            raise
        self.release(tenant.name, units)
        self.finished(units)

    def learn(self, units: int, seconds: float) -> None:
        """One pass of ``units`` took ``seconds`` (a scheduler whose passes follow one
        another): the rate's moving average takes it in."""
        self._average(units / max(seconds, 1e-6))

    def finished(self, units: int, now: float | None = None) -> None:
        """``units`` finished now (a scheduler whose work runs side by side): the rate is
        the units finished over the time since the previous finish, in the moving average."""
        now = time.monotonic() if now is None else now
        last, self._last_finish = self._last_finish, now
        if last is not None and now > last:
            self._average(units / (now - last))

    def _average(self, rate: float) -> None:
        if self.rate is None:
            self.rate = rate
        else:
            self.rate = (1 - RATE_SMOOTHING) * self.rate + RATE_SMOOTHING * rate

    def retry_after(self, excess: float) -> float:
        """Seconds until about ``excess`` units should be done at the measured rate (one
        second while nothing is measured), within ``MIN_RETRY_AFTER``..``MAX_RETRY_AFTER``."""
        if not self.rate:
            return 1.0
        return min(MAX_RETRY_AFTER, max(MIN_RETRY_AFTER, excess / self.rate))

    def with_work(self) -> Iterable[str]:
        """Names of the tenants with units admitted."""
        return list(self._shares)

    def queued_by_tenant(self) -> dict[str, int]:
        """Units admitted and not released, by tenant (tenants with none are left out)."""
        return {name: share.queued for name, share in self._shares.items()}
