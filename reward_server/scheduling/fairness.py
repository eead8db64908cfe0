"""Sharing one server between tenants: the turn order of weighted fair queueing,
per-tenant admission (queue shares, rate limits) and the rate limits' token buckets.

Plain data structures with no asyncio and no HTTP, shared by both schedulers: the
micro-:class:`~reward_server.scheduling.batcher.Batcher` (items, forward passes) and
:class:`~reward_server.scheduling.admission.AdmissionScheduler` (requests handed to an engine
that batches by itself). Tenants are told apart by name, so a keys file reloaded with new weights or limits
keeps each tenant's place in the queues and the tokens in its bucket.

* :class:`DeficitRoundRobin`: whose work goes next. Each tenant with work waits in a ring;
  on its turn it is credited ``quantum * weight`` tokens and may send work while its credit
  (the deficit) covers the next entry's tokens (Shreedhar and Varghese's deficit round
  robin), so backlogged tenants get tokens in proportion to their weights, whatever the
  sizes of their requests, and a tenant that arrives waits for at most one turn of each
  other tenant.
* :class:`TokenBuckets`: one bucket per tenant with a ``tokens_per_s`` limit. One set per
  app (the registry makes it and hands it to every served model's scheduler), so a tenant's
  limit holds across the models it scores against, and two apps in one process (tests, Ray
  Serve replicas) never share a bucket.
* :class:`TenantAdmission`: the per-tenant half of admission (the queue share, then the rate
  limit), all or nothing, with a Retry-After from the tenant's own backlog or bucket.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from reward_server.config.tenants import Tenant
from reward_server.errors import TenantLimitError

__all__ = [
    "MAX_RETRY_AFTER",
    "MIN_RETRY_AFTER",
    "DeficitRoundRobin",
    "TenantAdmission",
    "TokenBuckets",
]

#: Bounds of a Retry-After estimate, seconds (as the schedulers' own).
MIN_RETRY_AFTER = 0.1
MAX_RETRY_AFTER = 30.0

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
    queued: int = 0  # admitted entries not started yet


class TenantAdmission:
    """Per-tenant admission of a scheduler: counts each tenant's queued entries (rows) and
    refuses, with :class:`~reward_server.errors.TenantLimitError`, a tenant over its queue
    share or its rate limit. The scheduler checks its global queue limit first."""

    def __init__(self, max_queue: int, buckets: TokenBuckets | None = None) -> None:
        self.max_queue = max_queue
        # None: buckets of this scheduler's own (the registry passes the app's).
        self.buckets = TokenBuckets() if buckets is None else buckets
        self._shares: dict[str, _Share] = {}

    def queued(self, name: str) -> int:
        """Entries of tenant ``name`` admitted and not started."""
        share = self._shares.get(name)
        return 0 if share is None else share.queued

    def share_limit(self, tenant: Tenant) -> int | None:
        """The most entries ``tenant`` may have queued (None: no share of its own)."""
        if tenant.queue_share is None:
            return None
        return max(1, math.floor(tenant.queue_share * self.max_queue))

    def admit(
        self,
        tenant: Tenant,
        rows: int,
        tokens: int,
        *,
        rate: float | None,
        share_of_rate: float,
    ) -> None:
        """Count ``rows`` (``tokens`` in all) in for ``tenant``, or raise TenantLimitError.

        ``rate``: the scheduler's rows per second (None: not measured yet) and
        ``share_of_rate``: the part of it this tenant gets now (its weight over the weights
        of the tenants with work), for a Retry-After from the tenant's own backlog. A tenant
        with nothing queued is always admitted by its share (a whole request must be able
        to fit), and the rate limit is checked last, so refused rows take no tokens.
        """
        queued = self.queued(tenant.name)
        limit = self.share_limit(tenant)
        if limit is not None and queued > 0 and queued + rows > limit:
            excess = queued + rows - limit
            seconds = 1.0 if not rate else excess / (rate * max(share_of_rate, 1e-3))
            retry = _clamp(seconds)
            raise TenantLimitError(
                retry,
                f"tenant {tenant.name!r} has {queued} items queued, its share of the queue "
                f"is {limit}; retry in {math.ceil(retry)} s",
            )
        wait = self.buckets.take(tenant, tokens)
        if wait > 0:
            raise TenantLimitError(
                # Not clamped below: the bucket says exactly when the tokens are there.
                min(MAX_RETRY_AFTER, wait),
                f"tenant {tenant.name!r} is over its rate limit of {tenant.tokens_per_s:g} "
                f"tokens/s; retry in {math.ceil(wait)} s",
            )
        self._shares.setdefault(tenant.name, _Share()).queued += rows

    def release(self, name: str, rows: int) -> None:
        """``rows`` of tenant ``name`` started (or were dropped)."""
        share = self._shares.get(name)
        if share is None:
            return
        share.queued -= rows
        if share.queued <= 0:
            del self._shares[name]

    def with_work(self) -> Iterable[str]:
        """Names of the tenants with entries queued."""
        return list(self._shares)

    def queued_by_tenant(self) -> dict[str, int]:
        """Entries admitted and not started, by tenant (tenants with none are left out)."""
        return {name: share.queued for name, share in self._shares.items()}


def _clamp(seconds: float) -> float:
    return min(MAX_RETRY_AFTER, max(MIN_RETRY_AFTER, seconds))
