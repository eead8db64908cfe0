"""Which server a request starts on and fails over to (:class:`Router`, no I/O)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from reward_client.targets import EndpointPool, Target

__all__ = ["Router"]


class Router:
    """Round-robin start targets, preferring those that have not just failed (thread-safe).

    The targets come from an :class:`~reward_client.targets.EndpointPool` and may change
    between two calls (a ``dns+`` name re-resolved); a target is known by value, not by
    position. A target that failed like a dead server is avoided for new requests for
    ``down_for`` seconds.
    """

    def __init__(self, pool: EndpointPool, down_for: float, clock: Callable[[], float]) -> None:
        self.pool = pool
        self._down_for = down_for
        self._clock = clock
        self._down_until: dict[Target, float] = {}
        self._counter = itertools.count()
        self._lock = threading.Lock()

    @property
    def urls(self) -> list[str]:
        """The current base URLs."""
        return [t.url for t in self.pool.targets()]

    def start(self) -> Target:
        """The target a new request starts on."""
        targets = self.pool.targets()
        with self._lock:
            turn = next(self._counter)
            now = self._clock()
            # Forget targets that left the pool, so that the table does not grow forever.
            for gone in set(self._down_until) - set(targets):
                del self._down_until[gone]
            up = [t for t in targets if self._down_until.get(t, 0.0) <= now]
            pool = up or targets
            return pool[turn % len(pool)]

    def after(self, target: Target) -> tuple[Target, int]:
        """The target after ``target`` (failover) and how many targets there are now."""
        targets = self.pool.targets()
        if target not in targets:  # it left the pool meanwhile
            return self.start(), len(targets)
        return targets[(targets.index(target) + 1) % len(targets)], len(targets)

    def current(self, target: Target) -> Target:
        """``target`` while it is in the pool, else a new start target."""
        return target if target in self.pool.targets() else self.start()

    def mark(self, target: Target, *, ok: bool) -> None:
        """Remember that ``target`` answered (ok) or failed like a server that is down."""
        with self._lock:
            if ok:
                self._down_until.pop(target, None)
            else:
                self._down_until[target] = self._clock() + self._down_for
        if not ok:
            self.pool.failed(target)
