"""The call's deadline in the reward client, against a mock transport and a fake clock.

Every attempt tells the server its time budget (``X-Request-Timeout-Ms``: the least of the
attempt's read timeout and what is left of the call's deadline, never more), no attempt
starts and no pause ends past the deadline, and an attempt waits for its answer at most
``DEADLINE_GRACE`` past it. A real server answering 503 forever:
tests/integration/test_client_deadline_server.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from reward_client import AsyncRewardClient, RetryPolicy, RewardClient, RewardServerError
from reward_client.attempts import DEADLINE_GRACE
from reward_client.integrations.settings import ClientSettings

URL = "http://rm-a:8000"
URL_B = "http://rm-b:8000"
HEADER = "X-Request-Timeout-Ms"


@dataclass
class Sent:
    """One request as the server saw it: when, where, its budget header and its timeouts."""

    at: float
    path: str
    budget_ms: int | None
    timeout: dict[str, float | None]


@dataclass
class Clocked:
    """A fake server on a fake clock: each request takes ``took`` seconds of it; /score
    answers ``status`` (503 by default) or, with 200, one score per item."""

    now: float = 1000.0
    took: float = 0.5
    took_info: float = 0.0
    status: int = 503
    headers: dict[str, str] = field(default_factory=dict)
    sent: list[Sent] = field(default_factory=list)
    sleeps: list[float] = field(default_factory=list)
    pause_ends: list[float] = field(default_factory=list)
    overslept: float = 0.0  # how much later than asked each pause wakes

    def __call__(self, request: httpx.Request) -> httpx.Response:
        header = request.headers.get(HEADER)
        timeout = dict(request.extensions.get("timeout", {}))
        self.sent.append(Sent(self.now, request.url.path, header and int(header), timeout))
        if request.url.path == "/info":
            self.now += self.took_info
            return httpx.Response(200, json={"max_client_batch": 4})
        self.now += self.took
        if self.status == 200:
            n = len(json.loads(request.content)["texts"])
            return httpx.Response(
                200, json={"scores": [1.0] * n, "tokens": [1] * n, "truncated": [False] * n}
            )
        return httpx.Response(self.status, json={"error": "busy"}, headers=self.headers)

    def pause(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds + self.overslept
        self.pause_ends.append(self.now)

    def scores(self) -> list[Sent]:
        return [s for s in self.sent if s.path == "/score"]

    def budgets(self, path: str | None = None) -> list[int]:
        """The budgets sent (to ``path``, or to every path), each one there."""
        sent = [s.budget_ms for s in self.sent if path is None or s.path == path]
        assert None not in sent
        return [b for b in sent if b is not None]


def client_of(
    mode: str,
    server: Clocked,
    handler: Callable[[httpx.Request], httpx.Response] | None = None,
    **kwargs: Any,
) -> Callable[..., Any]:
    """``score`` of a sync or async client on ``server``'s clock, as a blocking call
    (``handler``: what answers the requests, ``server`` by default)."""
    kwargs = {"clock": lambda: server.now, "seed": 0, **kwargs}
    transport = httpx.MockTransport(handler or server)
    if mode == "sync":
        client = RewardClient(
            URL, http_client=httpx.Client(transport=transport), sleep=server.pause, **kwargs
        )
        return client.score

    async def sleep(seconds: float) -> None:
        server.pause(seconds)

    aclient = AsyncRewardClient(
        URL, http_client=httpx.AsyncClient(transport=transport), sleep=sleep, **kwargs
    )
    return lambda **inputs: asyncio.run(aclient.score(**inputs))


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_each_attempt_sends_what_is_left_and_retries_stop_at_the_deadline(mode: str) -> None:
    server = Clocked(took=0.7)
    score = client_of(mode, server, deadline=10, retry=RetryPolicy(backoff_base=0.2, backoff_max=1))
    start = server.now
    with pytest.raises(RewardServerError) as info:
        score(texts=["a"])
    sent = server.sent
    assert [s.path for s in sent[:1]] == ["/info"]
    budgets = server.budgets()
    assert len(budgets) > 5
    # Each one what was left of the 10 s when it was sent (rounded down), so they decrease.
    for s in sent:
        left_ms = (start + 10 - s.at) * 1000
        assert s.budget_ms is not None and left_ms - 1 <= s.budget_ms <= left_ms
    assert budgets == sorted(budgets, reverse=True)
    retried = server.budgets("/score")
    assert all(b < a for a, b in itertools.pairwise(retried))
    # The attempt waits at most the grace past the deadline (here less than its own 60 s).
    for s, budget in zip(sent, budgets, strict=True):
        assert s.timeout["read"] == pytest.approx(budget / 1000 + DEADLINE_GRACE, abs=1e-3)
    # No attempt starts and no pause ends past the deadline: the call gives up inside it
    # (the fake server takes its 0.7 s whatever it was told; a real one answers in time).
    assert all(s.at < start + 10 for s in sent)
    assert all(end < start + 10 for end in server.pause_ends)
    assert server.now <= start + 10 + 0.7
    err = info.value
    assert err.gave_up == "deadline 10 s" and err.status == 503
    assert err.attempts == len(server.scores())
    assert str(err).endswith("(deadline 10 s)")


def test_the_attempts_own_timeout_when_it_is_shorter(mode: str) -> None:
    server = Clocked(took=1.0)
    timeout = httpx.Timeout(60, read=3)
    score = client_of(mode, server, deadline=8, timeout=timeout, retry=RetryPolicy(backoff_max=0.1))
    start = server.now
    with pytest.raises(RewardServerError, match=r"deadline 8 s"):
        score(texts=["a"])
    for s in server.sent:
        left_ms = (start + 8 - s.at) * 1000
        assert s.budget_ms == min(3000, int(left_ms))
    budgets = server.budgets()
    assert budgets[0] == 3000 and budgets[-1] < 3000
    assert budgets == sorted(budgets, reverse=True)
    # While the deadline is further than the attempt's timeout, the timeouts are the client's.
    assert server.sent[0].timeout == {"connect": 60, "read": 3, "write": 60, "pool": 60}


def test_without_a_deadline_each_attempt_sends_its_read_timeout(mode: str) -> None:
    server = Clocked()
    score = client_of(mode, server, timeout=httpx.Timeout(5, read=30), retry_timeout=20)
    with pytest.raises(RewardServerError, match=r"retry_timeout 20 s"):
        score(texts=["a"])
    assert {s.budget_ms for s in server.sent} == {30000}
    assert {s.timeout["read"] for s in server.sent} == {30}


def test_no_timeout_and_no_deadline_sends_no_header() -> None:
    server = Clocked(status=200)
    score = client_of("sync", server, timeout=None)
    assert score(texts=["a"]) == [1.0]
    assert [s.budget_ms for s in server.sent] == [None, None]


def test_a_calls_own_deadline_overrides_the_clients(mode: str) -> None:
    server = Clocked(status=200)
    score = client_of(mode, server, deadline=100)
    assert score(texts=["a"], deadline=2.5) == [1.0]
    assert [s.budget_ms for s in server.sent] == [2500, 2500]
    assert score(texts=["a"]) == [1.0]
    assert server.sent[-1].budget_ms == 60000  # the read timeout: less than the 100 s left


def test_the_deadline_counts_from_the_call_not_the_client(mode: str) -> None:
    server = Clocked(status=200)
    score = client_of(mode, server, deadline=5)
    server.now += 3600  # an hour after the client was made
    assert score(texts=["a"]) == [1.0]
    assert server.scores()[0].budget_ms == 5000


def test_a_deadline_spent_before_a_chunk_is_sent_sends_nothing(mode: str) -> None:
    server = Clocked(status=200, took_info=4.0)  # discovery eats the whole budget
    score = client_of(mode, server, deadline=3)
    with pytest.raises(RewardServerError) as info:
        score(texts=["a", "b"])
    assert server.scores() == []
    err = info.value
    assert err.gave_up == "deadline 3 s" and err.attempts == 0
    assert "the call's deadline (3 s) passed before the request was sent" in str(err)


def test_a_pause_that_would_end_past_the_deadline_is_not_taken(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    server = Clocked(took=0.1, headers={"Retry-After": "30"})
    score = client_of(mode, server, deadline=10, retry=RetryPolicy(retry_after_jitter=0))
    with (
        caplog.at_level(logging.WARNING, logger="reward_client.attempts"),
        pytest.raises(RewardServerError, match=r"HTTP 503: busy") as info,
    ):
        score(texts=["a"])
    assert server.sleeps == [] and len(server.scores()) == 1
    assert info.value.gave_up == "deadline 10 s"
    assert caplog.messages == [
        f"POST {URL}/score failed (attempt 1, 0.1 s of the 600 s retry budget, the call's "
        "deadline 10 s): HTTP 503: busy; giving up (deadline 10 s)"
    ]


def test_a_pause_that_wakes_past_the_deadline_ends_with_the_last_failure(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The pause was to end before the deadline, the sleep woke after it: no attempt is
    sent, and the error is the last attempt's (its status and the server's reason)."""
    server = Clocked(took=0.5, headers={"Retry-After": "2"}, overslept=0.75)
    score = client_of(mode, server, deadline=3, retry=RetryPolicy(retry_after_jitter=0))
    with (
        caplog.at_level(logging.WARNING, logger="reward_client.attempts"),
        pytest.raises(RewardServerError) as info,
    ):
        score(texts=["a"])
    assert server.sleeps == [2.0] and len(server.scores()) == 1
    err = info.value
    assert (err.status, err.message, err.attempts) == (503, "busy", 1)
    assert err.gave_up == "deadline 3 s" and err.url == f"{URL}/score"
    assert "HTTP 503: busy" in str(err) and "(deadline 3 s)" in str(err)
    assert caplog.messages[-1] == (
        f"POST {URL}/score: the pause before attempt 2 ended past the call's deadline; "
        "giving up (deadline 3 s) with attempt 1's failure"
    )


def test_an_attempt_cut_by_the_deadline_ends_with_the_servers_last_answer(mode: str) -> None:
    """The last attempt's wait ended at the deadline with no answer: the error is the 503
    before it (the reason the call failed), and says that the last attempt got none."""
    server = Clocked(took=0.5)
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        if request.url.path != "/score":
            return server(request)
        calls += 1
        if calls == 2:
            server.now += request.extensions["timeout"]["read"]  # waits its whole wait
            raise httpx.ReadTimeout("timed out", request=request)
        return server(request)

    retry = RetryPolicy(backoff_base=0.1, backoff_max=0.1)
    call = client_of(mode, server, handler, deadline=3, retry=retry)
    with pytest.raises(RewardServerError) as info:
        call(texts=["a"])
    err = info.value
    assert calls == 2 and server.now > server.sent[0].at + 3  # the wait ran past the deadline
    assert (err.status, err.attempts, err.gave_up) == (503, 2, "deadline 3 s")
    assert err.message == "busy; attempt 2 got no answer by the deadline"
    assert isinstance(err.__cause__, httpx.ReadTimeout)


def test_failover_within_the_deadline(mode: str) -> None:
    """A dead URL is left for the other at once; the budget runs on across them."""
    server = Clocked(took=2.0, status=200)

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "rm-a" and request.url.path == "/score":
            server.now += 1.0
            raise httpx.ConnectError("refused", request=request)
        return server(request)

    client = RewardClient(
        [URL, URL_B],
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
        sleep=server.pause,
        clock=lambda: server.now,
        deadline=10,
        max_client_batch=4,
    )
    start = server.now
    assert client.score(texts=["a"]) == [1.0]
    assert [s.budget_ms for s in server.sent] == [
        int((start + 10 - s.at) * 1000) for s in server.sent
    ]


@pytest.mark.parametrize("bad", [0, -1, float("nan"), "5", True])
def test_a_bad_deadline_is_refused_before_any_request(bad: Any) -> None:
    with pytest.raises(ValueError, match="deadline must be a positive number of seconds"):
        RewardClient(URL, deadline=bad)
    server = Clocked(status=200)
    score = client_of("sync", server)
    with pytest.raises(ValueError, match="deadline must be a positive number of seconds"):
        score(texts=["a"], deadline=bad)
    assert server.sent == []


def test_adapters_read_the_deadline_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REWARD_DEADLINE", raising=False)
    kwargs = {"reward_url": URL}
    assert "deadline" not in ClientSettings.read(kwargs).client_kwargs()
    assert (
        ClientSettings.read({**kwargs, "reward_deadline": "30"}).client_kwargs()["deadline"] == 30.0
    )
    monkeypatch.setenv("REWARD_DEADLINE", "45")
    assert ClientSettings.read(kwargs).client_kwargs()["deadline"] == 45.0
    options = {"reward_client_options": {"deadline": 5}}
    assert ClientSettings.read({**kwargs, **options}).client_kwargs()["deadline"] == 5
