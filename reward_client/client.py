"""The two faces of the reward client: :class:`RewardClient` and :class:`AsyncRewardClient`.

The public methods are written once (:class:`_Face`): each builds a flow
(:mod:`reward_client.flows`, its actions in :mod:`reward_client.actions`) and hands it to the face's ``_run``, so it returns whatever
that runner returns: a value, or a coroutine. :class:`RewardClient` executes the flows'
actions with an ``httpx.Client``, ``time.sleep`` and a thread pool;
:class:`AsyncRewardClient` with an ``httpx.AsyncClient``, ``asyncio.sleep`` and tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from concurrent.futures import FIRST_EXCEPTION, CancelledError, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import httpx

from reward_client.actions import Flow, Gather, Resolve, Send, Sleep, advance, results, scores
from reward_client.attempts import Deadline
from reward_client.errors import RewardClientError
from reward_client.flows import Core
from reward_client.groups import check_groups
from reward_client.inputs import (
    CallOptions,
    Conversation,
    Prompt,
    ScoreInputs,
    Tool,
    columns,
    item_count,
    pair_columns,
    request_fields,
    tools_field,
)
from reward_client.results import ScoreResult
from reward_client.wire.openai_chat import CHAT_PATH

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from reward_client.options import ClientOptions

__all__ = ["AsyncRewardClient", "RewardClient"]

T = TypeVar("T")
ResultT = TypeVar("ResultT")
ScoresT = TypeVar("ScoresT")
InfoT = TypeVar("InfoT")


class _Face(Core, Generic[ResultT, ScoresT, InfoT]):
    """The public methods, once: each builds a flow and hands it to the face's ``_run``."""

    def _run(self, flow: Flow[Any]) -> Any:
        raise NotImplementedError

    def info(self) -> InfoT:
        """The server's ``GET /info`` answer."""
        return self._run(self._timed(self._info))

    def request_items(self) -> Any:
        """Items per request (``max_client_batch``): configured, or asked of the server once
        (an ``int``; a coroutine of one from :class:`AsyncRewardClient`). A group of items
        must fit in one request."""

        def flow(deadline: Deadline | None) -> Flow[int]:
            yield from self._protocol(deadline)
            return (yield from self._chunk_size(deadline))

        return self._run(self._timed(flow))

    def _score_inputs(self, inputs: ScoreInputs) -> Flow[ScoreResult]:
        # The inputs are checked now, before the call is started or awaited.
        fields = request_fields(inputs.get("model"), inputs.get("components"), inputs.get("cache"))
        cols, truncate = columns(inputs), inputs.get("truncate")
        fields.update(tools_field(inputs.get("tools"), cols))
        groups = _groups(inputs.get("groups"), cols)
        seconds = inputs.get("deadline")
        self._deadline(seconds)  # a bad deadline fails here too
        return self._timed(
            lambda deadline: self._score(cols, truncate, fields, deadline, groups), seconds
        )

    def score_detailed(self, **inputs: Unpack[ScoreInputs]) -> ResultT:
        """Scores (None for an item the server masked), token counts, truncation flags, mask
        reasons and the server's breakdown (components, objectives, steps) for one input
        form (and its ``labels``), in input order."""
        return self._run(self._score_inputs(inputs))

    def score(self, **inputs: Unpack[ScoreInputs]) -> ScoresT:
        """Scores for one input form (texts, query/response pairs or conversations), with
        one label per item when ``labels`` is given; None for an item the server masked."""
        return self._run(scores(self._score_inputs(inputs)))

    def score_conversations(
        self,
        conversations: Sequence[Conversation],
        tools: Sequence[Tool] | None = None,
        **options: Unpack[CallOptions],
    ) -> ScoresT:
        """Scores of chat conversations (None for an item the server masked): each a list of
        OpenAI chat messages (tool calls, tool results and ``reasoning_content`` included)
        or ``{"messages": [...], "tools": [...]}`` with tools of its own; ``tools`` (OpenAI
        function specs) for every conversation without; ``options`` as in
        :class:`~reward_client.inputs.CallOptions`. The same as ``score(conversations=...,
        tools=...)``; ``score_detailed`` takes the same arguments for the details."""
        inputs = ScoreInputs(conversations=conversations, tools=tools, **options)
        return self._run(scores(self._score_inputs(inputs)))

    def score_pairs_detailed(
        self,
        prompts: Sequence[Prompt],
        responses: Sequence[str],
        *,
        model: str | None = None,
        components: bool | None = None,
        labels: Sequence[Any] | None = None,
        groups: Sequence[Sequence[int]] | None = None,
    ) -> ResultT:
        """Like :meth:`__call__` but with token counts, truncation flags and the breakdown;
        ``model``, ``components``, ``labels`` and ``groups`` as in
        :class:`~reward_client.inputs.ScoreInputs`."""
        fields = request_fields(model, components)
        cols = pair_columns(prompts, responses, labels)
        grouped = _groups(groups, cols)
        flow = self._timed(lambda deadline: self._score(cols, None, fields, deadline, grouped))
        return self._run(flow)

    def __call__(
        self,
        prompts: Sequence[Prompt],
        responses: Sequence[str],
        *,
        labels: Sequence[Any] | None = None,
        groups: Sequence[Sequence[int]] | None = None,
    ) -> ScoresT:
        """Reward callable: text prompts as query/response pairs, chat prompts as
        conversations; ``labels``: one reference per prompt, for the server's verifiers;
        ``groups``: lists of indices of the responses to one prompt (GRPO's groups).
        None for an item the server masked."""
        cols = pair_columns(prompts, responses, labels)
        grouped = _groups(groups, cols)
        flow = self._timed(lambda deadline: self._score(cols, None, {}, deadline, grouped))
        return self._run(scores(flow))


def _groups(groups: object, cols: dict[str, list[Any]]) -> list[list[int]] | None:
    """The call's groups checked against its columns (None when it gives none)."""
    return None if groups is None else check_groups(groups, cols, item_count(cols))


class RewardClient(_Face[ScoreResult, list[float | None], dict[str, Any]]):
    """Blocking client for the reward server; chunks run concurrently on a thread pool.

    Also a reward callable ``(prompts, responses) -> list[float | None]`` for the PPO
    trainer (None: an item the server masked).
    ``http_client`` (the test seam; a Starlette ``TestClient`` works) is used as given and
    not closed by :meth:`close`. ``sleep`` replaces :func:`time.sleep` between retries. The
    other options are those of :class:`~reward_client.options.ClientOptions`.
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
        self._http = http_client or httpx.Client(**self._http_options())
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
            done, value = advance(flow, None)
            while not done:
                if stop is not None and stop.is_set():
                    raise CancelledError  # a sibling chunk failed: the call is lost anyway
                self._check_open()
                done, value = advance(flow, self._act(value))
            return value

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise RewardClientError("the reward client was closed")

    def _send(self, send: Send) -> httpx.Response | httpx.TransportError:
        try:
            return self._http.request(**self._request_args(send))
        except httpx.TransportError as exc:
            return exc

    def _resolve(self, resolve: Resolve) -> None:
        self._router.pool.refresh()

    def _pause(self, sleep: Sleep) -> None:
        if self._sleep is time.sleep:
            self._closed.wait(sleep.seconds)  # close() ends the pause
        else:
            self._sleep(sleep.seconds)
        self._check_open()

    def _gather(self, gather: Gather) -> list[Any]:
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
            return results(futures)
        finally:
            stop.set()
            for future in futures:
                future.cancel()


class AsyncRewardClient(
    _Face[
        Coroutine[Any, Any, ScoreResult],
        Coroutine[Any, Any, list[float | None]],
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
        self._http = http_client or httpx.AsyncClient(**self._http_options())
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
            done, value = advance(flow, None)
            while not done:
                done, value = advance(flow, await self._act(value))
            return value

    async def _send(self, send: Send) -> httpx.Response | httpx.TransportError:
        try:
            return await self._http.request(**self._request_args(send))
        except httpx.TransportError as exc:
            return exc

    async def _resolve(self, resolve: Resolve) -> None:
        # getaddrinfo blocks: off the event loop.
        await asyncio.to_thread(self._router.pool.refresh)

    async def _pause(self, sleep: Sleep) -> None:
        await self._sleep(sleep.seconds)

    async def _gather(self, gather: Gather) -> list[Any]:
        # A semaphore per call: asyncio primitives must not be shared across event loops.
        limit = asyncio.Semaphore(self.max_concurrency)

        async def run(flow: Flow[Any]) -> Any:
            async with limit:
                return await self._run(flow)

        tasks = [asyncio.ensure_future(run(flow)) for flow in gather.flows]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            return results(tasks)
        finally:
            for task in tasks:
                task.cancel()

    async def __call__(
        self,
        prompts: Sequence[Prompt],
        responses: Sequence[str],
        *,
        labels: Sequence[Any] | None = None,
        groups: Sequence[Sequence[int]] | None = None,
    ) -> list[float | None]:
        """Reward callable: text prompts as query/response pairs, chat prompts as
        conversations; ``labels``: one reference per prompt, for the server's verifiers;
        ``groups``: lists of indices of the responses to one prompt (GRPO's groups).
        None for an item the server masked."""
        return await super().__call__(prompts, responses, labels=labels, groups=groups)

    async def chat_completion(self, body: Mapping[str, Any]) -> object:
        """``POST /v1/chat/completions`` of an OpenAI-compatible server with ``body``
        (:mod:`reward_client.wire.openai_chat`), with this client's failover and retries;
        the decoded JSON answer (RewardServerError when the call finally fails)."""
        payload = dict(body)
        flow = self._timed(lambda deadline: self._request("POST", CHAT_PATH, payload, deadline))
        answer, _ = await self._run(flow)
        return answer
