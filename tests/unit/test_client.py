"""RewardClient and AsyncRewardClient against a mock transport.

Real sockets and a server restart: test_client_sockets.py. Their contract with the real app (chunking, order, failover, retries) is tested in
test_client_contract.py; here are the decisions behind it, with a fake clock.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from helpers.clients import FAST

from reward_client import (
    AsyncRewardClient,
    RetryEvent,
    RetryPolicy,
    RewardClient,
    RewardClientError,
    RewardServerError,
    ScoreResult,
)

URL = "http://rm-a:8000"
URL_B = "http://rm-b:8000"


def score_of(text: str) -> float:
    """The fake server's deterministic score for one item."""
    return float(len(text)) + 0.5


def item_key(body: dict[str, Any]) -> list[str]:
    """One string per item of a /score body, whatever its form."""
    if "texts" in body:
        return body["texts"]
    if "queries" in body:
        return [q + r for q, r in zip(body["queries"], body["responses"], strict=True)]
    return [json.dumps(c) for c in body["conversations"]]


def ok(body: dict[str, Any]) -> httpx.Response:
    """A well-formed /score answer for ``body``."""
    items = item_key(body)
    return httpx.Response(
        200,
        json={
            "scores": [score_of(t) for t in items],
            "tokens": [len(t) for t in items],
            "truncated": [len(t) > 20 for t in items],
            "model": "fake",
        },
    )


@dataclass
class Server:
    """A fake reward server: records requests; /score answers a scripted plan, then ``ok``."""

    plan: list[Callable[[httpx.Request], httpx.Response]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=lambda: {"model": "fake", "max_client_batch": 4})
    down: set[str] = field(default_factory=set)
    requests: list[httpx.Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.requests.append(request)
        if request.url.host in self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/info":
            return httpx.Response(200, json=self.info)
        with self.lock:
            step = self.plan.pop(0) if self.plan else None
        if step is not None:
            return step(request)
        return ok(json.loads(request.content))

    def posts(self) -> list[httpx.Request]:
        return [r for r in self.requests if r.url.path == "/score"]

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(r.content) for r in self.posts()]


def status(code: int, headers: dict[str, str] | None = None, error: str = "nope") -> Callable:
    return lambda request: httpx.Response(code, json={"error": error}, headers=headers)


def raises(exc_type: type[httpx.TransportError], message: str = "boom") -> Callable:
    def step(request: httpx.Request) -> httpx.Response:
        raise exc_type(message, request=request)

    return step


class Harness:
    """Drives a sync or an async client through the same blocking calls.

    Pauses are recorded, not slept, and move a fake clock (the retry budget's) forward.
    """

    def __init__(self, mode: str, handler: Callable, urls: Any, **kwargs: Any) -> None:
        self.mode = mode
        self.sleeps: list[float] = []
        self.now = 1000.0
        kwargs = {"retry": FAST, "seed": 0, "clock": lambda: self.now, **kwargs}
        transport = httpx.MockTransport(handler)
        if mode == "sync":
            self.client: Any = RewardClient(
                urls, http_client=httpx.Client(transport=transport), sleep=self.pause, **kwargs
            )
        else:

            async def sleep(delay: float) -> None:
                self.pause(delay)

            self.client = AsyncRewardClient(
                urls, http_client=httpx.AsyncClient(transport=transport), sleep=sleep, **kwargs
            )

    def pause(self, delay: float) -> None:
        self.sleeps.append(delay)
        self.now += delay

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self.client, name)
        if self.mode == "sync":
            return method
        return lambda *args, **kwargs: asyncio.run(method(*args, **kwargs))

    def call(self, prompts: Any, responses: Any) -> Any:
        if self.mode == "sync":
            return self.client(prompts, responses)
        return asyncio.run(self.client(prompts, responses))


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    """Which face of the client a test drives."""
    return str(request.param)


@pytest.fixture
def make(mode: str) -> Callable[..., Harness]:
    """Factory of a client of each kind around a handler."""

    def factory(handler: Callable, urls: Any = URL, **kwargs: Any) -> Harness:
        return Harness(mode, handler, urls, **kwargs)

    return factory


# --- request bodies and answers -------------------------------------------------------------


def test_texts_body_and_scores(make: Callable[..., Harness]) -> None:
    server = Server()
    client = make(server, max_client_batch=8)
    texts = ["a", "bb", "ccc"]
    assert client.score(texts=texts) == [score_of(t) for t in texts]
    assert server.bodies() == [{"texts": texts}]
    request = server.requests[0]
    assert request.method == "POST" and str(request.url) == f"{URL}/score"
    assert "authorization" not in request.headers


def test_pairs_and_conversations_bodies(make: Callable[..., Harness]) -> None:
    server = Server()
    client = make(server, max_client_batch=8)
    client.score(queries=["q1", "q2"], responses=["r1", "r2"], truncate=False)
    convs = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]]
    client.score(conversations=convs)
    assert server.bodies() == [
        {"queries": ["q1", "q2"], "responses": ["r1", "r2"], "truncate": False},
        {"conversations": convs},
    ]


def test_call_maps_text_prompts_to_pairs_and_chat_prompts_to_conversations(
    make: Callable[..., Harness],
) -> None:
    server = Server()
    client = make(server, max_client_batch=8)
    assert client.call(["q1", "q2"], ["r1", "r22"]) == [score_of("q1r1"), score_of("q2r22")]
    chat = [[{"role": "system", "content": "be nice"}, {"role": "user", "content": "hi"}]]
    client.call(chat, ["hello"])
    assert server.bodies() == [
        {"queries": ["q1", "q2"], "responses": ["r1", "r22"]},
        {
            "conversations": [
                [
                    {"role": "system", "content": "be nice"},
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello"},
                ]
            ]
        },
    ]


def test_score_detailed_returns_tokens_and_truncation(make: Callable[..., Harness]) -> None:
    client = make(Server(), max_client_batch=2)
    texts = ["short", "x" * 30, "y" * 25]
    result = client.score_detailed(texts=texts)
    assert isinstance(result, ScoreResult)
    assert result.scores == [score_of(t) for t in texts]
    assert result.tokens == [5, 30, 25]
    assert result.truncated == [False, True, True]
    assert result.truncated_frac == pytest.approx(2 / 3)


def test_api_key_is_sent_as_bearer_token(make: Callable[..., Harness]) -> None:
    server = Server()
    client = make(server, api_key="s3cret")
    client.score(texts=["a"])
    assert {r.headers["authorization"] for r in server.requests} == {"Bearer s3cret"}


def test_empty_input_sends_nothing(make: Callable[..., Harness]) -> None:
    server = Server()
    assert make(server).score(texts=[]) == []
    assert server.requests == []


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"texts": ["a"], "queries": ["q"], "responses": ["r"]},
        {"queries": ["q"]},
        {"queries": ["q", "q"], "responses": ["r"]},
        {"texts": "not a list"},
        {"texts": ["ok", 3]},
    ],
)
def test_bad_arguments_fail_before_any_request(
    make: Callable[..., Harness], kwargs: dict[str, Any]
) -> None:
    server = Server()
    with pytest.raises((ValueError, TypeError)):
        make(server).score(**kwargs)
    assert server.requests == []


@pytest.mark.parametrize(
    "answer",
    [
        {"scores": [1.0], "tokens": [1, 2], "truncated": [False, False]},
        '{"scores": [1.0, NaN], "tokens": [1, 2], "truncated": [false, false]}',
        {"scores": [1.0, "2"], "tokens": [1, 2], "truncated": [False, False]},
        {"scores": [1.0, 2.0]},
        ["not", "an", "object"],
    ],
)
def test_malformed_answer_is_an_error_not_a_value(
    make: Callable[..., Harness], answer: object
) -> None:
    # A str is sent verbatim: Python's json module reads NaN, which httpx will not write.
    content = answer if isinstance(answer, str) else json.dumps(answer)
    server = Server(plan=[lambda r: httpx.Response(200, content=content)])
    with pytest.raises(RewardServerError, match="invalid response") as info:
        make(server, max_client_batch=8).score(texts=["a", "b"])
    assert f"{URL}/score" in str(info.value)
    assert len(server.posts()) == 1


# --- chunking and order ---------------------------------------------------------------------


def test_max_client_batch_found_in_nested_info(make: Callable[..., Harness]) -> None:
    server = Server(
        info={"model": "m", "batching": {"max_batch_tokens": 8192, "max_client_batch": 3}}
    )
    client = make(server)
    client.score(texts=list("abcdefg"))
    assert sorted(len(b["texts"]) for b in server.bodies()) == [1, 3, 3]


def test_sync_chunks_completing_out_of_order_keep_order() -> None:
    last_done = threading.Event()

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if body["texts"][0] == "t0":
            # The first chunk answers only after the last chunk has answered.
            assert last_done.wait(timeout=10)
        response = ok(body)
        if body["texts"][0].startswith("t8"):
            last_done.set()
        return response

    texts = [f"t{i}" + "x" * i for i in range(10)]
    with RewardClient(
        URL,
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
        max_client_batch=2,
        max_concurrency=5,
    ) as client:
        assert client.score(texts=texts) == [score_of(t) for t in texts]


def test_async_chunks_completing_out_of_order_keep_order() -> None:
    order: list[str] = []

    async def main() -> list[float]:
        last_done = asyncio.Event()

        async def handler(request: httpx.Request) -> httpx.Response:
            body = json.loads(request.content)
            if body["texts"][0] == "t0":
                await asyncio.wait_for(last_done.wait(), timeout=10)
            order.append(body["texts"][0])
            if body["texts"][0].startswith("t8"):
                last_done.set()
            return ok(body)

        http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        async with AsyncRewardClient(URL, http_client=http, max_client_batch=2) as client:
            return await client.score(texts=texts)

    texts = [f"t{i}" + "x" * i for i in range(10)]
    assert asyncio.run(main()) == [score_of(t) for t in texts]
    assert order[-1] == "t0"


def test_chunks_are_sent_concurrently_up_to_max_concurrency() -> None:
    in_flight, peak = 0, 0
    lock = threading.Lock()
    gate = threading.Barrier(3, timeout=10)

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        with lock:
            in_flight += 1
            peak = max(peak, in_flight)
        gate.wait()  # three chunks must be in flight at once to get past here
        with lock:
            in_flight -= 1
        return ok(json.loads(request.content))

    http = httpx.Client(transport=httpx.MockTransport(handler))
    with RewardClient(URL, http_client=http, max_client_batch=1, max_concurrency=3) as client:
        assert client.score(texts=list("abcdef")) == [score_of(t) for t in "abcdef"]
    assert peak == 3


# --- retries --------------------------------------------------------------------------------


def test_retries_connection_errors_then_succeeds(make: Callable[..., Harness]) -> None:
    server = Server(plan=[raises(httpx.ConnectError), raises(httpx.ConnectError)])
    client = make(server, max_retries=3)
    assert client.score(texts=["abc"]) == [score_of("abc")]
    assert len(server.posts()) == 3
    # Full jitter: each pause is within [0, min(backoff_max, base * 2**k)].
    assert len(client.sleeps) == 2
    for k, delay in enumerate(client.sleeps):
        assert 0 <= delay <= min(0.01, 0.001 * 2**k)


def test_429_honours_retry_after_seconds(make: Callable[..., Harness]) -> None:
    server = Server(plan=[status(429, {"Retry-After": "2"}), status(503, {"Retry-After": "0.5"})])
    client = make(server, max_retries=2)
    assert client.score(texts=["abc"]) == [score_of("abc")]
    # never sooner than asked; up to 10 % later, so clients told alike do not return at once
    assert len(client.sleeps) == 2
    assert 2.0 <= client.sleeps[0] <= 2.2 and 0.5 <= client.sleeps[1] <= 0.55


def test_429_honours_retry_after_http_date(make: Callable[..., Harness]) -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    server = Server(plan=[status(429, {"Retry-After": when})])
    client = make(server)
    client.score(texts=["abc"])
    # An HTTP date has one-second resolution.
    assert len(client.sleeps) == 1 and 28 <= client.sleeps[0] <= 33


def test_retry_after_jitter_spreads_clients_told_alike() -> None:
    policy = RetryPolicy()
    pauses = [policy.after_retry_after(2.0, random.Random(seed)) for seed in range(20)]
    assert all(2.0 <= p <= 2.2 for p in pauses)
    assert len({round(p, 6) for p in pauses}) == 20  # twenty clients, twenty instants
    assert RetryPolicy(retry_after_jitter=0).after_retry_after(2.0, random.Random(0)) == 2.0
    with pytest.raises(ValueError, match="retry_after_jitter"):
        RetryPolicy(retry_after_jitter=-0.1)


def test_retry_after_is_capped(make: Callable[..., Harness]) -> None:
    server = Server(plan=[status(429, {"Retry-After": "3600"})])
    client = make(server, retry=RetryPolicy(max_retry_after=5.0))
    client.score(texts=["abc"])
    assert len(client.sleeps) == 1 and 5.0 <= client.sleeps[0] <= 5.5


@pytest.mark.parametrize(
    ("code", "message"), [(422, "empty list"), (413, "too many"), (401, "bad key")]
)
def test_other_4xx_raise_at_once_with_the_server_message(
    make: Callable[..., Harness], code: int, message: str
) -> None:
    server = Server(plan=[status(code, error=message)] * 3)
    client = make(server, max_retries=5)
    with pytest.raises(RewardServerError) as info:
        client.score(texts=["abc"])
    assert len(server.posts()) == 1
    assert client.sleeps == []
    err = info.value
    assert (err.status, err.message, err.url) == (code, message, f"{URL}/score")
    assert str(err) == f"POST {URL}/score failed: HTTP {code}: {message}"
    assert isinstance(err, RewardClientError)


def test_fastapi_detail_is_used_as_message(make: Callable[..., Harness]) -> None:
    server = Server(plan=[lambda r: httpx.Response(422, json={"detail": [{"msg": "bad"}]})])
    with pytest.raises(RewardServerError, match='"msg":"bad"'):
        make(server).score(texts=["a"])


def test_gives_up_after_max_retries(make: Callable[..., Harness]) -> None:
    server = Server(plan=[status(503, error="draining")] * 10)
    client = make(server, max_retries=3)
    with pytest.raises(RewardServerError) as info:
        client.score(texts=["abc"])
    assert len(server.posts()) == 4
    assert info.value.status == 503
    assert info.value.gave_up == "max_retries 3"
    assert str(info.value) == (
        f"POST {URL}/score failed after 4 attempts: HTTP 503: draining; "
        f"gave up after {info.value.elapsed:.1f} s (max_retries 3)"
    )


def test_timeout_ends_in_error_naming_url_and_cause(make: Callable[..., Harness]) -> None:
    server = Server(plan=[raises(httpx.ReadTimeout, "timed out")] * 10)
    client = make(server, max_retries=2)
    with pytest.raises(RewardServerError) as info:
        client.score(texts=["abc"])
    assert str(info.value).startswith(
        f"POST {URL}/score failed after 3 attempts: timed out (ReadTimeout); gave up after "
    )
    assert info.value.status is None and info.value.url == f"{URL}/score"
    assert isinstance(info.value.__cause__, httpx.ReadTimeout)


def test_one_failing_chunk_fails_the_call(make: Callable[..., Harness]) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if "bad" in body["texts"]:
            return httpx.Response(422, json={"error": "bad item"})
        return ok(body)

    with pytest.raises(RewardServerError, match="bad item"):
        make(handler, max_client_batch=1).score(texts=["a", "b", "bad", "c"])


# --- several base URLs ----------------------------------------------------------------------


def test_all_urls_down_pauses_between_rounds_and_names_them(make: Callable[..., Harness]) -> None:
    server = Server(plan=[raises(httpx.ConnectError, "refused")] * 10)
    client = make(server, urls=[URL, URL_B], max_retries=3)
    with pytest.raises(RewardServerError) as info:
        client.score(texts=["abc"])
    assert len(server.posts()) == 4
    # A, B (no pause: B was untried), pause, A, B.
    assert len(client.sleeps) == 1
    message = str(info.value)
    assert "failed after 4 attempts: ConnectError: refused" in message
    assert "rm-a" in message and "rm-b" in message


# --- lifecycle and configuration ------------------------------------------------------------


def test_passed_in_http_client_is_not_closed() -> None:
    http = httpx.Client(transport=httpx.MockTransport(Server()))
    RewardClient(URL, http_client=http, max_client_batch=2).close()
    assert not http.is_closed
    owned = RewardClient(URL)
    owned.close()
    assert owned._http.is_closed


def test_info_returns_server_info(make: Callable[..., Harness]) -> None:
    assert make(Server(info={"model": "m", "max_client_batch": 7})).info()["model"] == "m"


def test_info_without_max_client_batch_falls_back_to_default(make: Callable[..., Harness]) -> None:
    client = make(Server(info={"model": "m"}))
    client.score(texts=["a"])
    assert client.client.max_client_batch == 64


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_retries": -1},
        {"retry_timeout": -1},
        {"retry_timeout": float("nan")},
        {"max_client_batch": 0},
        {"max_concurrency": 0},
    ],
)
def test_bad_configuration_is_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        RewardClient(URL, **kwargs)


def test_bad_base_url_is_rejected() -> None:
    with pytest.raises(ValueError, match="http"):
        AsyncRewardClient("rm:8000")
    with pytest.raises(ValueError):
        RewardClient([])


def test_backoff_is_capped_full_jitter() -> None:
    policy = RetryPolicy(backoff_base=0.5, backoff_max=4.0)
    rng = random.Random(0)
    for pauses in range(20):
        assert 0 <= policy.backoff(pauses, rng) <= min(4.0, 0.5 * 2**pauses)


# --- the retry budget (retry by time, not count) --------------------------------------------


def test_retries_until_the_time_budget_is_spent(
    make: Callable[..., Harness], caplog: pytest.LogCaptureFixture
) -> None:
    server = Server(plan=[raises(httpx.ConnectError, "refused")] * 1000)
    # Default backoff (0.25 s doubling, capped at 10 s), a 60 s budget, a fake clock.
    client = make(server, retry=RetryPolicy(), retry_timeout=60)
    with (
        caplog.at_level(logging.WARNING, logger="reward_client.attempts"),
        pytest.raises(RewardServerError) as info,
    ):
        client.score(texts=["abc"])
    err = info.value
    # Pauses of at most ~10 s, until 60 s are spent: the last one ends the budget exactly.
    assert all(0 <= d <= 10 for d in client.sleeps)
    assert sum(client.sleeps) == pytest.approx(60)
    assert max(client.sleeps) > 5  # the backoff grew towards its cap
    assert err.attempts == len(server.posts()) == len(client.sleeps) + 1
    assert err.gave_up == "retry_timeout 60 s" and err.elapsed == pytest.approx(60)
    assert str(err) == (
        f"POST {URL}/score failed after {err.attempts} attempts: ConnectError: refused; "
        "gave up after 60.0 s (retry_timeout 60 s)"
    )
    # One warning line per failed attempt: URL, error, time of the budget, next try.
    lines = [r.getMessage() for r in caplog.records if r.name == "reward_client.attempts"]
    assert len(lines) == err.attempts
    assert all(r.levelno == logging.WARNING for r in caplog.records)
    assert lines[0] == (
        f"POST {URL}/score failed (attempt 1, 0.0 s of the 60 s retry budget): "
        f"ConnectError: refused; next try in {client.sleeps[0]:.1f} s on {URL}/score"
    )
    assert all("next try in" in line for line in lines[:-1])
    assert lines[-1].startswith(f"POST {URL}/score failed (attempt {err.attempts}, 60.0 s of")
    assert lines[-1].endswith("; giving up (retry_timeout 60 s)")


def test_a_long_outage_is_outlasted_whatever_the_count(make: Callable[..., Harness]) -> None:
    # 50 failures, 5 minutes of fake time: far past any retry count, within the default 600 s.
    server = Server(plan=[raises(httpx.ConnectError)] * 50 + [status(503)] * 10)
    client = make(server, retry=RetryPolicy())
    assert client.score(texts=["abc"]) == [score_of("abc")]
    assert len(server.posts()) == 61
    assert 60 < sum(client.sleeps) < 600


def test_retry_after_is_capped_to_fit_the_budget(make: Callable[..., Harness]) -> None:
    server = Server(plan=[status(429, {"Retry-After": "3600"})] * 2)
    policy = RetryPolicy(timeout=30, max_retry_after=3600, retry_after_jitter=0)
    client = make(server, retry=policy)
    with pytest.raises(RewardServerError) as info:
        client.score(texts=["abc"])
    # One pause to the end of the budget (not the hour asked for), one last try, then stop.
    assert client.sleeps == [30.0]
    assert info.value.status == 429 and info.value.attempts == 2
    assert info.value.gave_up == "retry_timeout 30 s"


def test_retry_after_is_honoured_within_the_budget(make: Callable[..., Harness]) -> None:
    server = Server(plan=[status(503, {"Retry-After": "20"})])
    client = make(server, retry=RetryPolicy(retry_after_jitter=0), retry_timeout=30)
    assert client.score(texts=["abc"]) == [score_of("abc")]
    assert client.sleeps == [20.0]  # longer than the 10 s backoff cap: the server asked


def test_zero_budget_retries_nothing(make: Callable[..., Harness]) -> None:
    server = Server(plan=[status(503, error="draining")])
    client = make(server, urls=[URL, URL_B], retry_timeout=0)
    with pytest.raises(RewardServerError, match="HTTP 503: draining") as info:
        client.score(texts=["abc"])
    assert info.value.attempts == 1 and client.sleeps == []


def test_on_retry_reports_failover_first_then_the_pause(make: Callable[..., Harness]) -> None:
    events: list[RetryEvent] = []
    server = Server(
        plan=[raises(httpx.ConnectError, "refused"), status(503, error="loading"), status(502)]
    )
    client = make(
        server,
        urls=[URL, URL_B],
        max_client_batch=8,
        retry=RetryPolicy(timeout=100),
        on_retry=events.append,
    )
    assert client.score(texts=["abc"]) == [score_of("abc")]
    first, second, third = events
    # The first failure moves to the other URL at once, without a pause.
    assert (first.url, first.next_url, first.next_delay_s) == (f"{URL}/score", f"{URL_B}/score", 0)
    assert (first.error, first.status, first.attempt) == ("ConnectError: refused", None, 1)
    # Both URLs failed since the last pause: now the client waits.
    assert (second.url, second.next_url) == (f"{URL_B}/score", f"{URL}/score")
    assert (second.error, second.status, second.attempt) == ("HTTP 503: loading", 503, 2)
    assert second.next_delay_s == client.sleeps[0] > 0
    assert third.next_delay_s == 0 and third.waited_s == pytest.approx(client.sleeps[0])
    assert {e.budget_s for e in events} == {100} and {e.method for e in events} == {"POST"}
    assert [e.waited_s for e in events[:2]] == [0, 0]
