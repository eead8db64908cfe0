"""HTTP layer in process: create_app with a fake scorer at the model seam.

The app, the batcher, the middleware and FastAPI are real; only the reward model is a fake
(deterministic scores, a poison token that makes its batch fail, an optional gate that
holds a forward pass) so error paths, the queue limit and batch isolation can be driven
exactly.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from helpers.fakes import POISON, SECRET_DETAIL, FakeModel, fake_score, settings
from helpers.posting import assert_error

from reward_server.http.app import create_app


@pytest.fixture
def fake() -> FakeModel:
    return FakeModel()


@pytest.fixture
def client(fake: FakeModel) -> TestClient:
    with TestClient(create_app(settings(), model=fake)) as c:
        yield c


def run_async(app: FastAPI, scenario: Callable[[httpx.AsyncClient], Awaitable[Any]]) -> Any:
    """Run ``scenario`` against ``app`` (lifespan included) over an in-memory transport."""

    async def main() -> Any:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://rm") as http:
                return await scenario(http)

    return asyncio.run(main())


# --------------------------------------------------------------------------- happy paths


def test_score_forms_and_response_shape(client: TestClient) -> None:
    texts = ["hello", "a longer text", "x"]
    r = client.post("/score", json={"texts": texts})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "scores": pytest.approx([fake_score(t) for t in texts]),
        "tokens": [len(t) for t in texts],
        "truncated": [False, False, False],
        "model": "fake-rm",
    }
    r = client.post("/score", json={"queries": ["q1", "q2"], "responses": ["r1", "r2"]})
    assert r.json()["scores"] == pytest.approx([fake_score("q1>r1"), fake_score("q2>r2")])
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "x": 1}]
    r = client.post("/score", json={"conversations": [conv]})
    assert r.json()["scores"] == pytest.approx([fake_score("user:hi|assistant:yo")])


def test_get_reward_openrlhf(client: TestClient) -> None:
    texts = ["prompt and answer", "p"]
    r = client.post(
        "/get_reward", json={"query": texts, "prompts": ["a", "b"], "labels": [1, None]}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["rewards"] == pytest.approx([fake_score(t) for t in texts])
    assert body["scores"] == body["rewards"]
    assert body["extra_logs"] == {
        "tokens": [17.0, 1.0],
        "truncated": [0.0, 0.0],
        "masked": [0.0, 0.0],
    }


def test_get_reward_empty_shard_answers_empty(client: TestClient, fake: FakeModel) -> None:
    """OpenRLHF before 0.11.2 sends empty lists to all but one of several servers."""
    empty = {"rewards": [], "scores": [], "extra_logs": {}}
    for body in ({"query": [], "prompts": [], "labels": []}, {"query": []}):
        r = client.post("/get_reward", json=body)
        assert r.status_code == 200, r.text
        assert r.json() == empty
    assert fake.batches == []  # nothing reached the model
    # /score keeps refusing an empty list.
    assert_error(client.post("/score", json={"texts": []}), 422, "invalid_request")


def test_truncation_default_and_per_request_override(fake: FakeModel) -> None:
    long_text = "y" * 70 + "END"  # over the fake's 64-token limit
    with TestClient(create_app(settings(), model=fake)) as c:
        r = c.post("/score", json={"texts": ["ok", long_text]})
        assert r.json()["truncated"] == [False, True]
        assert r.json()["tokens"] == [2, 64]
        assert r.json()["scores"][1] == pytest.approx(fake_score(long_text[-64:]))
        body = assert_error(
            c.post("/score", json={"texts": ["ok", long_text], "truncate": False}),
            413,
            "text_too_long",
        )
        assert "item 1" in body["error"] and "73 tokens" in body["error"]
    with TestClient(create_app(settings(no_truncate=True), model=fake)) as c:
        assert_error(c.post("/score", json={"texts": [long_text]}), 413, "text_too_long")
        r = c.post("/score", json={"texts": [long_text], "truncate": True})
        assert r.status_code == 200 and r.json()["truncated"] == [True]


# --------------------------------------------------------------------------- errors

BAD_BODIES: list[tuple[str, object, str]] = [
    ("no form", {}, "exactly one"),
    ("two forms", {"texts": ["a"], "queries": ["b"], "responses": ["c"]}, "exactly one"),
    ("texts and conversations", {"texts": ["a"], "conversations": [[]]}, "conversations"),
    ("unequal lengths", {"queries": ["a", "b"], "responses": ["c"]}, "differ in length"),
    ("queries alone", {"queries": ["a"]}, "together"),
    ("empty list", {"texts": []}, "texts"),
    ("empty conversation", {"conversations": [[]]}, "conversations[0]"),
    ("number", {"texts": ["a", 3]}, "texts[1]"),
    ("null", {"texts": [None]}, "texts[0]"),
    ("nested list", {"texts": [["a"]]}, "texts[0]"),
    ("not a list", {"texts": "abc"}, "texts"),
    ("message without content", {"conversations": [[{"role": "user"}]]}, "content"),
    ("message content not a string", {"conversations": [[{"role": "u", "content": 1}]]}, "content"),
    ("message not a dict", {"conversations": [["hi"]]}, "conversations[0][0]"),
    ("unknown field", {"text": ["a"]}, "text"),
    ("bad truncate", {"texts": ["a"], "truncate": "yes"}, "truncate"),
    ("array body", ["a"], "JSON object"),
]


@pytest.mark.parametrize(("case", "body", "needle"), BAD_BODIES, ids=[c[0] for c in BAD_BODIES])
def test_malformed_input_is_422_naming_the_field(
    client: TestClient, case: str, body: object, needle: str
) -> None:
    error = assert_error(client.post("/score", json=body), 422, "invalid_request")
    assert needle in error["error"], error
    assert client.post("/score", json={"texts": ["still serving"]}).status_code == 200


@pytest.mark.parametrize(
    ("content", "headers", "needle"),
    [
        (b'{"texts": ["a"', {"content-type": "application/json"}, "not valid JSON"),
        (b'{"texts": ["\xff\xfe"]}', {"content-type": "application/json"}, "UTF-8"),
        (b"[" * 100_000, {"content-type": "application/json"}, "not valid JSON"),
        (b'{"texts": [NaN]}', {"content-type": "application/json"}, "texts[0]"),
        (b"", {"content-type": "application/json"}, "body is required"),
        (b"texts=a", {"content-type": "application/x-www-form-urlencoded"}, "JSON object"),
    ],
    ids=["truncated json", "invalid utf-8", "deep nesting", "nan literal", "empty", "form"],
)
def test_undecodable_bodies_are_422(
    client: TestClient, content: bytes, headers: dict[str, str], needle: str
) -> None:
    error = assert_error(
        client.post("/score", content=content, headers=headers), 422, "invalid_request"
    )
    assert needle in error["error"], error
    assert client.post("/score", json={"texts": ["still serving"]}).status_code == 200


def test_get_reward_validation(client: TestClient) -> None:
    assert_error(client.post("/get_reward", json={"query": [1]}), 422, "invalid_request")
    assert_error(client.post("/get_reward", json={"prompts": ["a"]}), 422, "invalid_request")


def test_routing_errors_are_json(client: TestClient) -> None:
    assert_error(client.get("/nope"), 404, "not_found")
    r = client.get("/score")
    assert_error(r, 405, "method_not_allowed")
    assert "POST" in r.headers["allow"]


def test_conversation_without_template_is_422() -> None:
    with TestClient(create_app(settings(), model=FakeModel(has_chat_template=False))) as c:
        body = assert_error(
            c.post("/score", json={"conversations": [[{"role": "user", "content": "hi"}]]}),
            422,
            "chat_template",
        )
        assert "chat template" in body["error"]


def test_empty_encoding_is_422(client: TestClient) -> None:
    body = assert_error(client.post("/score", json={"texts": ["ok", ""]}), 422, "empty_text")
    assert "item 1" in body["error"]


def test_too_many_items_is_413(fake: FakeModel) -> None:
    with TestClient(create_app(settings(max_client_batch=3), model=fake)) as c:
        assert c.post("/score", json={"texts": ["a"] * 3}).status_code == 200
        body = assert_error(c.post("/score", json={"texts": ["a"] * 4}), 413, "too_many_items")
        assert "4 items" in body["error"] and "3" in body["error"]
        assert_error(c.post("/get_reward", json={"query": ["a"] * 4}), 413, "too_many_items")
        assert c.get("/info").json()["max_client_batch"] == 3
    # A request larger than the whole queue could never be admitted: the limit is capped.
    with TestClient(create_app(settings(max_client_batch=10, max_queue=5), model=fake)) as c:
        assert c.get("/info").json()["max_client_batch"] == 5
        assert_error(c.post("/score", json={"texts": ["a"] * 6}), 413, "too_many_items")


def test_body_too_large_by_content_length(fake: FakeModel) -> None:
    with TestClient(create_app(settings(max_body_bytes=200), model=fake)) as c:
        assert c.post("/score", json={"texts": ["a" * 100]}).status_code == 200
        body = assert_error(c.post("/score", json={"texts": ["a" * 300]}), 413, "body_too_large")
        assert "200 bytes" in body["error"]
        assert c.post("/score", json={"texts": ["fine"]}).status_code == 200


def test_body_too_large_when_streamed_without_length(fake: FakeModel) -> None:
    app = create_app(settings(max_body_bytes=1000), model=fake)
    chunks_sent = 0

    async def body() -> AsyncIterator[bytes]:
        nonlocal chunks_sent
        yield b'{"texts": ["'
        for _ in range(1000):  # ~100 kB if read to the end
            chunks_sent += 1
            yield b"a" * 100
        yield b'"]}'

    async def scenario(http: httpx.AsyncClient) -> None:
        r = await http.post("/score", content=body(), headers={"content-type": "application/json"})
        assert "content-length" not in r.request.headers
        assert_error(r, 413, "body_too_large")
        ok = await http.post("/score", json={"texts": ["after"]})
        assert ok.status_code == 200

    run_async(app, scenario)
    assert chunks_sent < 1000  # cut off early, not read to the end


# --------------------------------------------------------------------------- auth


def test_api_key(fake: FakeModel, caplog: pytest.LogCaptureFixture) -> None:
    key = "s3cret-key-value"
    caplog.set_level(logging.DEBUG)
    with TestClient(create_app(settings(api_key=key), model=fake)) as c:
        good = {"Authorization": f"Bearer {key}"}
        body = {"texts": ["a"]}
        r = c.post("/score", json=body)
        assert_error(r, 401, "unauthorized")
        assert r.headers["www-authenticate"] == "Bearer"
        assert_error(
            c.post("/score", json=body, headers={"Authorization": "Bearer nope"}),
            401,
            "unauthorized",
        )
        assert_error(
            c.post("/score", json=body, headers={"Authorization": key}), 401, "unauthorized"
        )
        assert_error(
            c.post("/score", json=body, headers={"Authorization": f"Basic {key}"}),
            401,
            "unauthorized",
        )
        assert_error(c.post("/get_reward", json={"query": ["a"]}), 401, "unauthorized")
        assert_error(c.get("/info"), 401, "unauthorized")
        assert c.post("/score", json=body, headers=good).status_code == 200
        assert c.post("/get_reward", json={"query": ["a"]}, headers=good).status_code == 200
        info = c.get("/info", headers=good)
        assert info.status_code == 200 and info.json()["auth"] is True
        assert key not in info.text
        assert c.get("/health").status_code == 200
        assert c.get("/metrics").status_code == 200
        assert c.get("/openapi.json").status_code == 200
        assert key not in c.get("/metrics").text
    assert key not in caplog.text


# --------------------------------------------------------------------------- batching


def test_queue_full_is_429_with_retry_after() -> None:
    fake = FakeModel()
    fake.gate = threading.Event()
    app = create_app(
        settings(max_queue=4, max_client_batch=4, max_batch_size=2, max_wait_ms=0), model=fake
    )

    async def scenario(http: httpx.AsyncClient) -> None:
        first = asyncio.create_task(http.post("/score", json={"texts": ["a", "b", "c", "d"]}))
        # A forward pass holds 2 rows; the other 2 of the first request fill the queue to 2.
        assert await asyncio.to_thread(fake.entered.wait, 30)
        r = await http.post("/score", json={"texts": ["e", "f", "g"]})
        assert_error(r, 429, "queue_full")
        retry_after = r.headers["retry-after"]
        assert retry_after.isdigit() and int(retry_after) >= 1
        fake.gate.set()
        done = await first
        assert done.status_code == 200
        assert done.json()["scores"] == pytest.approx([fake_score(t) for t in "abcd"])
        again = await http.post("/score", json={"texts": ["e", "f", "g"]})
        assert again.status_code == 200

    run_async(app, scenario)


def test_failing_batch_fails_only_its_requests(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeModel()
    fake.gate = threading.Event()
    # One row per forward pass: each request below is its own micro-batch.
    app = create_app(settings(max_batch_size=1, max_wait_ms=0), model=fake)
    texts = ["alpha", f"bad {POISON}", "gamma", "delta", "epsilon"]

    async def scenario(http: httpx.AsyncClient) -> None:
        tasks = [asyncio.create_task(http.post("/score", json={"texts": [t]})) for t in texts]
        await asyncio.to_thread(fake.entered.wait, 30)
        fake.gate.set()
        answers = await asyncio.gather(*tasks)
        for text, r in zip(texts, answers, strict=True):
            if POISON in text:
                body = assert_error(r, 500, "model_error")
                assert SECRET_DETAIL not in body["error"]
            else:
                assert r.status_code == 200, r.text
                assert r.json()["scores"] == pytest.approx([fake_score(text)])
        # A request with one poisoned item among several fails as a whole; the next runs.
        mixed = await http.post("/score", json={"texts": ["ok", POISON, "ok2"]})
        assert_error(mixed, 500, "model_error")
        after = await http.post("/score", json={"texts": ["after"]})
        assert after.status_code == 200
        assert after.json()["scores"] == pytest.approx([fake_score("after")])
        metrics = (await http.get("/metrics")).text
        assert 'reward_server_batches_total{outcome="error"}' in metrics
        assert 'reward_server_errors_total{status="500",type="model_error"} 2.0' in metrics

    with caplog.at_level(logging.ERROR):
        run_async(app, scenario)
    assert SECRET_DETAIL in caplog.text  # logged server-side, never sent


def test_non_finite_score_is_500(fake: FakeModel) -> None:
    fake.nan = True
    with TestClient(create_app(settings(), model=fake)) as c:
        assert_error(c.post("/score", json={"texts": ["a"]}), 500, "model_error")


def test_concurrent_requests_are_batched_and_routed() -> None:
    fake = FakeModel()
    fake.gate = threading.Event()
    app = create_app(settings(max_batch_size=64, max_wait_ms=5), model=fake)
    requests = [[f"client {c} item {i}" for i in range(1 + c % 4)] for c in range(24)]

    async def scenario(http: httpx.AsyncClient) -> None:
        tasks = [asyncio.create_task(http.post("/score", json={"texts": t})) for t in requests]
        await asyncio.to_thread(fake.entered.wait, 30)
        fake.gate.set()
        for texts, r in zip(requests, await asyncio.gather(*tasks), strict=True):
            assert r.status_code == 200, r.text
            assert r.json()["scores"] == pytest.approx([fake_score(t) for t in texts])

    run_async(app, scenario)
    assert max(fake.batches) > 1  # some forward passes held rows of several requests


def test_client_disconnect_drops_its_queued_items() -> None:
    fake = FakeModel()
    fake.gate = threading.Event()
    app = create_app(settings(max_batch_size=1, max_wait_ms=0), model=fake)
    sent: list[dict[str, Any]] = []

    async def scenario() -> None:
        async with app.router.lifespan_context(app):
            registry = app.state.registry  # its snapshot is what /metrics reads
            gone = asyncio.Event()
            messages = [
                {"type": "http.request", "body": json.dumps({"texts": ["a", "b", "c"]}).encode()}
            ]

            async def receive() -> dict[str, Any]:
                if messages:
                    return messages.pop(0)
                await gone.wait()
                return {"type": "http.disconnect"}

            async def send(message: dict[str, Any]) -> None:
                sent.append(message)

            scope = {
                "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                "method": "POST", "scheme": "http", "path": "/score", "raw_path": b"/score",
                "query_string": b"", "root_path": "", "server": ("rm", 80),
                "client": ("127.0.0.1", 1), "headers": [(b"content-type", b"application/json")],
            }  # fmt: skip
            request = asyncio.create_task(app(scope, receive, send))
            await asyncio.to_thread(fake.entered.wait, 30)  # "a" runs, "b" and "c" wait
            assert registry.snapshot().queued == 2
            gone.set()  # the client hangs up
            while registry.snapshot().queued:
                await asyncio.sleep(0.01)
            fake.gate.set()
            await request
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://rm") as http:
                ok = await http.post("/score", json={"texts": ["next"]})
            assert ok.status_code == 200

    asyncio.run(scenario())
    assert fake.batches == [1, 1]  # "a" (already running) and "next"; "b" and "c" dropped
    assert sent[0]["status"] == 499


def test_rows_waiting_show_in_metrics_by_tenant() -> None:
    fake = FakeModel()
    fake.gate = threading.Event()
    app = create_app(settings(max_batch_size=1, max_wait_ms=0), model=fake)

    async def scenario() -> None:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://rm") as http:
                request = asyncio.create_task(http.post("/score", json={"texts": ["a", "b", "c"]}))
                await asyncio.to_thread(fake.entered.wait, 30)  # "a" runs, "b" and "c" wait
                text = (await http.get("/metrics")).text
                fake.gate.set()
                assert (await request).status_code == 200
                after = (await http.get("/metrics")).text
        assert 'reward_server_tenant_queue_items{tenant="default"} 2.0' in text
        assert 'reward_server_tenant_queue_items{tenant="default"} 0.0' in after  # none waits

    asyncio.run(scenario())


# --------------------------------------------------------------------------- lifecycle


def test_health_before_start_and_while_draining(fake: FakeModel) -> None:
    async def not_started() -> None:
        # No lifespan ran: the batcher never started, so the server is not ready.
        transport = httpx.ASGITransport(app=create_app(settings(), model=fake))
        async with httpx.AsyncClient(transport=transport, base_url="http://rm") as http:
            assert_error(await http.get("/health"), 503, "not_ready")
            assert_error(await http.post("/score", json={"texts": ["a"]}), 503, "not_ready")

    asyncio.run(not_started())
    app = create_app(settings(), model=fake)

    async def draining(http: httpx.AsyncClient) -> None:
        assert (await http.get("/health")).json() == {"status": "ok"}
        app.state.registry.begin_drain()  # what SIGTERM does first
        body = assert_error(await http.get("/health"), 503, "not_ready")
        assert body["error"] == "draining"
        # Requests that reach the app while draining were in flight: they are still served.
        assert (await http.post("/score", json={"texts": ["late"]})).status_code == 200

    run_async(app, draining)


def test_lifespan_loads_the_model_when_not_given(gpt2_rm: Any) -> None:
    app = create_app(settings(model=str(gpt2_rm)))
    with TestClient(app) as c:
        assert c.get("/health").status_code == 200
        r = c.post("/score", json={"texts": ["the movie was great"]})
        assert r.status_code == 200 and r.json()["model"] == str(gpt2_rm)


# --------------------------------------------------------------------------- info, metrics, docs


def test_info(client: TestClient) -> None:
    r = client.get("/info")
    assert r.status_code == 200
    info = r.json()
    for key in (
        "model", "adapter", "architecture", "num_labels", "label_index", "max_length",
        "truncation_side", "dtype", "device", "chat_template", "max_batch_tokens",
        "max_batch_size", "max_wait_ms", "max_client_batch", "max_queue", "max_body_bytes",
        "version",
    ):  # fmt: skip
        assert key in info, key
    assert info["model"] == "fake-rm" and info["chat_template"] is True
    assert info["auth"] is False
    assert not any("key" in k for k in info)


def test_metrics_count_requests_items_and_batches(client: TestClient) -> None:
    for _ in range(3):
        assert client.post("/score", json={"texts": ["abc", "de"]}).status_code == 200
    client.post("/score", json={})
    text = client.get("/metrics").text
    assert 'reward_server_requests_total{endpoint="/score",status="200"} 3.0' in text
    assert 'reward_server_requests_total{endpoint="/score",status="422"} 1.0' in text
    assert 'reward_server_items_total{endpoint="/score"} 6.0' in text
    assert "reward_server_tokens_total 15.0" in text
    assert 'reward_server_errors_total{status="422",type="invalid_request"} 1.0' in text
    assert "reward_server_batch_rows_count" in text
    assert "reward_server_queue_wait_seconds_count" in text
    assert "reward_server_inference_seconds_count" in text
    assert "reward_server_batch_padding_efficiency_count" in text
    assert "reward_server_queue_items 0.0" in text
    assert "reward_server_ready 1.0" in text


def test_two_apps_do_not_share_metrics(fake: FakeModel) -> None:
    with (
        TestClient(create_app(settings(), model=fake)) as a,
        TestClient(create_app(settings(), model=fake)) as b,
    ):
        a.post("/score", json={"texts": ["x"]})
        assert 'endpoint="/score",status="200"} 0.0' in b.get("/metrics").text


def test_openapi_and_docs(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    score = spec["paths"]["/score"]["post"]
    assert score["summary"] and score["description"]
    for status in ("401", "413", "422", "429", "500", "503"):
        ref = score["responses"][status]["content"]["application/json"]["schema"]["$ref"]
        assert ref.endswith("/ErrorResponse"), (status, ref)
    assert "HTTPValidationError" not in json.dumps(spec)
    assert {"/score", "/get_reward", "/health", "/info", "/metrics"} <= set(spec["paths"])
    assert client.get("/docs").status_code == 200


def test_openapi_declares_bearer_auth_only_with_a_key(fake: FakeModel) -> None:
    with TestClient(create_app(settings(), model=fake)) as c:
        spec = c.get("/openapi.json").json()
        assert "security" not in spec["paths"]["/score"]["post"]
        assert "securitySchemes" not in spec.get("components", {})
    with TestClient(create_app(settings(api_key="k3y"), model=fake)) as c:
        spec = c.get("/openapi.json").json()
        assert spec["paths"]["/score"]["post"]["security"]
        assert "security" not in spec["paths"]["/health"]["get"]
        assert "k3y" not in json.dumps(spec)


#: The other protocols' scoring endpoints: a valid body, and how their error body looks.
PROTOCOL_ENDPOINTS = {
    "/classify": {"input": ["a"]},
    "/v1/classify": {"input": ["a"], "activation": False},
    "/pooling": {"input": "a", "use_activation": False},
    "/predict": {"inputs": "a", "raw_scores": True},
}


def assert_protocol_error(response: httpx.Response, path: str, status: int) -> None:
    """A JSON error of ``status`` in the shape of ``path``'s protocol (vLLM's or TEI's)."""
    assert response.status_code == status, response.text
    body = response.json()
    if path == "/predict":
        assert set(body) == {"error", "error_type"} and body["error"], body
        message = body["error"]
    else:
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["code"] == status, body
        message = body["error"]["message"]
    assert message and "Traceback" not in message


@pytest.mark.parametrize("path", list(PROTOCOL_ENDPOINTS))
def test_api_key_on_protocol_endpoints(
    fake: FakeModel, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    key = "s3cret-key-value"
    caplog.set_level(logging.DEBUG)
    body = PROTOCOL_ENDPOINTS[path]
    with TestClient(create_app(settings(api_key=key), model=fake)) as c:
        for headers in (
            {},
            {"Authorization": "Bearer nope"},
            {"Authorization": key},
            {"Authorization": f"Basic {key}"},
        ):
            r = c.post(path, json=body, headers=headers)
            assert_protocol_error(r, path, 401)
            assert r.headers["www-authenticate"] == "Bearer"
            assert key not in r.text
        r = c.post(path, json=body, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
        assert_protocol_error(c.get("/v1/models"), "/v1/models", 401)
    assert key not in caplog.text
