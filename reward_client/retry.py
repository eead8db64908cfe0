"""When to try a failed request again: :class:`RetryPolicy` and ``Retry-After`` headers."""

from __future__ import annotations

import email.utils
import math
import random
import time
from dataclasses import dataclass

__all__ = ["RetryPolicy", "parse_retry_after"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How long and how to retry a failed request.

    A request is retried until ``timeout`` seconds have passed since it was first sent
    (the retry budget; 0 retries nothing), and at most ``max_retries`` times when that is
    set. A failure moves to the next base URL at once while some URL has not been tried
    since the last pause; once every URL failed, the client pauses for the server's
    ``Retry-After`` (capped at ``max_retry_after``, then lengthened by up to
    ``retry_after_jitter`` of itself, so that the many clients a busy server turned away
    at once do not all come back at the same instant) or for a full-jitter exponential
    backoff ``uniform(0, min(backoff_max, backoff_base * 2**k))`` where ``k`` counts the
    pauses so far. No pause outlasts what is left of the budget: the last try falls on
    its end. The budget is checked between attempts, so a call can overrun it by at most
    one request timeout; a call's ``deadline`` (:class:`~reward_client.ClientOptions`) is
    the strict bound.
    """

    timeout: float = 600.0
    max_retries: int | None = None
    backoff_base: float = 0.25
    backoff_max: float = 10.0
    max_retry_after: float = 60.0
    retry_after_jitter: float = 0.1

    def __post_init__(self) -> None:
        if not self.timeout >= 0:  # also rejects NaN
            raise ValueError(f"timeout (the retry budget) must be >= 0 s, got {self.timeout}")
        if self.max_retries is not None and self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.backoff_base < 0 or self.backoff_max < 0 or self.max_retry_after < 0:
            raise ValueError("backoff_base, backoff_max and max_retry_after must be >= 0")
        if self.retry_after_jitter < 0:
            raise ValueError("retry_after_jitter must be >= 0")

    def backoff(self, pauses: int, rng: random.Random) -> float:
        """Full-jitter delay before the next round after ``pauses`` earlier pauses."""
        # Cap the exponent so that 2**pauses cannot overflow a float on long outages.
        ceiling = min(self.backoff_max, self.backoff_base * 2.0 ** min(pauses, 60))
        return rng.uniform(0.0, ceiling)

    def after_retry_after(self, seconds: float, rng: random.Random) -> float:
        """The pause for a server's ``Retry-After``: never shorter, at most the cap plus jitter."""
        base = min(seconds, self.max_retry_after)
        return base + rng.uniform(0.0, self.retry_after_jitter * base)


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # an HTTP date is GMT by definition
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)
