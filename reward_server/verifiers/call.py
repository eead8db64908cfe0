"""What one call of a verifier pool's ``verify`` shares across the slots' threads that run
its chunks: the request's deadline, and the breaker's count of the items it has settled."""

from __future__ import annotations

import logging
import threading

from reward_server.verifiers.items import Verdict

__all__ = ["BREAKER_TIMEOUTS", "Call"]

logger = logging.getLogger("reward_server.verifiers")

#: The breaker: a call stops trying its items after this many timeouts, when they are more
#: than half of its items settled so far.
BREAKER_TIMEOUTS = 3


class Call:
    """What one ``verify`` call's chunks have settled, for the breaker (slots' threads
    record into it concurrently)."""

    def __init__(self, pool_name: str, deadline: float | None = None) -> None:
        self._pool_name = pool_name
        #: The request's deadline (``time.monotonic()``), None when it has none.
        self.deadline = deadline
        self._lock = threading.Lock()
        self.settled = 0
        self.timeouts = 0
        self._warned = False

    def record(self, verdict: Verdict) -> None:
        with self._lock:
            self.settled += 1
            self.timeouts += verdict.error == "timeout"

    def open(self) -> bool:
        """Whether the call stops trying its items (the first time: one warning)."""
        with self._lock:
            tripped = self.timeouts >= BREAKER_TIMEOUTS and 2 * self.timeouts > self.settled
            warn = tripped and not self._warned
            self._warned = self._warned or tripped
            settled, timeouts = self.settled, self.timeouts
        if warn:
            logger.warning(
                "verifier %r: %d of the %d items settled in this call timed out; its items "
                "not sent yet are not tried (reason timeout)",
                self._pool_name,
                timeouts,
                settled,
            )
        return tripped
