"""HTTP clients for the reward server: chunking, concurrency, failover, retries.

Exceptions::

    RewardClientError            base of everything this module raises on purpose
    └── RewardServerError        a call finally failed (status, message, url)

Both clients split a call into chunks of the server's ``max_client_batch``, send the chunks
concurrently, spread them round-robin over the base URLs (a ``dns+http://name:port`` URL
stands for every address of the name, followed as it changes: :mod:`ppo_client.endpoints`),
retry connection errors, timeouts, 5xx and 429 (another URL first, then capped exponential
backoff with full jitter, or the server's ``Retry-After``) until a time budget
(``retry_timeout``, 600 s by default) is spent, never retry any other 4xx, and return
scores in input order.

One implementation, two faces. What a call does (discover the chunk size, split, send,
decide on each failure whether and when to try again and where) is written once as
*flows*: generators that yield actions (:class:`_Send` a request, :class:`_Sleep`,
:class:`_Gather` sub-flows concurrently, :class:`_Resolve` the ``dns+`` names again) and
get back their outcomes, without doing any I/O themselves. :class:`RewardClient` executes
the actions with an ``httpx.Client``, ``time.sleep`` and a thread pool;
:class:`AsyncRewardClient` with an ``httpx.AsyncClient``, ``asyncio.sleep`` and tasks. The
public methods are written once too and return whatever the face's runner returns: a
value, or a coroutine.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import email.utils
import itertools
import json
import logging
import math
import random
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, CancelledError, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypedDict, TypeVar

import httpx

from ppo_client import protocols
from ppo_client.endpoints import (
    DEFAULT_RESOLVE_INTERVAL,
    EndpointPool,
    Resolver,
    Target,
    normalise_urls,
)

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "AsyncRewardClient",
    "ClientOptions",
    "RetryEvent",
    "RetryPolicy",
    "RewardClient",
    "RewardClientError",
    "RewardServerError",
    "ScoreInputs",
    "ScoreResult",
]

logger = logging.getLogger(__name__)

#: Chunk size used when the server's ``/info`` does not say how many items it accepts.
DEFAULT_MAX_CLIENT_BATCH = 64

Message: TypeAlias = Mapping[str, Any]
Conversation: TypeAlias = Sequence[Message]
Prompt: TypeAlias = str | Conversation


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
        if self.attempts > 1:
            end = f"; gave up after {self.elapsed:.1f} s"
            end += f" ({self.gave_up})" if self.gave_up else ""
        return f"{where} failed{times}: {cause}{also}{end}"


@dataclass(frozen=True)
class ScoreResult:
    """Scores in input order, with the number of tokens scored and truncation per item.

    The breakdown of a composite server (one list entry per item; None where the server
    sent none, and always None for protocols other than remote-reward): ``components``
    (model name -> its own scores), ``objectives`` (label name -> raw logits),
    ``step_scores`` and ``step_ends`` (per item, a process model's score of each step and
    the code-point offset into the response where that step ends), ``steps_dropped``
    (steps lost to truncation) and ``outcome_scores`` (the sequence models' aggregate).
    """

    scores: list[float]
    tokens: list[int]
    truncated: list[bool]
    components: dict[str, list[float]] | None = None
    objectives: dict[str, list[float]] | None = None
    step_scores: list[list[float]] | None = None
    step_ends: list[list[int]] | None = None
    steps_dropped: list[int] | None = None
    outcome_scores: list[float] | None = None

    def __len__(self) -> int:
        return len(self.scores)

    @property
    def truncated_frac(self) -> float:
        """Fraction of items the server truncated (0.0 for an empty result)."""
        return sum(self.truncated) / len(self.truncated) if self.truncated else 0.0


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
    one request timeout.
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


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """A failed attempt that will be tried again; passed to the clients' ``on_retry`` hook.

    ``waited_s`` is the time since the request was first sent, out of ``budget_s``;
    ``next_delay_s`` the pause before the next try (0: at once), on ``next_url``.
    """

    method: str
    url: str
    error: str
    status: int | None
    attempt: int
    waited_s: float
    budget_s: float
    next_delay_s: float
    next_url: str


class ScoreInputs(TypedDict, total=False):
    """The keyword arguments of ``score`` and ``score_detailed``.

    Exactly one input form: ``texts`` (scored as given), ``queries`` with ``responses``
    (joined by the server as the reward model expects) or ``conversations`` (lists of
    ``{"role", "content"}`` messages, rendered with the reward model's chat template).
    ``truncate``: whether the server may cut texts over its limit (None: its default).
    ``model``: score with this one model of a composite server; ``components``: ask for
    the per-model breakdown even from a one-model server (remote-reward protocol only).
    """

    texts: Sequence[str] | None
    queries: Sequence[str] | None
    responses: Sequence[str] | None
    conversations: Sequence[Conversation] | None
    truncate: bool | None
    model: str | None
    components: bool | None


class ClientOptions(TypedDict, total=False):
    """Keyword options shared by :class:`RewardClient` and :class:`AsyncRewardClient`.

    ``timeout``: per request (seconds or an ``httpx.Timeout``; default 60), also through a
    passed-in ``http_client``. ``retry``: the :class:`RetryPolicy`; ``retry_timeout`` and
    ``max_retries`` replace its fields of those names. ``max_client_batch``: items per
    request (default: the server's, read from ``/info``). ``max_concurrency``: requests in
    flight per call (default 8). ``on_retry``: called with a :class:`RetryEvent` before each
    retry (from a worker thread in the sync client). ``seed``: seeds the jitter.
    ``clock``: a monotonic clock in seconds for the retry budget (the test seam, with the
    face's ``sleep``). ``protocol``: what the server speaks, ``remote-reward`` (this
    project's server, the default), ``vllm``, ``tei``, ``openrlhf``, or ``auto`` to ask the
    server (see :mod:`ppo_client.protocols`). ``resolve_interval``: seconds between two
    resolutions of a ``dns+http://name:port`` base URL (default 5; also resolved again soon
    after a failure); ``resolver``: ``(host, port) -> addresses``, the test seam (default
    ``getaddrinfo``; see :mod:`ppo_client.endpoints`).
    """

    timeout: float | httpx.Timeout
    retry: RetryPolicy | None
    retry_timeout: float | None
    max_retries: int | None
    max_client_batch: int | None
    max_concurrency: int
    on_retry: Callable[[RetryEvent], None] | None
    seed: int | None
    clock: Callable[[], float]
    protocol: str
    resolver: Resolver | None
    resolve_interval: float


def _parse_retry_after(value: str | None, now: float | None = None) -> float | None:
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


def _error_message(response: httpx.Response) -> str:
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


def _is_number(value: object) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _parse_scores(payload: object, expected: int, url: str) -> ScoreResult:
    """Check a ``/score`` answer for shape and finiteness; raise RewardServerError if wrong."""

    def bad(reason: str) -> RewardServerError:
        return RewardServerError(None, f"invalid response: {reason}", url)

    if not isinstance(payload, dict):
        raise bad(f"expected a JSON object, got {type(payload).__name__}")
    columns: dict[str, list[Any]] = {}
    for key in ("scores", "tokens", "truncated"):
        column = payload.get(key)
        if not isinstance(column, list):
            raise bad(f"{key!r} missing or not a list")
        if len(column) != expected:
            raise bad(f"{len(column)} {key} for {expected} items")
        columns[key] = column
    for i, score in enumerate(columns["scores"]):
        if not _is_number(score):
            raise bad(f"score {i} is {score!r}, not a finite number")
    for i, count in enumerate(columns["tokens"]):
        if not (isinstance(count, int) and not isinstance(count, bool) and count >= 0):
            raise bad(f"tokens {i} is {count!r}, not a count")
    for i, flag in enumerate(columns["truncated"]):
        if not isinstance(flag, bool):
            raise bad(f"truncated {i} is {flag!r}, not a bool")
    return ScoreResult(
        scores=[float(s) for s in columns["scores"]],
        tokens=list(columns["tokens"]),
        truncated=list(columns["truncated"]),
        **_checked_breakdown(payload, expected, url),
    )


def _checked_breakdown(payload: dict[str, Any], expected: int, url: str) -> dict[str, Any]:
    """:func:`_parse_breakdown`, its complaint raised as an invalid response."""
    try:
        return _parse_breakdown(payload, expected)
    except ValueError as exc:
        raise RewardServerError(None, f"invalid response: {exc}", url) from None


#: The optional breakdown fields of a ``/score`` answer (ScoreResult's names).
_BREAKDOWN = (
    "components",
    "objectives",
    "step_scores",
    "step_ends",
    "steps_dropped",
    "outcome_scores",
)


def _numbers(column: object, expected: int | None, what: str) -> list[float]:
    """Finite numbers as floats (``expected`` of them unless None); ValueError if not."""
    if not isinstance(column, list) or (expected is not None and len(column) != expected):
        count = "" if expected is None else f"{expected} "
        raise ValueError(f"{what} is not a list of {count}numbers")
    for i, value in enumerate(column):
        if not _is_number(value):
            raise ValueError(f"{what}[{i}] is {value!r}, not a finite number")
    return [float(v) for v in column]


def _offsets(column: object, expected: int | None, what: str) -> list[int]:
    """Non-negative ints (``expected`` of them unless None); ValueError if not."""
    if not isinstance(column, list) or (expected is not None and len(column) != expected):
        count = "" if expected is None else f"{expected} "
        raise ValueError(f"{what} is not a list of {count}counts")
    for i, value in enumerate(column):
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
            raise ValueError(f"{what}[{i}] is {value!r}, not a count")
    return list(column)


def _per_item(
    column: object, expected: int, what: str, row: Callable[[object, None, str], list[Any]]
) -> list[list[Any]]:
    """One list per item, each checked by ``row``."""
    if not isinstance(column, list) or len(column) != expected:
        raise ValueError(f"{what} is not a list of {expected} lists")
    return [row(value, None, f"{what}[{i}]") for i, value in enumerate(column)]


def _named(column: object, expected: int, what: str) -> dict[str, list[float]]:
    """Name -> ``expected`` finite numbers."""
    if not isinstance(column, dict):
        raise ValueError(f"{what} is not an object of name -> scores")
    return {str(k): _numbers(v, expected, f"{what}[{k!r}]") for k, v in column.items()}


def _parse_breakdown(payload: dict[str, Any], expected: int) -> dict[str, Any]:
    """The breakdown fields present in an answer, checked (absent or null: None)."""
    out: dict[str, Any] = {}
    for key in _BREAKDOWN:
        column = payload.get(key)
        if column is None:
            continue
        if key in ("components", "objectives"):
            out[key] = _named(column, expected, key)
        elif key == "step_scores":
            out[key] = _per_item(column, expected, key, _numbers)
        elif key == "step_ends":
            out[key] = _per_item(column, expected, key, _offsets)
        elif key == "steps_dropped":
            out[key] = _offsets(column, expected, key)
        else:
            out[key] = _numbers(column, expected, key)
    scores, ends = out.get("step_scores"), out.get("step_ends")
    if (scores is None) != (ends is None):
        raise ValueError("step_scores and step_ends come together")
    for i, (row, offsets) in enumerate(zip(scores or [], ends or [], strict=True)):
        if len(row) != len(offsets):
            raise ValueError(f"item {i}: {len(row)} step_scores but {len(offsets)} step_ends")
        if any(b < a for a, b in itertools.pairwise(offsets)):
            raise ValueError(f"item {i}: step_ends {offsets} are not in order")
    return out


def _find_max_client_batch(info: object) -> int | None:
    """``max_client_batch`` from ``/info``, at the top level or one object down."""
    if not isinstance(info, dict):
        return None
    candidates = [info] + [v for v in info.values() if isinstance(v, dict)]
    for mapping in candidates:
        value = mapping.get("max_client_batch")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _to_str_list(name: str, values: Sequence[str]) -> list[str]:
    """A list copy of ``values``, each a str."""
    if isinstance(values, str):
        raise TypeError(f"{name} must be a sequence of strings, not a single string")
    out = list(values)
    for i, value in enumerate(out):
        if not isinstance(value, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(value).__name__}")
    return out


def _to_conversations(conversations: Sequence[Conversation]) -> list[list[dict[str, Any]]]:
    """Plain JSON-ready copies of the conversations."""
    out: list[list[dict[str, Any]]] = []
    for i, conversation in enumerate(conversations):
        if isinstance(conversation, (str, Mapping)):
            raise TypeError(f"conversations[{i}] must be a list of messages")
        messages = []
        for message in conversation:
            if not isinstance(message, Mapping):
                raise TypeError(
                    f"conversations[{i}] holds a {type(message).__name__}, not a message"
                )
            messages.append(dict(message))
        out.append(messages)
    return out


def _columns(inputs: ScoreInputs) -> dict[str, list[Any]]:
    """Check that exactly one input form is given and return its columns as lists."""
    unknown = sorted(set(inputs) - set(ScoreInputs.__annotations__))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
    texts, conversations = inputs.get("texts"), inputs.get("conversations")
    queries, responses = inputs.get("queries"), inputs.get("responses")
    forms = [texts is not None, queries is not None or responses is not None]
    forms.append(conversations is not None)
    if sum(forms) != 1:
        raise ValueError("give exactly one of texts=, queries=/responses= or conversations=")
    if texts is not None:
        return {"texts": _to_str_list("texts", texts)}
    if conversations is not None:
        return {"conversations": _to_conversations(conversations)}
    if queries is None or responses is None:
        raise ValueError("queries= and responses= go together")
    q, r = _to_str_list("queries", queries), _to_str_list("responses", responses)
    if len(q) != len(r):
        raise ValueError(f"{len(q)} queries but {len(r)} responses")
    return {"queries": q, "responses": r}


def _pair_columns(prompts: Sequence[Prompt], responses: Sequence[str]) -> dict[str, list[Any]]:
    """Columns for a reward call: text prompts as pairs, message-list prompts as conversations."""
    prompts, responses = list(prompts), _to_str_list("responses", responses)
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    if all(isinstance(p, str) for p in prompts):
        return {"queries": prompts, "responses": responses}
    if any(isinstance(p, (str, Mapping)) for p in prompts):
        raise TypeError("prompts must be all strings or all lists of chat messages")
    conversations = [
        [*prompt, {"role": "assistant", "content": response}]
        for prompt, response in zip(prompts, responses, strict=True)
    ]
    return {"conversations": _to_conversations(conversations)}


class _Router:
    """Round-robin start targets, preferring those that have not just failed (thread-safe).

    The targets come from an :class:`EndpointPool` and may change between two calls (a
    ``dns+`` name re-resolved); a target is known by value, not by position.
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


# --- the sans-I/O core: actions and flows ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Send:
    """Send one HTTP request; the outcome is the ``httpx.Response`` or the transport error."""

    method: str
    url: str
    body: object | None
    #: The server it goes to (its Host header and TLS name for an address found by DNS).
    target: Target | None = None


@dataclass(frozen=True, slots=True)
class _Resolve:
    """Resolve the ``dns+`` base URLs again (blocking I/O); the outcome is None."""


@dataclass(frozen=True, slots=True)
class _Sleep:
    """Pause; the outcome is None."""

    seconds: float


@dataclass(frozen=True, slots=True)
class _Gather:
    """Run the flows concurrently; the outcome is their results in order (or the first error)."""

    flows: list[Flow[Any]]


_Action: TypeAlias = "_Send | _Resolve | _Sleep | _Gather"
T = TypeVar("T")
#: A computation that yields actions, is sent their outcomes, and returns a ``T``.
Flow: TypeAlias = Generator[_Action, Any, T]


def _advance(flow: Flow[Any], outcome: object) -> tuple[bool, Any]:
    """Send ``outcome`` into ``flow``: (False, next action) or (True, the flow's result)."""
    try:
        return False, flow.send(outcome)
    except StopIteration as stop:
        return True, stop.value


def _results(futures: Sequence[Any]) -> list[Any]:
    """Results of finished futures or tasks in order; else the first error in chunk order."""
    # Every finished one's exception is retrieved, so that asyncio reports none as unretrieved.
    errors = [f.exception() for f in futures if f.done() and not f.cancelled()]
    for error in errors:
        if error is not None:
            raise error
    return [f.result() for f in futures]


@dataclass(frozen=True, slots=True)
class _Retry:
    """Try again after ``delay`` seconds (0: at once, on the next URL)."""

    delay: float


class _Attempts:
    """The retry, failover and give-up decisions for one logical request (sans I/O)."""

    def __init__(self, core: _Core, method: str, path: str) -> None:
        self._core = core
        self._router = core._router
        self._policy = core.retry_policy
        self.method = method
        self.path = path
        self.target = self._router.start()
        self._failed_since_pause = 0
        self._pauses = 0
        self.attempts = 0
        self._tried: list[str] = []
        self._started = core._clock()

    @property
    def url(self) -> str:
        """Full URL of the next attempt."""
        return self.target.url + self.path

    def sent(self) -> str:
        """Count an attempt about to be made; its URL."""
        self.target = self._router.current(self.target)  # still there after a resolution?
        self.attempts += 1
        self._tried.append(self.url)
        return self.url

    def settle(self, outcome: httpx.Response | httpx.TransportError) -> Any:
        """The decoded JSON of a 2xx answer, a :class:`_Retry`, or raise for a final error."""
        if isinstance(outcome, httpx.TransportError):
            return self._failed(outcome)
        return self._received(outcome)

    def _failed(self, exc: httpx.TransportError) -> _Retry:
        """A transport error (connection, timeout, protocol): retry or raise."""
        if isinstance(exc, httpx.TimeoutException):
            cause = f"timed out ({type(exc).__name__})"
        else:
            cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if isinstance(exc, httpx.UnsupportedProtocol):
            raise RewardServerError(None, cause, self.url, method=self.method) from exc
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
        message = _error_message(response)
        if status == 429 or status >= 500:
            self._router.mark(base, ok=status < 500)
            retry_after = None
            if status in (429, 503):
                retry_after = _parse_retry_after(response.headers.get("retry-after"))
            return self._retry(status, message, retry_after, None)
        self._router.mark(base, ok=True)
        raise RewardServerError(status, message, self.url, method=self.method)

    def _limit_reached(self, elapsed: float) -> str | None:
        """Which limit ends the retries now, if any."""
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
        rng = self._core._rng
        if retry_after is not None:
            delay = self._policy.after_retry_after(retry_after, rng)
        else:
            delay = self._policy.backoff(self._pauses, rng)
        self._pauses += 1
        return min(delay, remaining)  # the last try falls on the end of the budget

    def _retry(
        self, status: int | None, cause: str, retry_after: float | None, exc: BaseException | None
    ) -> _Retry:
        """Log the failure; then the pause before the next try, or raise once a limit is hit."""
        failed_url, budget = self.url, self._policy.timeout
        elapsed = self._core._clock() - self._started
        what = f"HTTP {status}: {cause}" if status else cause
        where = f"{self.method} {failed_url} failed (attempt {self.attempts}, {elapsed:.1f} s"
        where += f" of the {budget:g} s retry budget): {what}"
        limit = self._limit_reached(elapsed)
        if limit is not None:
            logger.warning("%s; giving up (%s)", where, limit)
            raise RewardServerError(
                status,
                cause,
                failed_url,
                method=self.method,
                attempts=self.attempts,
                tried=self._tried,
                elapsed=elapsed,
                gave_up=limit,
            ) from exc
        delay = self._next_delay(retry_after, budget - elapsed)
        logger.warning("%s; next try in %.1f s on %s", where, delay, self.url)
        if self._core.on_retry is not None:
            event = RetryEvent(
                method=self.method,
                url=failed_url,
                error=what,
                status=status,
                attempt=self.attempts,
                waited_s=elapsed,
                budget_s=budget,
                next_delay_s=delay,
                next_url=self.url,
            )
            self._core.on_retry(event)
        return _Retry(delay)


class _Core:
    """Configuration, state and flows shared by both faces (no I/O here)."""

    def __init__(
        self,
        base_urls: str | Sequence[str],
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout = 60.0,
        retry: RetryPolicy | None = None,
        retry_timeout: float | None = None,
        max_retries: int | None = None,
        max_client_batch: int | None = None,
        max_concurrency: int = 8,
        on_retry: Callable[[RetryEvent], None] | None = None,
        seed: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        protocol: str = "remote-reward",
        resolver: Resolver | None = None,
        resolve_interval: float = DEFAULT_RESOLVE_INTERVAL,
    ) -> None:
        if protocol not in protocols.PROTOCOLS:
            raise ValueError(
                f"protocol must be one of {', '.join(protocols.PROTOCOLS)}, got {protocol!r}"
            )
        #: The protocol spoken (``auto`` until the first call finds out).
        self.protocol = protocol
        if max_client_batch is not None and max_client_batch < 1:
            raise ValueError(f"max_client_batch must be >= 1, got {max_client_batch}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        policy = retry or RetryPolicy()
        if retry_timeout is not None:
            policy = dataclasses.replace(policy, timeout=retry_timeout)
        if max_retries is not None:
            policy = dataclasses.replace(policy, max_retries=max_retries)
        self.retry_policy = policy
        self.base_urls = normalise_urls(base_urls)
        self.timeout = httpx.Timeout(timeout)
        self.max_concurrency = max_concurrency
        self.on_retry = on_retry
        self._max_client_batch = max_client_batch
        self._vllm_found: protocols.VllmSpecials | None = None  # asked on the first vLLM call
        self._headers = {"Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._clock = clock
        # A URL that just failed like a dead server is avoided for new requests this long.
        pool = EndpointPool(
            self.base_urls, resolver=resolver, resolve_interval=resolve_interval, clock=clock
        )
        self._router = _Router(pool, max(policy.backoff_max, 1.0), clock)
        self._rng = random.Random(seed)
        # How each face executes an action; its methods of these names do the I/O.
        self._handlers: dict[type, Callable[[Any], Any]] = {
            _Send: self._send,
            _Resolve: self._resolve,
            _Sleep: self._pause,
            _Gather: self._gather,
        }

    @property
    def max_client_batch(self) -> int | None:
        """Items per request: configured, discovered from ``/info``, or None before discovery."""
        return self._max_client_batch

    def _limits(self) -> httpx.Limits:
        """Connection limits of an HTTP client this client creates itself."""
        n = self.max_concurrency * len(self.base_urls)
        if self._router.pool.dynamic:
            # As many servers as DNS names: no cap on connections (the calls' own
            # concurrency limits them), keep-alive for a few replicas per name.
            return httpx.Limits(max_connections=None, max_keepalive_connections=4 * n)
        return httpx.Limits(max_connections=n, max_keepalive_connections=n)

    def _request_args(self, send: _Send) -> dict[str, Any]:
        """Keyword arguments of ``httpx.Client.request`` for one attempt."""
        args = {
            "method": send.method,
            "url": send.url,
            "json": send.body,
            "headers": self._headers,
            "timeout": self.timeout,
        }
        target = send.target
        if target is not None and target.host is not None:  # an address found through DNS
            args["headers"] = {**self._headers, "Host": target.host}
            if target.server_name is not None:
                args["extensions"] = {"sni_hostname": target.server_name}
        return args

    def _act(self, action: _Action) -> Any:
        """Execute an action: its outcome (sync face) or an awaitable of it (async face)."""
        return self._handlers[type(action)](action)

    def _send(self, send: _Send) -> Any:
        raise NotImplementedError

    def _resolve(self, resolve: _Resolve) -> Any:
        raise NotImplementedError

    def _pause(self, sleep: _Sleep) -> Any:
        raise NotImplementedError

    def _gather(self, gather: _Gather) -> Any:
        raise NotImplementedError

    # --- flows ------------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: object | None = None) -> Flow[tuple[Any, str]]:
        """One logical request with failover and retries: the decoded JSON and who answered."""
        if self._router.pool.due():
            yield _Resolve()
        attempts = _Attempts(self, method, path)
        while True:
            url = attempts.sent()
            step = attempts.settle((yield _Send(method, url, body, attempts.target)))
            if not isinstance(step, _Retry):
                return step, url
            if step.delay > 0:
                yield _Sleep(step.delay)
            if self._router.pool.due():  # soon after a failure: the server may be gone
                yield _Resolve()

    def _info(self) -> Flow[dict[str, Any]]:
        """The server's ``GET /info`` answer."""
        info, url = yield from self._request("GET", "/info")
        if not isinstance(info, dict):
            raise RewardServerError(None, "invalid response: not a JSON object", url, method="GET")
        return info

    def _probe(self, path: str, body: object | None = None) -> Flow[object]:
        """``GET path``'s answer (POST ``body`` if given), or None where the server answers
        it with a 4xx."""
        try:
            answer, _ = yield from self._request("GET" if body is None else "POST", path, body)
        except RewardServerError as exc:
            if exc.status is None or exc.status >= 500:
                raise
            return None
        return answer

    def _protocol(self) -> Flow[str]:
        """The protocol to speak; ``auto`` asks the server once (its /info, vLLM's
        /v1/models) and logs what it found."""
        if self.protocol != "auto":
            return self.protocol
        info = yield from self._probe("/info")
        found = protocols.detect(info, None)
        if found is None:
            found = protocols.detect(info, (yield from self._probe("/v1/models")))
        if found is None:
            raise RewardClientError(
                f"cannot tell which reward protocol {self.base_urls[0]} speaks (no /info of "
                "this server or TEI, no vLLM /v1/models); pass protocol="
            )
        logger.info("reward server %s speaks %s (protocol auto)", self.base_urls[0], found)
        if self._max_client_batch is None:
            self._max_client_batch = protocols.chunk_size(info)
        self.protocol = found
        return found

    def _chunk_size(self) -> Flow[int]:
        """``max_client_batch``, asking the server once if it was not configured."""
        if self._max_client_batch is not None:
            return self._max_client_batch
        if self.protocol not in ("remote-reward", "tei"):  # no limit to ask for
            self._max_client_batch = DEFAULT_MAX_CLIENT_BATCH
            return DEFAULT_MAX_CLIENT_BATCH
        try:
            info: object = yield from self._info()
        except RewardServerError as exc:
            if exc.status != 404:
                raise
            info = None
        size = _find_max_client_batch(info) or protocols.chunk_size(info)
        if size is None:
            logger.warning(
                "reward server /info gives no max_client_batch; sending %d items per request",
                DEFAULT_MAX_CLIENT_BATCH,
            )
            size = DEFAULT_MAX_CLIENT_BATCH
        self._max_client_batch = size
        return size

    def _vllm_specials(self) -> Flow[protocols.VllmSpecials]:
        """What a vLLM server's tokenizer adds, asked once (its ``/tokenize``) and logged."""
        if self._vllm_found is None:
            (path, empty), (_, chat) = protocols.VLLM_PROBES
            answers = (yield from self._probe(path, empty)), (yield from self._probe(path, chat))
            self._vllm_found = protocols.vllm_specials(*answers)
            logger.info("vLLM server %s tokenizes with %s", self.base_urls[0], self._vllm_found)
        return self._vllm_found

    def _score_chunk(self, protocol: str, wire: protocols.WireRequest) -> Flow[ScoreResult]:
        payload, url = yield from self._request("POST", wire.path, wire.body)
        if protocol == "remote-reward":
            return _parse_scores(payload, wire.items, url)
        try:
            parsed = protocols.parse(protocol, payload, wire.items)
        except ValueError as exc:
            raise RewardServerError(None, f"invalid response: {exc}", url) from None
        return ScoreResult(parsed.scores, parsed.tokens, parsed.truncated)

    def _score(
        self, columns: dict[str, list[Any]], truncate: bool | None, fields: dict[str, Any]
    ) -> Flow[ScoreResult]:
        """Chunks of ``max_client_batch`` items (in the protocol's requests) sent
        concurrently, merged in input order; ``fields`` (model, components) go into each
        remote-reward request."""
        if not _body_len(columns):
            return ScoreResult([], [], [])
        protocol = yield from self._protocol()
        size = yield from self._chunk_size()
        specials = (yield from self._vllm_specials()) if protocol == "vllm" else None
        wires = protocols.requests(protocol, columns, size, truncate, fields, specials)
        results: list[ScoreResult] = yield _Gather([self._score_chunk(protocol, w) for w in wires])
        return _merge(results)


def _scores(flow: Flow[ScoreResult]) -> Flow[list[float]]:
    """Only the scores of a scoring flow."""
    result = yield from flow
    return result.scores


def _merge(results: Sequence[ScoreResult]) -> ScoreResult:
    """Concatenate per-chunk results in chunk order (the breakdown too)."""
    breakdown: dict[str, Any] = {}
    for key in _BREAKDOWN:
        parts = [getattr(r, key) for r in results]
        present = [p is not None for p in parts]
        if not any(present):
            continue
        if not all(present):
            raise RewardClientError(f"some chunks' answers have {key} and others not")
        if isinstance(parts[0], dict):
            names = list(parts[0])
            if any(list(p) != names for p in parts):
                raise RewardClientError(f"the chunks' answers name different {key}")
            breakdown[key] = {n: [v for p in parts for v in p[n]] for n in names}
        else:
            breakdown[key] = [v for p in parts for v in p]
    return ScoreResult(
        scores=[s for r in results for s in r.scores],
        tokens=[t for r in results for t in r.tokens],
        truncated=[t for r in results for t in r.truncated],
        **breakdown,
    )


def _request_fields(model: object, components: object) -> dict[str, Any]:
    """The ``model``/``components`` request fields that are set, checked."""
    fields: dict[str, Any] = {}
    if model is not None:
        if not isinstance(model, str) or not model:
            raise TypeError(f"model must be a model name (a non-empty str), got {model!r}")
        fields["model"] = model
    if components is not None:
        if not isinstance(components, bool):
            raise TypeError(f"components must be a bool, got {components!r}")
        fields["components"] = components
    return fields


def _body_len(body: Mapping[str, list[Any]]) -> int:
    return len(body.get("texts") or body.get("queries") or body.get("conversations") or [])


# --- the two faces ---------------------------------------------------------------------------

ResultT = TypeVar("ResultT")
ScoresT = TypeVar("ScoresT")
InfoT = TypeVar("InfoT")


class _Face(_Core, Generic[ResultT, ScoresT, InfoT]):
    """The public methods, once: each builds a flow and hands it to the face's ``_run``."""

    def _run(self, flow: Flow[Any]) -> Any:
        raise NotImplementedError

    def info(self) -> InfoT:
        """The server's ``GET /info`` answer."""
        return self._run(self._info())

    def _score_inputs(self, inputs: ScoreInputs) -> Flow[ScoreResult]:
        fields = _request_fields(inputs.get("model"), inputs.get("components"))
        return self._score(_columns(inputs), inputs.get("truncate"), fields)

    def score_detailed(self, **inputs: Unpack[ScoreInputs]) -> ResultT:
        """Scores, token counts, truncation flags and the server's breakdown (components,
        objectives, steps) for one input form, in input order."""
        return self._run(self._score_inputs(inputs))

    def score(self, **inputs: Unpack[ScoreInputs]) -> ScoresT:
        """Scores for one input form (texts, query/response pairs or conversations)."""
        return self._run(_scores(self._score_inputs(inputs)))

    def score_pairs_detailed(
        self,
        prompts: Sequence[Prompt],
        responses: Sequence[str],
        *,
        model: str | None = None,
        components: bool | None = None,
    ) -> ResultT:
        """Like :meth:`__call__` but with token counts, truncation flags and the breakdown;
        ``model`` and ``components`` as in :class:`ScoreInputs`."""
        fields = _request_fields(model, components)
        flow = self._score(_pair_columns(prompts, responses), None, fields)
        return self._run(flow)

    def __call__(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> ScoresT:
        """Reward callable: text prompts as query/response pairs, chat prompts as conversations."""
        flow = _scores(self._score(_pair_columns(prompts, responses), None, {}))
        return self._run(flow)


class RewardClient(_Face[ScoreResult, list[float], dict[str, Any]]):
    """Blocking client for the reward server; chunks run concurrently on a thread pool.

    Also a reward callable ``(prompts, responses) -> list[float]`` for the PPO trainer.
    ``http_client`` (the test seam; a Starlette ``TestClient`` works) is used as given and
    not closed by :meth:`close`. ``sleep`` replaces :func:`time.sleep` between retries. The
    other options are those of :class:`ClientOptions`.
    """

    def __init__(
        self,
        base_urls: str | Sequence[str],
        api_key: str | None = None,
        *,
        http_client: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
        **options: Unpack[ClientOptions],
    ) -> None:
        super().__init__(base_urls, api_key, **options)
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(timeout=self.timeout, limits=self._limits())
        self._sleep = sleep
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker threads and close the HTTP client if this client created it.

        A call still waiting to retry, on any thread, wakes up and raises RewardClientError
        at once, so that no retry outlives the client (a trainer stopped by Ctrl-C closes
        its client while a reward call may be waiting for a server that is gone)."""
        self._closed.set()
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if self._owns_http:
            self._http.close()

    def _run(self, flow: Flow[T], stop: threading.Event | None = None) -> T:
        """Execute ``flow``'s actions until it returns; give up early once ``stop`` is set."""
        with contextlib.closing(flow):
            done, value = _advance(flow, None)
            while not done:
                if stop is not None and stop.is_set():
                    raise CancelledError  # a sibling chunk failed: the call is lost anyway
                self._check_open()
                done, value = _advance(flow, self._act(value))
            return value

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise RewardClientError("the reward client was closed")

    def _send(self, send: _Send) -> httpx.Response | httpx.TransportError:
        try:
            return self._http.request(**self._request_args(send))
        except httpx.TransportError as exc:
            return exc

    def _resolve(self, resolve: _Resolve) -> None:
        self._router.pool.refresh()

    def _pause(self, sleep: _Sleep) -> None:
        if self._sleep is time.sleep:
            self._closed.wait(sleep.seconds)  # close() ends the pause
        else:
            self._sleep(sleep.seconds)
        self._check_open()

    def _gather(self, gather: _Gather) -> list[Any]:
        if len(gather.flows) == 1:
            return [self._run(gather.flows[0])]
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_concurrency, "reward-client")
            pool = self._pool
        stop = threading.Event()
        futures = [pool.submit(self._run, flow, stop) for flow in gather.flows]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
            return _results(futures)
        finally:
            stop.set()
            for future in futures:
                future.cancel()


class AsyncRewardClient(
    _Face[
        Coroutine[Any, Any, ScoreResult],
        Coroutine[Any, Any, list[float]],
        Coroutine[Any, Any, dict[str, Any]],
    ]
):
    """Asyncio client for the reward server; chunks run concurrently as tasks.

    Same options as :class:`RewardClient`; ``http_client`` is an ``httpx.AsyncClient``
    (one with an ``httpx.ASGITransport`` talks to an app in process) and ``sleep`` a
    coroutine function replacing :func:`asyncio.sleep`. Its methods return coroutines.
    """

    def __init__(
        self,
        base_urls: str | Sequence[str],
        api_key: str | None = None,
        *,
        http_client: httpx.AsyncClient | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        **options: Unpack[ClientOptions],
    ) -> None:
        super().__init__(base_urls, api_key, **options)
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(timeout=self.timeout, limits=self._limits())
        self._sleep = sleep

    async def __aenter__(self) -> AsyncRewardClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP client if this client created it."""
        if self._owns_http:
            await self._http.aclose()

    async def _run(self, flow: Flow[T]) -> T:
        """Execute ``flow``'s actions until it returns."""
        with contextlib.closing(flow):
            done, value = _advance(flow, None)
            while not done:
                done, value = _advance(flow, await self._act(value))
            return value

    async def _send(self, send: _Send) -> httpx.Response | httpx.TransportError:
        try:
            return await self._http.request(**self._request_args(send))
        except httpx.TransportError as exc:
            return exc

    async def _resolve(self, resolve: _Resolve) -> None:
        # getaddrinfo blocks: off the event loop.
        await asyncio.to_thread(self._router.pool.refresh)

    async def _pause(self, sleep: _Sleep) -> None:
        await self._sleep(sleep.seconds)

    async def _gather(self, gather: _Gather) -> list[Any]:
        # A semaphore per call: asyncio primitives must not be shared across event loops.
        limit = asyncio.Semaphore(self.max_concurrency)

        async def run(flow: Flow[Any]) -> Any:
            async with limit:
                return await self._run(flow)

        tasks = [asyncio.ensure_future(run(flow)) for flow in gather.flows]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            return _results(tasks)
        finally:
            for task in tasks:
                task.cancel()

    async def __call__(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> list[float]:
        """Reward callable: text prompts as query/response pairs, chat prompts as conversations."""
        return await super().__call__(prompts, responses)
