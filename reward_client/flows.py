"""The sans-I/O core of both clients: actions, flows and the configuration they share.

One implementation, two faces. What a call does (discover the chunk size, split, send,
decide on each failure whether and when to try again and where) is written once as
*flows*: generators that yield actions (:class:`Send` a request, :class:`Sleep`,
:class:`Gather` sub-flows concurrently, :class:`Resolve` the ``dns+`` names again) and get
back their outcomes, without doing any I/O themselves. :class:`Core` holds the flows and
the state they share (router, retry policy, discovered protocol and chunk size); each face
in :mod:`reward_client.client` executes the actions its own way: the blocking
``RewardClient`` with an ``httpx.Client``, ``time.sleep`` and a thread pool, the
``AsyncRewardClient`` with an ``httpx.AsyncClient``, ``asyncio.sleep`` and tasks.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import ssl
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

import httpx

from reward_client import wire
from reward_client.attempts import Attempts, Retry
from reward_client.errors import RewardClientError, RewardServerError
from reward_client.inputs import item_count
from reward_client.options import DEFAULT_MAX_CLIENT_BATCH, DEFAULT_MAX_CONCURRENCY
from reward_client.results import RetryEvent, ScoreResult, merge
from reward_client.retry import RetryPolicy
from reward_client.routing import Router
from reward_client.targets import (
    DEFAULT_RESOLVE_INTERVAL,
    EndpointPool,
    Resolver,
    Target,
    normalise_urls,
)
from reward_client.wire.remote_reward import find_max_client_batch

__all__ = ["Action", "Core", "Flow", "Gather", "Resolve", "Send", "Sleep", "advance", "results"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Send:
    """Send one HTTP request; the outcome is the ``httpx.Response`` or the transport error."""

    method: str
    url: str
    body: object | None
    #: The server it goes to (its Host header and TLS name for an address found by DNS).
    target: Target | None = None


@dataclass(frozen=True, slots=True)
class Resolve:
    """Resolve the ``dns+`` base URLs again (blocking I/O); the outcome is None."""


@dataclass(frozen=True, slots=True)
class Sleep:
    """Pause; the outcome is None."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Gather:
    """Run the flows concurrently; the outcome is their results in order (or the first error)."""

    flows: list[Flow[Any]]


Action: TypeAlias = "Send | Resolve | Sleep | Gather"
T = TypeVar("T")
#: A computation that yields actions, is sent their outcomes, and returns a ``T``.
Flow: TypeAlias = Generator[Action, Any, T]


def advance(flow: Flow[Any], outcome: object) -> tuple[bool, Any]:
    """Send ``outcome`` into ``flow``: (False, next action) or (True, the flow's result)."""
    try:
        return False, flow.send(outcome)
    except StopIteration as stop:
        return True, stop.value


def results(futures: Sequence[Any]) -> list[Any]:
    """Results of finished futures or tasks in order; else the first error in chunk order."""
    # Every finished one's exception is retrieved, so that asyncio reports none as unretrieved.
    errors = [f.exception() for f in futures if f.done() and not f.cancelled()]
    for error in errors:
        if error is not None:
            raise error
    return [f.result() for f in futures]


def scores(flow: Flow[ScoreResult]) -> Flow[list[float]]:
    """Only the scores of a scoring flow."""
    result = yield from flow
    return result.scores


#: How https servers are checked: True (the system's or certifi's CAs, or $SSL_CERT_FILE),
#: False (not at all), a CA bundle file or folder, or an ``ssl.SSLContext``.
Verify: TypeAlias = "bool | str | os.PathLike[str] | ssl.SSLContext"


def tls_verify(verify: Verify) -> bool | ssl.SSLContext:
    """``verify`` as httpx takes it: a CA bundle path becomes an ``ssl.SSLContext`` (httpx
    0.28 deprecates paths); True, False and contexts are kept."""
    if isinstance(verify, bool | ssl.SSLContext):
        return verify
    if not isinstance(verify, str | os.PathLike):
        raise TypeError(
            f"verify must be a bool, a CA bundle path or an ssl.SSLContext, got {verify!r}"
        )
    path = os.fspath(verify)
    try:
        if os.path.isdir(path):
            return ssl.create_default_context(capath=path)
        return ssl.create_default_context(cafile=path)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"verify: cannot load the CA bundle {path!r}: {exc}") from None


def _policy(
    retry: RetryPolicy | None, retry_timeout: float | None, max_retries: int | None
) -> RetryPolicy:
    """The retry policy with ``retry_timeout`` and ``max_retries`` applied when given."""
    policy = retry or RetryPolicy()
    if retry_timeout is not None:
        policy = dataclasses.replace(policy, timeout=retry_timeout)
    if max_retries is not None:
        policy = dataclasses.replace(policy, max_retries=max_retries)
    return policy


class Core:
    """Configuration, state and flows shared by both faces (no I/O here).

    A face implements ``_send``, ``_resolve``, ``_pause`` and ``_gather``: each executes
    one kind of action and returns its outcome (sync face) or an awaitable of it (async).
    """

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
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        on_retry: Callable[[RetryEvent], None] | None = None,
        seed: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        protocol: str = "remote-reward",
        resolver: Resolver | None = None,
        resolve_interval: float = DEFAULT_RESOLVE_INTERVAL,
        verify: Verify = True,
    ) -> None:
        if protocol not in wire.PROTOCOLS:
            raise ValueError(
                f"protocol must be one of {', '.join(wire.PROTOCOLS)}, got {protocol!r}"
            )
        #: The protocol spoken (``auto`` until the first call finds out).
        self.protocol = protocol
        if max_client_batch is not None and max_client_batch < 1:
            raise ValueError(f"max_client_batch must be >= 1, got {max_client_batch}")
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.retry_policy = _policy(retry, retry_timeout, max_retries)
        self.base_urls = normalise_urls(base_urls)
        self.timeout = httpx.Timeout(timeout)
        #: What the HTTP client this client creates checks https servers with (httpx's
        #: ``verify``: True, False or an ``ssl.SSLContext``).
        self.verify = tls_verify(verify)
        self.max_concurrency = max_concurrency
        self.on_retry = on_retry
        self._max_client_batch = max_client_batch
        self._vllm_found: wire.VllmSpecials | None = None  # asked on the first vLLM call
        self._headers = {"Accept": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._clock = clock
        pool = EndpointPool(
            self.base_urls, resolver=resolver, resolve_interval=resolve_interval, clock=clock
        )
        # A URL that just failed like a dead server is avoided for new requests this long.
        self._router = Router(pool, max(self.retry_policy.backoff_max, 1.0), clock)
        self._rng = random.Random(seed)
        # How each face executes an action; its methods of these names do the I/O.
        self._handlers: dict[type, Callable[[Any], Any]] = {
            Send: self._send,
            Resolve: self._resolve,
            Sleep: self._pause,
            Gather: self._gather,
        }

    @property
    def max_client_batch(self) -> int | None:
        """Items per request: configured, discovered from ``/info``, or None before discovery."""
        return self._max_client_batch

    def _http_options(self) -> dict[str, Any]:
        """Keyword arguments of an HTTP client this client creates itself (sync or async)."""
        return {"timeout": self.timeout, "limits": self._limits(), "verify": self.verify}

    def _limits(self) -> httpx.Limits:
        """Connection limits of an HTTP client this client creates itself."""
        n = self.max_concurrency * len(self.base_urls)
        if self._router.pool.dynamic:
            # As many servers as DNS names: no cap on connections (the calls' own
            # concurrency limits them), keep-alive for a few replicas per name.
            return httpx.Limits(max_connections=None, max_keepalive_connections=4 * n)
        return httpx.Limits(max_connections=n, max_keepalive_connections=n)

    def _request_args(self, send: Send) -> dict[str, Any]:
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

    def _act(self, action: Action) -> Any:
        """Execute an action: its outcome (sync face) or an awaitable of it (async face)."""
        return self._handlers[type(action)](action)

    def _send(self, send: Send) -> Any:
        raise NotImplementedError

    def _resolve(self, resolve: Resolve) -> Any:
        raise NotImplementedError

    def _pause(self, sleep: Sleep) -> Any:
        raise NotImplementedError

    def _gather(self, gather: Gather) -> Any:
        raise NotImplementedError

    # --- flows ------------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: object | None = None) -> Flow[tuple[Any, str]]:
        """One logical request with failover and retries: the decoded JSON and who answered."""
        if self._router.pool.due():
            yield Resolve()
        attempts = Attempts(
            method,
            path,
            router=self._router,
            policy=self.retry_policy,
            clock=self._clock,
            rng=self._rng,
            on_retry=self.on_retry,
        )
        while True:
            url = attempts.sent()
            step = attempts.settle((yield Send(method, url, body, attempts.target)))
            if not isinstance(step, Retry):
                return step, url
            if step.delay > 0:
                yield Sleep(step.delay)
            if self._router.pool.due():  # soon after a failure: the server may be gone
                yield Resolve()

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
        found = wire.detect(info, None)
        if found is None:
            found = wire.detect(info, (yield from self._probe("/v1/models")))
        if found is None:
            raise RewardClientError(
                f"cannot tell which reward protocol {self.base_urls[0]} speaks (no /info of "
                "this server or TEI, no vLLM /v1/models); pass protocol="
            )
        logger.info("reward server %s speaks %s (protocol auto)", self.base_urls[0], found)
        if self._max_client_batch is None:
            self._max_client_batch = wire.chunk_size(info)
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
        size = find_max_client_batch(info) or wire.chunk_size(info)
        if size is None:
            logger.warning(
                "reward server /info gives no max_client_batch; sending %d items per request",
                DEFAULT_MAX_CLIENT_BATCH,
            )
            size = DEFAULT_MAX_CLIENT_BATCH
        self._max_client_batch = size
        return size

    def _vllm_specials(self) -> Flow[wire.VllmSpecials]:
        """What a vLLM server's tokenizer adds, asked once (its ``/tokenize``) and logged."""
        if self._vllm_found is None:
            (path, empty), (_, chat) = wire.VLLM_PROBES
            answers = (yield from self._probe(path, empty)), (yield from self._probe(path, chat))
            self._vllm_found = wire.vllm_specials(*answers)
            logger.info("vLLM server %s tokenizes with %s", self.base_urls[0], self._vllm_found)
        return self._vllm_found

    def _score_chunk(self, protocol: str, request: wire.WireRequest) -> Flow[ScoreResult]:
        """One request's answer, parsed in ``protocol``."""
        payload, url = yield from self._request("POST", request.path, request.body)
        try:
            return wire.parse(protocol, payload, request.items)
        except ValueError as exc:
            raise RewardServerError(None, f"invalid response: {exc}", url) from None

    def _score(
        self, columns: dict[str, list[Any]], truncate: bool | None, fields: dict[str, Any]
    ) -> Flow[ScoreResult]:
        """Chunks of ``max_client_batch`` items (in the protocol's requests, each with its
        labels) sent concurrently, merged in input order; ``fields`` (model, components) go
        into each remote-reward request."""
        if not item_count(columns):
            return ScoreResult([], [], [])
        protocol = yield from self._protocol()
        wire.check(protocol, columns, fields)  # before any request of its own (vLLM's probes)
        size = yield from self._chunk_size()
        specials = (yield from self._vllm_specials()) if protocol == "vllm" else None
        requests = wire.requests(protocol, columns, size, truncate, fields, specials)
        chunks: list[ScoreResult] = yield Gather([self._score_chunk(protocol, r) for r in requests])
        return merge(chunks)
