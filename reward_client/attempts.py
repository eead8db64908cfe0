"""The retry, failover and give-up decisions for one logical request (:class:`Attempts`).

No I/O: the flow that sends the request (:mod:`reward_client.flows`) asks
:meth:`Attempts.sent` for each attempt's URL and time budget, reports each outcome to
:meth:`Attempts.settle` and gets back the decoded answer, a :class:`Retry` (after how
long, on which URL: :attr:`Attempts.url`) or the final :class:`RewardServerError`.

Two limits end the retries: the retry budget (``RetryPolicy.timeout``, counted from the
request's first send: no attempt starts after it, so the request can overrun it by one
attempt's timeout) and the call's :class:`Deadline` when it has one (the caller's overall
limit: no attempt starts and no pause ends past it, each attempt tells the server what is
left of it and waits for the answer at most :data:`DEADLINE_GRACE` longer).
"""

from __future__ import annotations

import json
import logging
import math
import random
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

import httpx

from reward_client.errors import RewardServerError
from reward_client.results import RetryEvent
from reward_client.retry import RetryPolicy, parse_retry_after
from reward_client.routing import Router

__all__ = ["DEADLINE_GRACE", "AttemptBudget", "Attempts", "Deadline", "Retry", "error_message"]

logger = logging.getLogger(__name__)

#: Seconds an attempt waits for its answer past the call's deadline: the server answers at
#: the deadline it was sent (with its unfinished items masked ``deadline``), and that answer
#: still has to travel back.
DEADLINE_GRACE = 1.0


@dataclass(frozen=True, slots=True)
class Deadline:
    """The caller's overall deadline for one call: ``at`` on the client's clock, ``seconds``
    after the call started (for messages)."""

    at: float
    seconds: float


@dataclass(frozen=True, slots=True)
class AttemptBudget:
    """One attempt's time: ``ms`` for the server (the ``X-Request-Timeout-Ms`` header; None:
    no limit to tell) and ``wait_s``, the most seconds to wait for the answer when the
    call's deadline is closer than the client's own timeouts (None: those timeouts)."""

    ms: int | None
    wait_s: float | None = None


def error_message(response: httpx.Response) -> str:
    """The server's own reason from an error response, short and on one line."""
    text = response.text
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    message: object = None
    if isinstance(body, dict):
        message = body.get("error", body.get("detail", body.get("message")))
    if message is None:
        message = text
    if not isinstance(message, str):
        message = json.dumps(message, separators=(",", ":"))
    message = " ".join(message.split())
    if len(message) > 500:
        message = message[:497] + "..."
    return message or response.reason_phrase or "no message"


def tls_misconfiguration(exc: BaseException) -> str | None:
    """Why ``exc`` is a TLS set-up mistake that no retry can fix, or None.

    A certificate the client does not trust (self-signed, another CA, another name) and an
    ``https://`` URL for a plain-HTTP port fail the same way on every try: retrying them
    for the whole budget would only hide the mistake. httpx wraps the ``ssl`` error twice
    (httpx -> httpcore -> ssl), so the chain is searched.
    """
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ssl.SSLCertVerificationError):
            return (
                f"TLS certificate verification failed ({cause.verify_message or cause}): give "
                "the client the CA bundle that signed the server's certificate (verify=PATH; "
                "reward_ca_bundle in the PPO config), or verify=False to skip the check"
            )
        if isinstance(cause, ssl.SSLError) and cause.reason == "WRONG_VERSION_NUMBER":
            return (
                f"TLS handshake failed ({cause.reason}): the server does not speak TLS on "
                "this port; use an http:// URL, or start the server with --ssl-certfile and "
                "--ssl-keyfile"
            )
        cause = cause.__cause__ or cause.__context__
    return None


@dataclass(frozen=True, slots=True)
class Retry:
    """Try again after ``delay`` seconds (0: at once, on the next URL)."""

    delay: float


class Attempts:
    """The attempts of one logical request: where the next goes, whether and when it does.

    ``router`` picks and remembers targets, ``policy`` sets the limits, ``clock`` and
    ``rng`` time the budget and jitter the pauses, ``on_retry`` hears of each retry.
    ``deadline``: the call's, if it has one; ``attempt_timeout``: the seconds one attempt
    waits for its answer (the HTTP read timeout; None: no limit).
    """

    def __init__(
        self,
        method: str,
        path: str,
        *,
        router: Router,
        policy: RetryPolicy,
        clock: Callable[[], float],
        rng: random.Random,
        on_retry: Callable[[RetryEvent], None] | None = None,
        deadline: Deadline | None = None,
        attempt_timeout: float | None = None,
    ) -> None:
        self.method, self.path = method, path
        self._router, self._policy = router, policy
        self._clock, self._rng, self._on_retry = clock, rng, on_retry
        self._deadline, self._attempt_timeout = deadline, attempt_timeout
        self.target = router.start()
        self._failed_since_pause = 0
        self._pauses = 0
        self.attempts = 0
        self._tried: list[str] = []
        self._started = clock()
        # The last failure that was retried: what the call ends with when the deadline passes
        # in the pause after it (a sleep can wake late) or cuts the next attempt's wait.
        self._retried: _Failure | None = None
        self._wait_cut = False  # the last attempt's wait for its answer ends at the deadline

    @property
    def url(self) -> str:
        """Full URL of the next attempt."""
        return self.target.url + self.path

    def sent(self) -> tuple[str, AttemptBudget]:
        """Count an attempt about to be made: its URL and time budget; RewardServerError
        when the call's deadline has passed (no attempt starts then)."""
        self.target = self._router.current(self.target)  # still there after a resolution?
        budget = self._budget()
        self._wait_cut = budget.wait_s is not None
        self.attempts += 1
        self._tried.append(self.url)
        return self.url, budget

    def _budget(self) -> AttemptBudget:
        """The time the next attempt has: the attempt's own timeout, or what is left of the
        call's deadline when that is less."""
        seconds, wait = self._attempt_timeout, None
        if self._deadline is not None:
            left = self._deadline.at - self._clock()
            if left * 1000 < 1:
                elapsed = self._clock() - self._started
                if self._retried is not None:
                    self._give_up(self._retried, elapsed, self._deadline_limit(), late=True)
                message = f"the call's deadline ({self._deadline.seconds:g} s) passed"
                message += " before the request was sent" if not self.attempts else ""
                raise RewardServerError(
                    None,
                    message,
                    self.url,
                    method=self.method,
                    attempts=self.attempts,
                    tried=self._tried,
                    elapsed=elapsed,
                    gave_up=self._deadline_limit(),
                )
            if seconds is None or left < seconds:
                seconds, wait = left, left + DEADLINE_GRACE
        if seconds is None:
            return AttemptBudget(None)
        # Rounded down: the server is never told it has more time than is left.
        return AttemptBudget(max(1, math.floor(seconds * 1000)), wait)

    def _deadline_limit(self) -> str:
        assert self._deadline is not None
        return f"deadline {self._deadline.seconds:g} s"

    def settle(self, outcome: httpx.Response | httpx.TransportError) -> Any:
        """The decoded JSON of a 2xx answer, a :class:`Retry`, or raise for a final error."""
        if isinstance(outcome, httpx.TransportError):
            return self._failed(outcome)
        return self._received(outcome)

    def _failed(self, exc: httpx.TransportError) -> Retry:
        """A transport error (connection, timeout, protocol): retry or raise."""
        if isinstance(exc, httpx.TimeoutException):
            cause = f"timed out ({type(exc).__name__})"
        else:
            cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if isinstance(exc, httpx.UnsupportedProtocol):
            raise RewardServerError(None, cause, self.url, method=self.method) from exc
        tls = tls_misconfiguration(exc)
        if tls is not None:  # the same on every try: not retried
            raise RewardServerError(None, tls, self.url, method=self.method) from exc
        self._router.mark(self.target, ok=False)
        return self._retry(None, cause, None, exc)

    def _received(self, response: httpx.Response) -> Any:
        status = response.status_code
        base = self.target
        if status < 300:
            self._router.mark(base, ok=True)
            try:
                return response.json()
            except ValueError as exc:
                raise RewardServerError(
                    status, "invalid response: not JSON", self.url, method=self.method
                ) from exc
        message = error_message(response)
        if status == 429 or status >= 500:
            self._router.mark(base, ok=status < 500)
            retry_after = None
            if status in (429, 503):
                retry_after = parse_retry_after(response.headers.get("retry-after"))
            return self._retry(status, message, retry_after, None)
        self._router.mark(base, ok=True)
        raise RewardServerError(status, message, self.url, method=self.method)

    def _limit_reached(self, elapsed: float) -> str | None:
        """Which limit ends the retries now, if any."""
        if self._deadline is not None and self._clock() >= self._deadline.at:
            return self._deadline_limit()
        if elapsed >= self._policy.timeout:
            return f"retry_timeout {self._policy.timeout:g} s"
        retries = self._policy.max_retries
        if retries is not None and self.attempts > retries:
            return f"max_retries {retries}"
        return None

    def _next_delay(self, retry_after: float | None, remaining: float) -> float:
        """Move to the next URL; pause only once every URL failed since the last pause."""
        self.target, count = self._router.after(self.target)
        self._failed_since_pause += 1
        if self._failed_since_pause < count:
            return 0.0
        self._failed_since_pause = 0
        if retry_after is not None:
            delay = self._policy.after_retry_after(retry_after, self._rng)
        else:
            delay = self._policy.backoff(self._pauses, self._rng)
        self._pauses += 1
        return min(delay, remaining)  # the last try falls on the end of the budget

    def _retry(
        self, status: int | None, cause: str, retry_after: float | None, exc: BaseException | None
    ) -> Retry:
        """Log the failure; then the pause before the next try, or raise once a limit is hit."""
        failure = _Failure(status, cause, self.url, exc)
        budget = self._policy.timeout
        elapsed = self._clock() - self._started
        limit = self._limit_reached(elapsed)
        delay = 0.0
        if limit is None:
            delay = self._next_delay(retry_after, budget - elapsed)
            # No pause ends on or past the deadline: the next try would have no time left.
            if self._deadline is not None and self._clock() + delay >= self._deadline.at:
                limit = self._deadline_limit()
        if limit is not None:
            self._give_up(failure, elapsed, limit)
        where = self._where(failure, elapsed)
        logger.warning("%s; next try in %.1f s on %s", where, delay, self.url)
        self._retried = failure
        if self._on_retry is not None:
            event = RetryEvent(
                method=self.method,
                url=failure.url,
                error=failure.what,
                status=status,
                attempt=self.attempts,
                waited_s=elapsed,
                budget_s=budget,
                next_delay_s=delay,
                next_url=self.url,
            )
            self._on_retry(event)
        return Retry(delay)

    def _last_word(self, failure: _Failure, limit: str) -> _Failure:
        """What the call ends with: ``failure``, or, when that attempt timed out only because
        the call's deadline cut its wait, the server's last answer before it (a 503 with its
        reason says why the call failed; the timeout only that the deadline came)."""
        earlier = self._retried
        cut = self._wait_cut and isinstance(failure.exc, httpx.TimeoutException)
        if not cut or earlier is None or earlier.status is None:
            return failure
        if self._deadline is None or limit != self._deadline_limit():
            return failure
        note = f"{earlier.cause}; attempt {self.attempts} got no answer by the deadline"
        return _Failure(earlier.status, note, earlier.url, failure.exc)

    def _where(self, failure: _Failure, elapsed: float) -> str:
        """The log line's start: which attempt failed, when, against which limits, and how."""
        where = f"{self.method} {failure.url} failed (attempt {self.attempts}, {elapsed:.1f} s"
        where += f" of the {self._policy.timeout:g} s retry budget"
        if self._deadline is not None:
            where += f", the call's deadline {self._deadline.seconds:g} s"
        return f"{where}): {failure.what}"

    def _give_up(
        self, failure: _Failure, elapsed: float, limit: str, *, late: bool = False
    ) -> NoReturn:
        """Raise the final error for ``failure`` (the last attempt's), ended by ``limit``.

        ``late``: the pause after that attempt was to end before the deadline but ended past
        it (a sleep can wake late), so no further attempt was sent: the call ends with the
        last attempt's failure, as it would had the pause not been taken.
        """
        if late:
            logger.warning(
                "%s %s: the pause before attempt %d ended past the call's deadline; giving up"
                " (%s) with attempt %d's failure",
                self.method,
                failure.url,
                self.attempts + 1,
                limit,
                self.attempts,
            )
        else:
            logger.warning("%s; giving up (%s)", self._where(failure, elapsed), limit)
            failure = self._last_word(failure, limit)
        raise RewardServerError(
            failure.status,
            failure.cause,
            failure.url,
            method=self.method,
            attempts=self.attempts,
            tried=self._tried,
            elapsed=elapsed,
            gave_up=limit,
        ) from failure.exc


@dataclass(frozen=True, slots=True)
class _Failure:
    """One failed attempt: its HTTP status (None: no answer), cause, URL and exception."""

    status: int | None
    cause: str
    url: str
    exc: BaseException | None

    @property
    def what(self) -> str:
        return f"HTTP {self.status}: {self.cause}" if self.status else self.cause
