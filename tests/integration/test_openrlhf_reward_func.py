"""reward_client.integrations.openrlhf as the Python file of OpenRLHF's ``--remote_rm_url``.

OpenRLHF 0.11.2's own ``SingleTurnAgentExecutor`` (its ``openrlhf/utils/agent.py`` from the
pinned wheel, loaded as in test_openrlhf_agent.py) is given the path of the module's file:
it loads the file as it loads any ``reward_func`` file and calls the function after each
generation of a scripted engine. The rewards must equal the server's own ``/score`` of the
query text (and so its ``/get_reward``, OpenRLHF's HTTP path), reached through what that
path cannot do: an API key, and a first URL that is down.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import httpx
import pytest
import torch
from helpers.mock_answers import tei_answer
from helpers.openrlhf import PROMPTS, ScriptedEngine
from server_proc import ServerProcess, free_port, running_server
from transformers import AutoTokenizer, PreTrainedTokenizerBase

import reward_client.integrations.openrlhf as reward_func_module
from reward_client import RewardServerError

API_KEY = "rk-test-openrlhf-0123456789"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
REWARD_FUNC_FILE = reward_func_module.__file__


@pytest.fixture(scope="module")
def server(gpt2_rm: Path) -> Iterator[ServerProcess]:
    """A real reward server that wants an API key."""
    with running_server(gpt2_rm, "--api-key", API_KEY) as srv:
        yield srv


@pytest.fixture(autouse=True)
def no_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No settings from the environment unless a test sets them; no client kept across tests."""
    for name in ("REWARD_URL", "REWARD_API_KEY", "REWARD_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    yield
    reward_func_module.close_clients()


def server_answer(server: ServerProcess, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{server.url}{path}", json=body, headers=AUTH, timeout=30)
    response.raise_for_status()
    return response.json()


def test_openrlhf_loads_the_file_and_its_rewards_equal_the_server(
    openrlhf_agent: ModuleType,
    server: ServerProcess,
    gpt2_policy: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: failover to the server
    monkeypatch.setenv("REWARD_URL", f"{dead},{server.url}")
    monkeypatch.setenv("REWARD_API_KEY", API_KEY)
    tokenizer: PreTrainedTokenizerBase = AutoTokenizer.from_pretrained(gpt2_policy)
    executor = openrlhf_agent.SingleTurnAgentExecutor(REWARD_FUNC_FILE)
    assert executor.reward_func is not None and executor.reward_func.__name__ == "reward_func"
    engine = ScriptedEngine(tokenizer)
    sampling_params = SimpleNamespace(max_tokens=32, logprobs=None)

    async def rollout() -> list[dict[str, Any]]:
        # One sample per call, as OpenRLHF's rollout workers do.
        return [
            await executor.execute(p, f"label {i}", sampling_params, 256, tokenizer, engine)
            for i, p in enumerate(PROMPTS)
        ]

    try:
        outputs = asyncio.run(rollout())
    finally:
        # OpenRLHF loaded its own copy of the module: close that copy's clients.
        executor.reward_func.__globals__["close_clients"]()
    queries = [
        tokenizer.decode(o["observation_tokens"], skip_special_tokens=False) for o in outputs
    ]
    expected = server_answer(server, "/score", {"texts": queries})
    via_get_reward = server_answer(server, "/get_reward", {"query": queries})["rewards"]
    assert via_get_reward == pytest.approx(expected["scores"], abs=1e-5)
    for i, output in enumerate(outputs):
        # OpenRLHF swallows a failing reward_func (logged at INFO) and leaves reward None.
        assert output["reward"] is not None, "reward_func failed inside OpenRLHF"
        reward = output["reward"]
        assert isinstance(reward, torch.Tensor) and reward.shape == (1,)
        assert reward.item() == pytest.approx(expected["scores"][i], abs=1e-5)
        assert torch.equal(output["scores"], reward)
        # What OpenRLHF's samples generator makes of them: one value per sample.
        assert torch.tensor([reward]).shape == (1,)
        logs = {k: v.flatten()[0].item() for k, v in output["extra_logs"].items()}
        assert logs == {
            "reward_tokens": expected["tokens"][i],
            "reward_truncated": float(expected["truncated"][i]),
            "reward_masked": 0.0,
        }


def test_reward_func_called_directly(
    server: ServerProcess, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A batch of queries, settings from keyword arguments, and the errors it raises."""
    reward_func = reward_func_module.reward_func
    queries = [p + " and that was all" for p in PROMPTS]
    labels: Sequence[Any] = [None] * len(queries)
    expected = server_answer(server, "/score", {"texts": queries})["scores"]
    out = reward_func(queries, PROMPTS, labels, reward_url=server.url, reward_api_key=API_KEY)
    assert out["rewards"].shape == (len(queries),)
    assert out["rewards"].tolist() == pytest.approx(expected, abs=1e-5)
    empty = reward_func([], [], [], reward_url=server.url, reward_api_key=API_KEY)
    assert empty["rewards"].shape == (0,)

    # No key: a 401 names the server at once (a 4xx is never retried).
    with pytest.raises(RewardServerError, match="HTTP 401"):
        reward_func(queries[:1], PROMPTS[:1], labels[:1], reward_url=server.url)
    with pytest.raises(ValueError, match="REWARD_URL"):
        reward_func(queries[:1], PROMPTS[:1], labels[:1])
    with pytest.raises(TypeError, match="single string"):
        reward_func(queries[0], PROMPTS[0], None, reward_url=server.url)

    monkeypatch.setattr(reward_func_module._warn_once, "seen", set())
    with caplog.at_level(logging.WARNING, logger=reward_func_module.__name__):
        for _ in range(2):
            reward_func(
                queries[:1],
                PROMPTS[:1],
                labels[:1],
                temperature=2,
                reward_url=server.url,
                reward_api_key=API_KEY,
            )
    assert caplog.messages == [
        "reward_client.integrations.openrlhf ignores the keyword argument 'temperature'"
    ]


def test_reward_func_sends_the_labels(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """OpenRLHF's labels (its --label_key column) go with the queries, in order."""
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        n = len(body["texts"])
        return httpx.Response(
            200, json={"scores": [0.5] * n, "tokens": [3] * n, "truncated": [False] * n}
        )

    http = httpx.Client(transport=httpx.MockTransport(handler))
    options = {"http_client": http, "max_client_batch": 2}
    queries = [p + " 7" for p in PROMPTS[:3]]
    labels = ["7", {"tests": [1, 2]}, None]
    out = reward_func_module.reward_func(
        queries, PROMPTS[:3], labels, reward_url="http://rm.test", reward_client_options=options
    )
    assert out["rewards"].tolist() == [0.5] * 3
    assert [b["texts"] for b in bodies] == [queries[:2], queries[2:]]
    assert [b["labels"] for b in bodies] == [labels[:2], labels[2:]]
    # A protocol without labels leaves them out, saying so once.
    monkeypatch.setattr(reward_func_module._warn_once, "seen", set())
    tei = {
        "http_client": httpx.Client(transport=httpx.MockTransport(tei_answer)),
        "protocol": "tei",
        "max_client_batch": 8,
    }
    with caplog.at_level(logging.WARNING, logger=reward_func_module.__name__):
        for _ in range(2):
            reward_func_module.reward_func(
                queries, PROMPTS[:3], labels, reward_url="http://rm.test", reward_client_options=tei
            )
    assert caplog.messages == ["protocol 'tei' has no labels: they are not sent"]
