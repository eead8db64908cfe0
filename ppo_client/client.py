"""HTTP clients for the reward server: chunking, concurrency, failover, retries.

Exceptions::

    RewardClientError            base of everything this module raises on purpose
    └── RewardServerError        a call finally failed (status, message, url)

Both clients split a call into chunks of the server's ``max_client_batch``, send the chunks
concurrently, spread them round-robin over the base URLs, retry connection errors,
timeouts, 5xx and 429 (another URL first, then capped exponential backoff with full
jitter, or the server's ``Retry-After``), never retry any other 4xx, and return scores in
input order.
"""

from __future__ import annotations

import asyncio
import email.utils
import itertools
import json
import logging
import math
import random
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, TypeAlias

import httpx

__all__ = [
    "AsyncRewardClient",
    "RetryPolicy",
    "RewardClient",
    "RewardClientError",
    "RewardServerError",
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
    """A request to the reward server finally failed; ``str()`` names the URL and the cause."""

    def __init__(
        self,
        status: int | None,
        message: str,
        url: str | None,
        *,
        method: str = "POST",
        attempts: int = 1,
        tried: Sequence[str] = (),
    ) -> None:
        self.status = status
        self.message = message
        self.url = url
        self.method = method
        self.attempts = attempts
        self.tried = tuple(tried)
        super().__init__(self._describe())

    def _describe(self) -> str:
        """One line: what was requested, how often, and why it failed."""
        cause = f"HTTP {self.status}: {self.message}" if self.status else self.message
        where = f"{self.method} {self.url}" if self.url else self.method
        times = f" after {self.attempts} attempts" if self.attempts > 1 else ""
        others = [u for u in dict.fromkeys(self.tried) if u != self.url]
        also = f" (also tried {', '.join(others)})" if others else ""
        return f"{where} failed{times}: {cause}{also}"


@dataclass(frozen=True)
class ScoreResult:
    """Scores in input order, with the number of tokens scored and truncation per item."""

    scores: list[float]
    tokens: list[int]
    truncated: list[bool]

    def __len__(self) -> int:
        return len(self.scores)

    @property
    def truncated_frac(self) -> float:
        """Fraction of items the server truncated (0.0 for an empty result)."""
        return sum(self.truncated) / len(self.truncated) if self.truncated else 0.0


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how long to retry a failed request.

    ``max_retries`` counts requests after the first. A failure moves to the next base URL
    at once while some URL has not been tried since the last pause; once every URL failed,
    the client pauses for the server's ``Retry-After`` (capped at ``max_retry_after``, then
    lengthened by up to ``retry_after_jitter`` of itself, so that the many clients a busy
    server turned away at once do not all come back at the same instant) or for a
    full-jitter exponential backoff ``uniform(0, min(backoff_max, backoff_base * 2**k))``
    where ``k`` counts the pauses so far.
    """

    max_retries: int = 5
    backoff_base: float = 0.25
    backoff_max: float = 10.0
    max_retry_after: float = 60.0
    retry_after_jitter: float = 0.1

    def __post_init__(self) -> None:
        if self.max_retries < 0:
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
class _Retry:
    """Try again after ``delay`` seconds (0: at once, on the next URL)."""

    delay: float


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
    )


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


def _columns(
    texts: Sequence[str] | None,
    queries: Sequence[str] | None,
    responses: Sequence[str] | None,
    conversations: Sequence[Conversation] | None,
) -> dict[str, list[Any]]:
    """Check that exactly one input form is given and return its columns as lists."""
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


def _chunks(columns: dict[str, list[Any]], size: int) -> list[dict[str, list[Any]]]:
    """Split the columns into request bodies of at most ``size`` items each."""
    n = len(next(iter(columns.values())))
    return [{k: v[start : start + size] for k, v in columns.items()} for start in range(0, n, size)]


def _normalise_urls(base_urls: str | Sequence[str]) -> list[str]:
    """Base URLs without trailing slashes; at least one, each http(s)."""
    urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
    if not urls:
        raise ValueError("at least one base URL is needed")
    out = []
    for url in urls:
        url = url.strip().rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"base URL must start with http:// or https://, got {url!r}")
        out.append(url)
    return out


class _Router:
    """Round-robin start URLs, preferring those that have not just failed (thread-safe)."""

    def __init__(self, urls: list[str], down_for: float) -> None:
        self.urls = urls
        self._down_for = down_for
        self._down_until: dict[str, float] = {}
        self._counter = itertools.count()
        self._lock = threading.Lock()

    def start_index(self) -> int:
        """Index of the URL a new request starts on."""
        with self._lock:
            turn = next(self._counter)
            now = time.monotonic()
            up = [i for i, u in enumerate(self.urls) if self._down_until.get(u, 0.0) <= now]
            pool = up or list(range(len(self.urls)))
            return pool[turn % len(pool)]

    def mark(self, url: str, *, ok: bool) -> None:
        """Remember that ``url`` answered (ok) or failed like a server that is down."""
        with self._lock:
            if ok:
                self._down_until.pop(url, None)
            else:
                self._down_until[url] = time.monotonic() + self._down_for


class _Attempts:
    """The retry and failover decisions for one logical request (sans I/O)."""

    def __init__(
        self,
        router: _Router,
        policy: RetryPolicy,
        rng: random.Random,
        method: str,
        path: str,
    ) -> None:
        self._router = router
        self._policy = policy
        self._rng = rng
        self.method = method
        self.path = path
        self._index = router.start_index()
        self._failed_since_pause = 0
        self._pauses = 0
        self.attempts = 0
        self._tried: list[str] = []

    @property
    def url(self) -> str:
        """Full URL of the next attempt."""
        return self._router.urls[self._index] + self.path

    def sent(self) -> None:
        """Count an attempt about to be made."""
        self.attempts += 1
        self._tried.append(self.url)

    def failed(self, exc: httpx.TransportError) -> _Retry:
        """A transport error (connection, timeout, protocol): retry or raise."""
        if isinstance(exc, httpx.TimeoutException):
            cause = f"timed out ({type(exc).__name__})"
        else:
            cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        if isinstance(exc, httpx.UnsupportedProtocol):
            raise RewardServerError(None, cause, self.url, method=self.method) from exc
        self._router.mark(self._router.urls[self._index], ok=False)
        return self._retry(None, cause, None, exc)

    def received(self, response: httpx.Response) -> Any:
        """The decoded JSON of a 2xx answer, a _Retry, or raise for a final error."""
        status = response.status_code
        base = self._router.urls[self._index]
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

    def _retry(
        self,
        status: int | None,
        cause: str,
        retry_after: float | None,
        exc: BaseException | None,
    ) -> _Retry:
        """Move to the next URL; pause once every URL failed since the last pause."""
        failed_url = self.url
        if self.attempts > self._policy.max_retries:
            raise RewardServerError(
                status,
                cause,
                failed_url,
                method=self.method,
                attempts=self.attempts,
                tried=self._tried,
            ) from exc
        self._index = (self._index + 1) % len(self._router.urls)
        self._failed_since_pause += 1
        delay = 0.0
        if self._failed_since_pause >= len(self._router.urls):
            self._failed_since_pause = 0
            if retry_after is not None:
                delay = self._policy.after_retry_after(retry_after, self._rng)
            else:
                delay = self._policy.backoff(self._pauses, self._rng)
            self._pauses += 1
        level = logging.INFO if status == 429 else logging.WARNING
        what = f"HTTP {status}: {cause}" if status else cause
        logger.log(
            level,
            "%s %s failed (attempt %d of %d): %s; retrying %s in %.3fs",
            self.method,
            failed_url,
            self.attempts,
            self._policy.max_retries + 1,
            what,
            self.url,
            delay,
        )
        return _Retry(delay)


class _ClientBase:
    """Configuration shared by the sync and async clients."""

    def __init__(
        self,
        base_urls: str | Sequence[str],
        api_key: str | None,
        timeout: float | httpx.Timeout,
        max_retries: int,
        *,
        max_client_batch: int | None,
        max_concurrency: int,
        backoff_base: float,
        backoff_max: float,
        max_retry_after: float,
        seed: int | None,
    ) -> None:
        if max_client_batch is not None and max_client_batch < 1:
            raise ValueError(f"max_client_batch must be >= 1, got {max_client_batch}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.base_urls = _normalise_urls(base_urls)
        self.timeout = httpx.Timeout(timeout)
        self.retry_policy = RetryPolicy(
            max_retries=max_retries,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            max_retry_after=max_retry_after,
        )
        self.max_concurrency = max_concurrency
        self._max_client_batch = max_client_batch
        self._headers = {"Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        # A URL that just failed like a dead server is avoided for new requests this long.
        self._router = _Router(self.base_urls, down_for=max(backoff_max, 1.0))
        self._rng = random.Random(seed)

    @property
    def max_client_batch(self) -> int | None:
        """Items per request: configured, discovered from ``/info``, or None before discovery."""
        return self._max_client_batch

    def _attempts(self, method: str, path: str) -> _Attempts:
        return _Attempts(self._router, self.retry_policy, self._rng, method, path)

    def _set_chunk_size(self, info: object) -> int:
        """Cache ``max_client_batch`` from an ``/info`` answer (or the default)."""
        size = _find_max_client_batch(info)
        if size is None:
            logger.warning(
                "reward server /info gives no max_client_batch; sending %d items per request",
                DEFAULT_MAX_CLIENT_BATCH,
            )
            size = DEFAULT_MAX_CLIENT_BATCH
        self._max_client_batch = size
        return size

    def _bodies(self, columns: dict[str, list[Any]], size: int, truncate: bool | None) -> list:
        bodies: list[dict[str, Any]] = _chunks(columns, size)
        if truncate is not None:
            for body in bodies:
                body["truncate"] = truncate
        return bodies


def _merge(results: Sequence[ScoreResult]) -> ScoreResult:
    """Concatenate per-chunk results in chunk order."""
    return ScoreResult(
        scores=[s for r in results for s in r.scores],
        tokens=[t for r in results for t in r.tokens],
        truncated=[t for r in results for t in r.truncated],
    )


def _body_len(body: Mapping[str, list[Any]]) -> int:
    return len(body.get("texts") or body.get("queries") or body.get("conversations") or [])


class RewardClient(_ClientBase):
    """Blocking client for the reward server; chunks run concurrently on a thread pool.

    Also a reward callable ``(prompts, responses) -> list[float]`` for the PPO trainer.
    ``http_client`` (the test seam) is used as given and not closed by :meth:`close`;
    ``timeout`` applies to every request, also through a passed-in ``http_client``.
    ``sleep`` replaces :func:`time.sleep` between retries; ``seed`` seeds the jitter.
    """

    def __init__(
        self,
        base_urls: str | Sequence[str],
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 60.0,
        max_retries: int = 5,
        http_client: httpx.Client | None = None,
        *,
        max_client_batch: int | None = None,
        max_concurrency: int = 8,
        backoff_base: float = 0.25,
        backoff_max: float = 10.0,
        max_retry_after: float = 60.0,
        seed: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(
            base_urls,
            api_key,
            timeout,
            max_retries,
            max_client_batch=max_client_batch,
            max_concurrency=max_concurrency,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            max_retry_after=max_retry_after,
            seed=seed,
        )
        self._owns_http = http_client is None
        self._http = http_client or httpx.Client(
            timeout=self.timeout,
            limits=httpx.Limits(
                max_connections=max_concurrency * len(self.base_urls),
                max_keepalive_connections=max_concurrency * len(self.base_urls),
            ),
        )
        self._sleep = sleep
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._discovery_lock = threading.Lock()

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker threads and close the HTTP client if this client created it."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if self._owns_http:
            self._http.close()

    def _request(self, method: str, path: str, body: object | None = None) -> tuple[Any, str]:
        """One logical request with failover and retries: the decoded JSON and who answered."""
        attempts = self._attempts(method, path)
        while True:
            attempts.sent()
            try:
                response = self._http.request(
                    method, attempts.url, json=body, headers=self._headers, timeout=self.timeout
                )
            except httpx.TransportError as exc:
                step = attempts.failed(exc)
            else:
                step = attempts.received(response)
            if not isinstance(step, _Retry):
                return step, attempts.url
            if step.delay > 0:
                self._sleep(step.delay)

    def info(self) -> dict[str, Any]:
        """The server's ``GET /info`` answer."""
        info, url = self._request("GET", "/info")
        if not isinstance(info, dict):
            raise RewardServerError(None, "invalid response: not a JSON object", url, method="GET")
        return info

    def _chunk_size(self) -> int:
        """``max_client_batch``, asking the server once if it was not configured."""
        with self._discovery_lock:
            if self._max_client_batch is not None:
                return self._max_client_batch
            try:
                info: object = self.info()
            except RewardServerError as exc:
                if exc.status != 404:
                    raise
                info = None
            return self._set_chunk_size(info)

    def _score_chunk(self, body: dict[str, Any]) -> ScoreResult:
        payload, url = self._request("POST", "/score", body)
        return _parse_scores(payload, _body_len(body), url)

    def _executor(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.max_concurrency, "reward-client")
            return self._pool

    def _score_columns(self, columns: dict[str, list[Any]], truncate: bool | None) -> ScoreResult:
        if not _body_len(columns):
            return ScoreResult([], [], [])
        bodies = self._bodies(columns, self._chunk_size(), truncate)
        if len(bodies) == 1:
            return self._score_chunk(bodies[0])
        pool = self._executor()
        futures: list[Future[ScoreResult]] = [pool.submit(self._score_chunk, b) for b in bodies]
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        for future in futures:
            if future in done and future.exception() is not None:
                for other in pending:
                    other.cancel()
                raise future.exception()  # type: ignore[misc]
        return _merge([f.result() for f in futures])

    def score_detailed(
        self,
        *,
        texts: Sequence[str] | None = None,
        queries: Sequence[str] | None = None,
        responses: Sequence[str] | None = None,
        conversations: Sequence[Conversation] | None = None,
        truncate: bool | None = None,
    ) -> ScoreResult:
        """Scores, token counts and truncation flags for one input form, in input order."""
        columns = _columns(texts, queries, responses, conversations)
        return self._score_columns(columns, truncate)

    def score(
        self,
        *,
        texts: Sequence[str] | None = None,
        queries: Sequence[str] | None = None,
        responses: Sequence[str] | None = None,
        conversations: Sequence[Conversation] | None = None,
        truncate: bool | None = None,
    ) -> list[float]:
        """Scores for one input form (texts, query/response pairs or conversations)."""
        return self.score_detailed(
            texts=texts,
            queries=queries,
            responses=responses,
            conversations=conversations,
            truncate=truncate,
        ).scores

    def score_pairs_detailed(
        self, prompts: Sequence[Prompt], responses: Sequence[str]
    ) -> ScoreResult:
        """Like :meth:`__call__` but with token counts and truncation flags."""
        return self._score_columns(_pair_columns(prompts, responses), None)

    def __call__(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> list[float]:
        """Reward callable: text prompts as query/response pairs, chat prompts as conversations."""
        return self.score_pairs_detailed(prompts, responses).scores


class AsyncRewardClient(_ClientBase):
    """Asyncio client for the reward server; chunks run concurrently under a semaphore.

    Same arguments as :class:`RewardClient`; ``http_client`` is an ``httpx.AsyncClient``
    and ``sleep`` a coroutine function replacing :func:`asyncio.sleep`.
    """

    def __init__(
        self,
        base_urls: str | Sequence[str],
        api_key: str | None = None,
        timeout: float | httpx.Timeout = 60.0,
        max_retries: int = 5,
        http_client: httpx.AsyncClient | None = None,
        *,
        max_client_batch: int | None = None,
        max_concurrency: int = 8,
        backoff_base: float = 0.25,
        backoff_max: float = 10.0,
        max_retry_after: float = 60.0,
        seed: int | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        super().__init__(
            base_urls,
            api_key,
            timeout,
            max_retries,
            max_client_batch=max_client_batch,
            max_concurrency=max_concurrency,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            max_retry_after=max_retry_after,
            seed=seed,
        )
        self._owns_http = http_client is None
        self._http = http_client or httpx.AsyncClient(
            timeout=self.timeout,
            limits=httpx.Limits(
                max_connections=max_concurrency * len(self.base_urls),
                max_keepalive_connections=max_concurrency * len(self.base_urls),
            ),
        )
        self._sleep = sleep

    async def __aenter__(self) -> AsyncRewardClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the HTTP client if this client created it."""
        if self._owns_http:
            await self._http.aclose()

    async def _request(self, method: str, path: str, body: object | None = None) -> tuple[Any, str]:
        """One logical request with failover and retries: the decoded JSON and who answered."""
        attempts = self._attempts(method, path)
        while True:
            attempts.sent()
            try:
                response = await self._http.request(
                    method, attempts.url, json=body, headers=self._headers, timeout=self.timeout
                )
            except httpx.TransportError as exc:
                step = attempts.failed(exc)
            else:
                step = attempts.received(response)
            if not isinstance(step, _Retry):
                return step, attempts.url
            if step.delay > 0:
                await self._sleep(step.delay)

    async def info(self) -> dict[str, Any]:
        """The server's ``GET /info`` answer."""
        info, url = await self._request("GET", "/info")
        if not isinstance(info, dict):
            raise RewardServerError(None, "invalid response: not a JSON object", url, method="GET")
        return info

    async def _chunk_size(self) -> int:
        """``max_client_batch``, asking the server once if it was not configured."""
        if self._max_client_batch is not None:
            return self._max_client_batch
        try:
            info: object = await self.info()
        except RewardServerError as exc:
            if exc.status != 404:
                raise
            info = None
        return self._set_chunk_size(info)

    async def _score_chunk(self, body: dict[str, Any], limit: asyncio.Semaphore) -> ScoreResult:
        async with limit:
            payload, url = await self._request("POST", "/score", body)
        return _parse_scores(payload, _body_len(body), url)

    async def _score_columns(
        self, columns: dict[str, list[Any]], truncate: bool | None
    ) -> ScoreResult:
        if not _body_len(columns):
            return ScoreResult([], [], [])
        bodies = self._bodies(columns, await self._chunk_size(), truncate)
        # A semaphore per call: asyncio primitives must not be shared across event loops.
        limit = asyncio.Semaphore(self.max_concurrency)
        tasks = [asyncio.ensure_future(self._score_chunk(b, limit)) for b in bodies]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            # Retrieve every finished task's exception (so none is reported as unretrieved),
            # then raise the first in chunk order.
            errors = [t.exception() for t in tasks if t in done and not t.cancelled()]
            for error in errors:
                if error is not None:
                    raise error
            return _merge([t.result() for t in tasks])
        finally:
            for task in tasks:
                task.cancel()

    async def score_detailed(
        self,
        *,
        texts: Sequence[str] | None = None,
        queries: Sequence[str] | None = None,
        responses: Sequence[str] | None = None,
        conversations: Sequence[Conversation] | None = None,
        truncate: bool | None = None,
    ) -> ScoreResult:
        """Scores, token counts and truncation flags for one input form, in input order."""
        columns = _columns(texts, queries, responses, conversations)
        return await self._score_columns(columns, truncate)

    async def score(
        self,
        *,
        texts: Sequence[str] | None = None,
        queries: Sequence[str] | None = None,
        responses: Sequence[str] | None = None,
        conversations: Sequence[Conversation] | None = None,
        truncate: bool | None = None,
    ) -> list[float]:
        """Scores for one input form (texts, query/response pairs or conversations)."""
        result = await self.score_detailed(
            texts=texts,
            queries=queries,
            responses=responses,
            conversations=conversations,
            truncate=truncate,
        )
        return result.scores

    async def score_pairs_detailed(
        self, prompts: Sequence[Prompt], responses: Sequence[str]
    ) -> ScoreResult:
        """Like :meth:`__call__` but with token counts and truncation flags."""
        return await self._score_columns(_pair_columns(prompts, responses), None)

    async def __call__(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> list[float]:
        """Reward callable: text prompts as query/response pairs, chat prompts as conversations."""
        return (await self.score_pairs_detailed(prompts, responses)).scores
