"""The sans-I/O core of both clients: the flows and the configuration they share.

One implementation, two faces. What a call does (discover the chunk size, split, send,
decide on each failure whether and when to try again and where) is written once as
*flows*: generators that yield actions (:mod:`reward_client.actions`: ``Send`` a request,
``Sleep``, ``Gather`` sub-flows concurrently, ``Resolve`` the ``dns+`` names again) and get
back their outcomes, without doing any I/O themselves. :class:`Core` holds the flows and
the state they share (router, retry policy, discovered protocol and chunk size); each face
in :mod:`reward_client.client` executes the actions its own way: the blocking
``RewardClient`` with an ``httpx.Client``, ``time.sleep`` and a thread pool, the
``AsyncRewardClient`` with an ``httpx.AsyncClient``, ``asyncio.sleep`` and tasks.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from reward_client import wire
from reward_client.actions import Action, Flow, Gather, Resolve, Send, Sleep
from reward_client.attempts import Attempts, Deadline, Retry
from reward_client.errors import RewardClientError, RewardServerError
from reward_client.groups import grouped_requests, restore
from reward_client.inputs import item_count
from reward_client.options import (
    DEFAULT_MAX_CLIENT_BATCH,
    DEFAULT_MAX_CONCURRENCY,
    Verify,
    tls_verify,
)
from reward_client.results import RetryEvent, ScoreResult, merge
from reward_client.retry import RetryPolicy
from reward_client.routing import Router
from reward_client.targets import (
    DEFAULT_RESOLVE_INTERVAL,
    EndpointPool,
    Resolver,
    normalise_urls,
)
from reward_client.wire.base import DEADLINE_HEADER
from reward_client.wire.remote_reward import find_max_client_batch

__all__ = ["Answer", "Core"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Answer:
    """A request's decoded JSON answer, the URL that gave it and the answer's headers."""

    payload: Any
    url: str
    headers: Mapping[str, str]


T = TypeVar("T")


def _seconds(name: str, value: float | None) -> float | None:
    """``value`` checked as a positive number of seconds, or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}")
    return float(value)


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
        deadline: float | None = None,
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
        #: Seconds each call may take in all (None: no overall limit; see ClientOptions).
        self.deadline = _seconds("deadline", deadline)
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
        headers = dict(self._headers)
        timeout = self.timeout
        budget = send.budget
        if budget is not None and budget.ms is not None:
            headers[DEADLINE_HEADER] = str(budget.ms)
        if budget is not None and budget.wait_s is not None:
            timeout = _capped(timeout, budget.wait_s)
        args: dict[str, Any] = {
            "method": send.method,
            "url": send.url,
            "json": send.body,
            "headers": headers,
            "timeout": timeout,
        }
        target = send.target
        if target is not None and target.host is not None:  # an address found through DNS
            headers["Host"] = target.host
            if target.server_name is not None:
                args["extensions"] = {"sni_hostname": target.server_name}
        return args

    def _deadline(self, seconds: float | None = None) -> Deadline | None:
        """The deadline of a call starting now: ``seconds`` from now, or the client's
        ``deadline`` option when not given (None: the call has none)."""
        seconds = self.deadline if seconds is None else _seconds("deadline", seconds)
        return None if seconds is None else Deadline(self._clock() + seconds, seconds)

    def _timed(
        self, flow: Callable[[Deadline | None], Flow[T]], seconds: float | None = None
    ) -> Flow[T]:
        """``flow`` with the call's deadline, which starts when the call does (when this
        flow is first advanced, not when it is made)."""
        return (yield from flow(self._deadline(seconds)))

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

    def _exchange(
        self, method: str, path: str, body: object | None, deadline: Deadline | None
    ) -> Flow[Answer]:
        """One logical request with failover and retries, within ``deadline`` (the call's)."""
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
            deadline=deadline,
            attempt_timeout=self.timeout.read,
        )
        while True:
            url, budget = attempts.sent()
            outcome = yield Send(method, url, body, attempts.target, budget)
            step = attempts.settle(outcome)
            if not isinstance(step, Retry):  # an answer (errors are retried or raised)
                return Answer(step, url, outcome.headers)
            if step.delay > 0:
                yield Sleep(step.delay)
            if self._router.pool.due():  # soon after a failure: the server may be gone
                yield Resolve()

    def _request(
        self,
        method: str,
        path: str,
        body: object | None = None,
        deadline: Deadline | None = None,
    ) -> Flow[tuple[Any, str]]:
        """One logical request with failover and retries: the decoded JSON and who answered."""
        answer = yield from self._exchange(method, path, body, deadline)
        return answer.payload, answer.url

    def _info(self, deadline: Deadline | None = None) -> Flow[dict[str, Any]]:
        """The server's ``GET /info`` answer."""
        info, url = yield from self._request("GET", "/info", None, deadline)
        if not isinstance(info, dict):
            raise RewardServerError(None, "invalid response: not a JSON object", url, method="GET")
        return info

    def _probe(
        self, path: str, body: object | None = None, deadline: Deadline | None = None
    ) -> Flow[object]:
        """``GET path``'s answer (POST ``body`` if given), or None where the server answers
        it with a 4xx."""
        method = "GET" if body is None else "POST"
        try:
            answer, _ = yield from self._request(method, path, body, deadline)
        except RewardServerError as exc:
            if exc.status is None or exc.status >= 500:
                raise
            return None
        return answer

    def _protocol(self, deadline: Deadline | None = None) -> Flow[str]:
        """The protocol to speak; ``auto`` asks the server once (its /info, vLLM's
        /v1/models) and logs what it found."""
        if self.protocol != "auto":
            return self.protocol
        info = yield from self._probe("/info", None, deadline)
        found = wire.detect(info, None)
        if found is None:
            found = wire.detect(info, (yield from self._probe("/v1/models", None, deadline)))
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

    def _chunk_size(self, deadline: Deadline | None = None) -> Flow[int]:
        """``max_client_batch``, asking the server once if it was not configured."""
        if self._max_client_batch is not None:
            return self._max_client_batch
        if self.protocol not in ("remote-reward", "tei"):  # no limit to ask for
            self._max_client_batch = DEFAULT_MAX_CLIENT_BATCH
            return DEFAULT_MAX_CLIENT_BATCH
        try:
            info: object = yield from self._info(deadline)
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

    def _vllm_specials(self, deadline: Deadline | None = None) -> Flow[wire.VllmSpecials]:
        """What a vLLM server's tokenizer adds, asked once (its ``/tokenize``) and logged."""
        if self._vllm_found is None:
            (path, empty), (_, chat) = wire.VLLM_PROBES
            answers = (
                (yield from self._probe(path, empty, deadline)),
                (yield from self._probe(path, chat, deadline)),
            )
            self._vllm_found = wire.vllm_specials(*answers)
            logger.info("vLLM server %s tokenizes with %s", self.base_urls[0], self._vllm_found)
        return self._vllm_found

    def _score_chunk(
        self, protocol: str, request: wire.WireRequest, deadline: Deadline | None
    ) -> Flow[ScoreResult]:
        """One request's answer, parsed in ``protocol``."""
        answer = yield from self._exchange("POST", request.path, request.body, deadline)
        try:
            return wire.parse(protocol, answer.payload, request.items, answer.headers)
        except ValueError as exc:
            raise RewardServerError(None, f"invalid response: {exc}", answer.url) from None

    def _score(
        self,
        columns: dict[str, list[Any]],
        truncate: bool | None,
        fields: dict[str, Any],
        deadline: Deadline | None = None,
        groups: list[list[int]] | None = None,
    ) -> Flow[ScoreResult]:
        """Chunks of ``max_client_batch`` items (in the protocol's requests, each with its
        labels) sent concurrently, merged in input order; ``fields`` (model, components) go
        into each remote-reward request; ``groups`` (checked) are never split across
        requests (:mod:`reward_client.groups`); every request within ``deadline``."""
        if not item_count(columns):
            return ScoreResult([], [], [])
        protocol = yield from self._protocol(deadline)
        # Before any request of its own (vLLM's probes).
        wire.check(protocol, columns, fields, groups is not None)
        size = yield from self._chunk_size(deadline)
        specials = (yield from self._vllm_specials(deadline)) if protocol == "vllm" else None
        order = None
        if groups is None:
            requests = wire.requests(protocol, columns, size, truncate, fields, specials)
        else:
            requests, order = grouped_requests(columns, groups, size, truncate, fields)
        flows = [self._score_chunk(protocol, r, deadline) for r in requests]
        chunks: list[ScoreResult] = yield Gather(flows)
        return merge(chunks) if order is None else restore(merge(chunks), order)


def _capped(timeout: httpx.Timeout, seconds: float) -> httpx.Timeout:
    """``timeout`` with none of its parts (connect, read, write, pool) over ``seconds``."""
    parts = (timeout.connect, timeout.read, timeout.write, timeout.pool)
    connect, read, write, pool = (seconds if p is None else min(p, seconds) for p in parts)
    return httpx.Timeout(connect=connect, read=read, write=write, pool=pool)
