"""Contract tests: both reward clients against the real app, in process, without sockets.

The app is ``reward_server.http.app.create_app`` serving the tiny BERT reward model. The sync
face reaches it through Starlette's ``TestClient`` (an ``httpx.Client`` that also runs the
app's lifespan), the async face through ``httpx.ASGITransport`` on an event loop that runs
the lifespan. Between the clients and the app sits the only fake, a scriptable network (an
ASGI wrapper): hosts that refuse connections and canned error answers from the "server".
Each behaviour is tested once, for both faces.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio.from_thread
import httpx
import pytest
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.testclient import TestClient
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import tiny_models
from reward_client import AsyncRewardClient, RetryPolicy, RewardClient, RewardServerError
from reward_server.config import ServerSettings
from reward_server.http.app import create_app

A, B = "http://rm-a", "http://rm-b"
TOL = 1e-5
#: Items per request the app accepts (and announces in /info).
SERVER_BATCH = 3


@dataclass
class Seen:
    """One HTTP request as it reached the network."""

    method: str
    host: str
    path: str
    body: bytes = b""

    def items(self) -> int:
        """Items in a /score body."""
        body = json.loads(self.body)
        return len(body.get("texts") or body.get("queries") or body.get("conversations"))


class Network:
    """The real app behind a scriptable network; records every request that reaches it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.down: set[str] = set()
        self.canned: list[tuple[int, dict[str, str]]] = []
        self.seen: list[Seen] = []

    def reset(self) -> None:
        self.down.clear()
        self.canned.clear()
        self.seen.clear()

    def posts(self) -> list[Seen]:
        return [s for s in self.seen if s.path == "/score"]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # the lifespan
            await self.app(scope, receive, send)
            return
        seen = Seen(scope["method"], Headers(scope=scope)["host"], scope["path"])
        self.seen.append(seen)
        if seen.host in self.down:
            # Raised through the transport to the client, as a refused connection would be.
            raise httpx.ConnectError(f"connection to {seen.host} refused")
        if seen.path == "/score" and self.canned:
            code, headers = self.canned.pop(0)
            answer = JSONResponse({"error": "canned", "type": "canned"}, code, headers)
            await answer(scope, receive, send)
            return

        async def recording_receive() -> Message:
            message = await receive()
            seen.body += message.get("body", b"")
            return message

        await self.app(scope, recording_receive, send)


class Face:
    """A reward client of one face around the served app, driven through blocking calls.

    Pauses are recorded, not slept, and move the fake clock of the retry budget.
    """

    def __init__(self, served: Served, urls: list[str], **kwargs: Any) -> None:
        self.served = served
        self.sleeps: list[float] = []
        self.now = 0.0
        kwargs = {"seed": 0, "clock": lambda: self.now, **kwargs}
        if served.mode == "sync":
            self.client: Any = RewardClient(
                urls, http_client=served.http, sleep=self.pause, **kwargs
            )
        else:

            async def sleep(delay: float) -> None:
                self.pause(delay)

            self.client = AsyncRewardClient(urls, http_client=served.http, sleep=sleep, **kwargs)

    def pause(self, delay: float) -> None:
        self.sleeps.append(delay)
        self.now += delay

    def __getattr__(self, name: str) -> Callable[..., Any]:
        return self.served.blocking(getattr(self.client, name))

    def call(self, prompts: list[Any], responses: list[str]) -> list[float]:
        return self.served.blocking(self.client)(prompts, responses)


class Served:
    """The app served to one face, kept up for the module."""

    def __init__(self, mode: str, model: Path, stack: ExitStack) -> None:
        self.mode = mode
        app = create_app(ServerSettings(model=str(model), max_client_batch=SERVER_BATCH))
        self.network = Network(app)
        self.http: httpx.Client | httpx.AsyncClient
        if mode == "sync":
            self.http = stack.enter_context(TestClient(self.network))
            return
        self.portal = stack.enter_context(anyio.from_thread.start_blocking_portal())
        stack.enter_context(
            self.portal.wrap_async_context_manager(app.router.lifespan_context(app))
        )
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.network))
        stack.callback(self.portal.call, self.http.aclose)

    def blocking(self, method: Callable[..., Any]) -> Callable[..., Any]:
        """``method`` as a blocking call: as is for the sync face, on the app's loop for async."""
        if self.mode == "sync":
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            async def run() -> Any:
                result: Awaitable[Any] = method(*args, **kwargs)
                return await result

            return self.portal.call(run)

        return call

    def client(self, urls: list[str] | None = None, **kwargs: Any) -> Face:
        self.network.reset()
        return Face(self, urls or [A], **kwargs)


@pytest.fixture(scope="module", params=["sync", "async"])
def served(request: pytest.FixtureRequest, bert_rm: Path) -> Iterator[Served]:
    with ExitStack() as stack:
        yield Served(request.param, bert_rm, stack)


def alone(face: Face, texts: list[str]) -> list[float]:
    """Each text scored in a request of its own (the reference for order)."""
    return [face.score(texts=[t])[0] for t in texts]


# --- chunking and order ---------------------------------------------------------------------


def test_chunks_to_the_servers_batch_and_keeps_input_order(served: Served) -> None:
    face = served.client()
    texts = tiny_models.make_corpus(10, seed=3)
    result = face.score_detailed(texts=texts)
    # One GET /info told the client the app's limit; the call went out in chunks of it.
    assert [(s.method, s.path) for s in served.network.seen].count(("GET", "/info")) == 1
    assert face.client.max_client_batch == SERVER_BATCH
    assert sorted(s.items() for s in served.network.posts()) == [1, 3, 3, 3]
    assert result.scores == pytest.approx(alone(face, texts), abs=TOL)
    assert len(result.tokens) == len(result.truncated) == 10 and min(result.tokens) > 0
    # Pairs too, through the reward-callable face.
    queries, responses = texts[:5], texts[5:]
    paired = [
        face.score(queries=[q], responses=[r])[0] for q, r in zip(queries, responses, strict=True)
    ]
    assert face.call(queries, responses) == pytest.approx(paired, abs=TOL)
    # The limit was asked for once, not per call.
    assert [(s.method, s.path) for s in served.network.seen].count(("GET", "/info")) == 1


# --- several base URLs ----------------------------------------------------------------------


def test_round_robin_over_urls_and_failover_when_one_is_down(served: Served) -> None:
    face = served.client([A, B + "/"])  # a trailing slash is fine
    texts = tiny_models.make_corpus(12, seed=4)
    reference = face.score(texts=texts)
    assert sorted(s.host for s in served.network.posts()) == ["rm-a", "rm-a", "rm-b", "rm-b"]

    served.network.reset()
    served.network.down.add("rm-a")
    assert face.score(texts=texts) == pytest.approx(reference, abs=TOL)
    answered = [s.host for s in served.network.posts() if s.body]
    assert answered == ["rm-b"] * 4
    assert "rm-a" in {s.host for s in served.network.posts()}  # tried, refused, passed over
    assert face.sleeps == []  # another URL was up each time: nothing had to wait


# --- retries --------------------------------------------------------------------------------


def test_5xx_and_429_are_retried_honouring_retry_after(served: Served) -> None:
    # The canned answers stand in for a server that is loading, overloaded or failing.
    face = served.client(retry=RetryPolicy(retry_after_jitter=0))
    texts = tiny_models.make_corpus(2, seed=5)
    reference = alone(face, texts)
    served.network.reset()
    served.network.canned = [(503, {"Retry-After": "1"}), (429, {"Retry-After": "2"}), (500, {})]
    assert face.score(texts=texts) == pytest.approx(reference, abs=TOL)
    assert len(served.network.posts()) == 4
    assert face.sleeps[:2] == [1.0, 2.0] and 0 <= face.sleeps[2] <= 1.0


def test_other_4xx_from_the_app_fail_at_once(served: Served) -> None:
    face = served.client()
    # BERT has no chat template: the app answers 422, which no retry would change.
    with pytest.raises(RewardServerError, match="HTTP 422") as info:
        face.score(conversations=[[{"role": "user", "content": "hi"}]])
    assert info.value.attempts == 1 and len(served.network.posts()) == 1
    # More items than the app accepts in one request: 413, also at once.
    face = served.client(max_client_batch=SERVER_BATCH + 1)
    with pytest.raises(RewardServerError, match="HTTP 413") as info:
        face.score(texts=tiny_models.make_corpus(SERVER_BATCH + 1, seed=6))
    assert info.value.attempts == 1 and len(served.network.posts()) == 1
    assert face.sleeps == []


def test_a_spent_retry_budget_ends_in_one_typed_error(served: Served) -> None:
    face = served.client([A, B], retry_timeout=20)
    served.network.down.update({"rm-a", "rm-b"})
    with pytest.raises(RewardServerError) as info:
        face.score(texts=["the movie was great"])
    error = info.value
    assert error.gave_up == "retry_timeout 20 s" and sum(face.sleeps) == pytest.approx(20)
    # Both URLs in turn, a pause after each round (the last one ending on the budget).
    assert error.attempts == len(served.network.seen) == len(face.sleeps) * 2 + 1
    assert "ConnectError: connection to rm-" in str(error)
    assert f"{A}/info" in str(error) and f"{B}/info" in str(error)
