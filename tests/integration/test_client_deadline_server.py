"""The reward client's deadline against real servers over HTTP (issue 35, acceptance 5).

Small FastAPI apps served by uvicorn on 127.0.0.1 in a thread (tests/counterparts.py): one
answers 503 forever, one never answers. The call raises within its deadline plus one
attempt's timeout (here within the deadline plus the client's 1 s grace), and every
attempt told the server what was left of the deadline in ``X-Request-Timeout-Ms``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from counterparts import Counterpart, serving
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from reward_client import AsyncRewardClient, RetryPolicy, RewardClient, RewardServerError
from reward_client.attempts import DEADLINE_GRACE

#: Quick pauses, so that a few seconds hold many retries.
QUICK = RetryPolicy(backoff_base=0.05, backoff_max=0.3)
#: Scheduling and connection slack on a busy two-core machine.
SLACK = 1.0


class Recorded(Counterpart):
    """The budgets the server was told, with when (monotonic seconds) it was told them."""

    budgets: list[tuple[float, int]]


def recorded() -> Recorded:
    server = Recorded()
    server.budgets = []
    return server


def app_of(server: Recorded, *, hang: bool) -> FastAPI:
    """/info as this project's server; /score 503 with a reason, or no answer at all."""
    app = FastAPI()

    @app.get("/info")
    async def info() -> dict[str, int]:
        return {"max_client_batch": 8}

    @app.post("/score")
    async def score(request: Request) -> JSONResponse:
        budget = request.headers.get("x-request-timeout-ms")
        server.budgets.append((time.monotonic(), int(budget) if budget else -1))
        server.bodies.append(await request.json())
        if hang:  # until the client gives up on this request
            while not await request.is_disconnected():
                await asyncio.sleep(0.05)
        return JSONResponse({"error": "overloaded"}, status_code=503)

    return app


@pytest.fixture
def busy() -> Iterator[Recorded]:
    """A server whose /score answers 503 forever."""
    server = recorded()
    with serving(app_of(server, hang=False), server):
        yield server


@pytest.fixture
def hung() -> Iterator[Recorded]:
    """A server whose /score never answers."""
    server = recorded()
    with serving(app_of(server, hang=True), server):
        yield server


def check_budgets(server: Recorded, started: float, deadline: float, timeout: float) -> None:
    """Each budget at most the attempt's timeout and what was left of the deadline (the
    budget was measured when the request was sent, a little before it arrived: the exact
    bound is tested on a fake clock in tests/unit/test_client_deadline.py); they decrease."""
    assert server.budgets, "no /score request reached the server"
    for arrived, budget in server.budgets:
        assert 0 < budget <= min(timeout, deadline) * 1000
        assert arrived + budget / 1000 <= started + deadline + 0.1
    budgets = [b for _, b in server.budgets]
    assert budgets == sorted(budgets, reverse=True)


def test_503_forever_raises_within_the_deadline(busy: Recorded) -> None:
    deadline, timeout = 3.0, 2.0
    with RewardClient(busy.url, deadline=deadline, timeout=timeout, retry=QUICK) as client:
        started = time.monotonic()
        with pytest.raises(RewardServerError) as info:
            client.score(texts=["a", "b"])
        took = time.monotonic() - started
    assert took <= deadline + timeout
    assert took <= deadline + SLACK
    err = info.value
    assert err.status == 503 and err.gave_up == "deadline 3 s" and err.attempts > 3
    assert err.attempts == busy.score_requests()
    check_budgets(busy, started, deadline, timeout)
    assert busy.budgets[-1][1] < timeout * 1000  # the deadline was the nearer limit at the end


def test_503_forever_async_face(busy: Recorded) -> None:
    deadline, timeout = 2.0, 5.0

    async def call() -> float:
        async with AsyncRewardClient(
            busy.url, deadline=deadline, timeout=timeout, retry=QUICK
        ) as client:
            started = time.monotonic()
            with pytest.raises(RewardServerError, match=r"deadline 2 s"):
                await client.score(texts=["a"])
            return started

    started = asyncio.run(call())
    assert time.monotonic() - started <= deadline + SLACK
    check_budgets(busy, started, deadline, timeout)


def test_503_forever_without_a_deadline_stops_at_the_retry_budget(busy: Recorded) -> None:
    """The retry budget alone: each attempt tells its own timeout; the call raises within
    the budget plus one attempt's timeout."""
    budget, timeout = 2.0, 1.0
    with RewardClient(
        busy.url, retry=QUICK, retry_timeout=budget, timeout=timeout, max_client_batch=8
    ) as client:
        started = time.monotonic()
        with pytest.raises(RewardServerError, match=r"retry_timeout 2 s"):
            client.score(texts=["a"])
    assert time.monotonic() - started <= budget + timeout + SLACK
    assert {b for _, b in busy.budgets} == {1000}


def test_a_server_that_never_answers_is_left_at_the_deadline(hung: Recorded) -> None:
    """The attempt's own timeout (60 s) is far off: the client waits for the answer until
    the deadline plus its grace, and the server was told the deadline."""
    deadline = 1.5
    with RewardClient(hung.url, deadline=deadline, max_client_batch=8) as client:
        started = time.monotonic()
        with pytest.raises(RewardServerError, match=r"timed out") as info:
            client.score(texts=["a"])
        took = time.monotonic() - started
    assert deadline <= took <= deadline + DEADLINE_GRACE + SLACK
    assert info.value.gave_up == "deadline 1.5 s" and info.value.attempts == 1
    check_budgets(hung, started, deadline, 60)
