"""A start limit for requests to another service: at most ``limit`` starts in any window of
``window_s`` seconds (``kind: remote``'s ``max_rpm``)."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Awaitable, Callable

__all__ = ["RATE_WINDOW_S", "RateLimiter"]

#: ``max_rpm``'s window, in seconds.
RATE_WINDOW_S = 60.0


class RateLimiter:
    """At most ``limit`` starts in any ``window_s`` seconds (a sliding window of the last
    starts); ``clock`` and ``sleep`` are the test seam."""

    def __init__(
        self,
        limit: int,
        window_s: float = RATE_WINDOW_S,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._sleep = sleep
        self._starts: collections.deque[float] = collections.deque()
        self._lock = asyncio.Lock()

    async def acquire(self) -> None:
        """Wait until one more start keeps the window's count within the limit, and take it."""
        async with self._lock:  # in arrival order
            while True:
                now = self._clock()
                while self._starts and now - self._starts[0] >= self.window_s:
                    self._starts.popleft()
                if len(self._starts) < self.limit:
                    self._starts.append(now)
                    return
                await self._sleep(self._starts[0] + self.window_s - now)
