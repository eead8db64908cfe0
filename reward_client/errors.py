"""The errors the reward clients raise on purpose::

    RewardClientError            base of everything reward_client raises on purpose
    └── RewardServerError        a call finally failed (status, message, url)

Anything else (a TypeError or ValueError for bad arguments) is a mistake in the call.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["RewardClientError", "RewardServerError"]


class RewardClientError(Exception):
    """Base class of the errors raised by the reward clients."""


class RewardServerError(RewardClientError):
    """A request to the reward server finally failed; ``str()`` names the URL and the cause.

    ``attempts`` counts the requests sent, ``elapsed`` the seconds from the first to the
    decision to give up, ``gave_up`` which limit ended the retries (``"retry_timeout 30 s"``,
    ``"max_retries 3"``) or None when the error was not retryable.
    """

    def __init__(
        self,
        status: int | None,
        message: str,
        url: str | None,
        *,
        method: str = "POST",
        attempts: int = 1,
        tried: Sequence[str] = (),
        elapsed: float = 0.0,
        gave_up: str | None = None,
    ) -> None:
        self.status = status
        self.message = message
        self.url = url
        self.method = method
        self.attempts = attempts
        self.tried = tuple(tried)
        self.elapsed = elapsed
        self.gave_up = gave_up
        super().__init__(self._describe())

    def _describe(self) -> str:
        """One line: what was requested, how often and how long, and why it failed."""
        cause = f"HTTP {self.status}: {self.message}" if self.status else self.message
        where = f"{self.method} {self.url}" if self.url else self.method
        times = f" after {self.attempts} attempts" if self.attempts > 1 else ""
        others = [u for u in dict.fromkeys(self.tried) if u != self.url]
        also = f" (also tried {', '.join(others)})" if others else ""
        end = ""
        if self.attempts > 1 or self.gave_up:  # a limit that ended retries is worth naming
            end = f"; gave up after {self.elapsed:.1f} s"
            end += f" ({self.gave_up})" if self.gave_up else ""
        return f"{where} failed{times}: {cause}{also}{end}"
