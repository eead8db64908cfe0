"""The client's protocols: vLLM, TEI and OpenRLHF shapes through the one core (chunking,
retries, failover), against this server's endpoints and a TEI-shaped test server."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from ppo_client.config import PPOConfig
from ppo_client.reward import default_reward_fn
from reward_client import AsyncRewardClient, RewardClient, RewardClientError
from reward_client.wire import VllmSpecials, requests, vllm_specials
from reward_server.config import ServerSettings
from reward_server.http.app import create_app

URL = "http://rm"
TEXTS = ["The answer is 4.", "hello there", "a b c d", "x", "one more text"]
QUERIES = ["Say hi.", "What is 2+2?", "Name a colour."]
RESPONSES = ["Hello!", "4", "Blue."]
CONVERSATIONS = [
    [{"role": "user", "content": q}, {"role": "assistant", "content": r}]
    for q, r in zip(QUERIES, RESPONSES, strict=True)
]
FAST = {"retry_timeout": 5.0, "seed": 0}


@pytest.fixture(scope="module")
def app_client(llama_rm: Path) -> Iterator[TestClient]:
    with TestClient(create_app(ServerSettings(model=str(llama_rm))), base_url=URL) as c:
        yield c


def client(http: httpx.Client, protocol: str, **options: Any) -> RewardClient:
    return RewardClient(URL, http_client=http, protocol=protocol, **FAST, **options)


@pytest.mark.parametrize("protocol", ["vllm", "tei", "openrlhf", "auto"])
def test_protocols_score_like_remote_reward(app_client: TestClient, protocol: str) -> None:
    reference = client(app_client, "remote-reward")
    other = client(app_client, protocol, max_client_batch=2)
    assert other.score(texts=TEXTS) == pytest.approx(reference.score(texts=TEXTS), abs=1e-5)
    if protocol in ("vllm", "tei", "auto"):
        pairs = other.score(queries=QUERIES, responses=RESPONSES)
        expected = reference.score(queries=QUERIES, responses=RESPONSES)
        assert pairs == pytest.approx(expected, abs=1e-5)
    if protocol in ("vllm", "auto"):
        got = other.score(conversations=CONVERSATIONS)
        expected = reference.score(conversations=CONVERSATIONS)
        assert got == pytest.approx(expected, abs=1e-5)
        prompts = [c[:1] for c in CONVERSATIONS]  # chat prompts: scored as conversations
        assert other(prompts, RESPONSES) == pytest.approx(expected, abs=1e-5)


def test_auto_finds_this_server_and_says_so(
    app_client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="reward_client.flows")
    auto = client(app_client, "auto")
    auto.score(texts=TEXTS[:1])
    assert auto.protocol == "remote-reward"
    assert "speaks remote-reward" in caplog.text


def test_unknown_protocol_and_unsupported_forms_fail_early(app_client: TestClient) -> None:
    with pytest.raises(ValueError, match="protocol"):
        client(app_client, "grpc")
    with pytest.raises(ValueError, match="chat messages"):
        client(app_client, "tei").score(conversations=CONVERSATIONS)


def test_ppo_config_takes_reward_protocol() -> None:
    config = PPOConfig(reward_url=URL, reward_protocol="tei")
    fn = default_reward_fn(config)
    assert isinstance(fn, RewardClient) and fn.protocol == "tei"
    fn.close()
    with pytest.raises(ValueError):
        PPOConfig(reward_url=URL, reward_protocol="grpc")


# --------------------------------------------------------------------------- a TEI server


class FakeTEI:
    """TEI's /info and /predict; a score is the length of the sequence's texts; scripted
    failures answer the next /predict requests first."""

    def __init__(self) -> None:
        self.failures: list[tuple[int, dict[str, str]]] = []
        self.bodies: list[dict[str, Any]] = []
        self.app = Starlette(
            routes=[
                Route("/info", self.info, methods=["GET"]),
                Route("/predict", self.predict, methods=["POST"]),
            ]
        )

    async def info(self, request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "model_id": "rm",
                "model_dtype": "float32",
                "model_type": {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {}}},
                "max_client_batch_size": 2,
                "version": "1.8.0",
            }
        )

    async def predict(self, request: Request) -> JSONResponse:
        body = json.loads(await request.body())
        self.bodies.append(body)
        if self.failures:
            status, headers = self.failures.pop(0)
            return JSONResponse({"error": "busy", "error_type": "Overloaded"}, status, headers)
        answers = [
            [{"score": float(len("".join(seq))), "label": "LABEL_0"}] for seq in body["inputs"]
        ]
        return JSONResponse(answers)


def test_tei_server_with_retries_on_429_and_503(caplog: pytest.LogCaptureFixture) -> None:
    tei = FakeTEI()
    tei.failures = [(429, {"Retry-After": "1"}), (503, {})]
    sleeps: list[float] = []
    with TestClient(tei.app, base_url=URL) as http:
        auto = client(http, "auto", sleep=sleeps.append)
        caplog.set_level(logging.INFO, logger="reward_client.flows")
        scores = auto.score(queries=QUERIES, responses=RESPONSES)
    assert auto.protocol == "tei" and "speaks tei" in caplog.text
    assert scores == [float(len(q + r)) for q, r in zip(QUERIES, RESPONSES, strict=True)]
    # Two failed attempts were retried; chunks of TEI's max_client_batch_size (2).
    assert len(sleeps) == 2
    sent = [b for b in tei.bodies if b["inputs"]]
    assert all(b["raw_scores"] is True and len(b["inputs"]) <= 2 for b in sent)
    assert [QUERIES[0], RESPONSES[0]] in [s for b in sent for s in b["inputs"]]


def test_tei_server_async_face_and_giving_up() -> None:
    tei = FakeTEI()

    async def scenario() -> list[float]:
        transport = httpx.ASGITransport(app=tei.app)
        async with httpx.AsyncClient(transport=transport, base_url=URL) as http:
            face = AsyncRewardClient(URL, http_client=http, protocol="tei", **FAST)
            return await face.score(texts=TEXTS)

    assert asyncio.run(scenario()) == [float(len(t)) for t in TEXTS]
    tei.failures = [(400, {})]
    with TestClient(tei.app, base_url=URL) as http, pytest.raises(RewardClientError, match="400"):
        client(http, "tei").score(texts=TEXTS[:1])


# ------------------------------------------------------------------ vLLM's special tokens

CHAT_PROBE = {"tokens": [3, 203, 69, 0]}  # a conversation rendered without specials


@pytest.mark.parametrize(
    ("empty", "chat", "expected"),
    [
        # Llama/Mistral tokenizer, template without BOS (Zephyr): BOS added to conversations.
        ({"tokens": [1], "token_strs": ["<s>"]}, CHAT_PROBE, VllmSpecials("<s>", chat=True)),
        # A template that writes BOS itself (Llama 3): vLLM adds none, as this server.
        ({"tokens": [1], "token_strs": ["<s>"]}, {"tokens": [1, 3]}, VllmSpecials("<s>")),
        # A tokenizer that adds nothing (Qwen2), or a server without /tokenize: vLLM's way.
        ({"tokens": [], "token_strs": []}, CHAT_PROBE, VllmSpecials()),
        (None, None, VllmSpecials()),
    ],
)
def test_vllm_specials_from_tokenize_probes(
    empty: object, chat: object, expected: VllmSpecials
) -> None:
    assert vllm_specials(empty, chat) == expected


def test_vllm_requests_ask_for_this_servers_special_tokens() -> None:
    specials = VllmSpecials("<s>", chat=True)
    texts = ["a", "<s>b", "<s>c", "d", "e"]
    wires = requests("vllm", {"texts": texts}, 2, None, specials=specials)
    assert [w.body["input"] for w in wires] == [["a"], ["<s>b", "<s>c"], ["d", "e"]]  # in order
    assert [w.body.get("add_special_tokens") for w in wires] == [None, False, None]
    (chat,) = requests("vllm", {"conversations": CONVERSATIONS[:1]}, 2, None, specials=specials)
    assert chat.body["add_special_tokens"] is True and chat.body["use_activation"] is False
    (plain,) = requests("vllm", {"conversations": CONVERSATIONS[:1]}, 2, None)
    assert "add_special_tokens" not in plain.body  # vLLM's default: the template's own
