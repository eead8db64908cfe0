"""OpenRLHF's own remote-reward client code against two real reward servers.

The code under test is OpenRLHF 0.11.2's ``openrlhf/utils/agent.py``, not a copy: ``make
setup`` downloads the pinned wheel into ``tests/.cache`` (no test reaches the network; the
package's ``__init__`` pulls DeepSpeed, so only ``agent.py`` and the ``logging_utils.py`` it
imports are extracted and loaded, under parent packages that skip those ``__init__`` files).
The wheel is checked against its SHA-256. Only the generation engine (vLLM in OpenRLHF) is
scripted.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import httpx
import pytest
from helpers.openrlhf import CACHE, PROMPTS, RESPONSES, WHEEL, ScriptedEngine
from server_proc import ServerProcess
from transformers import AutoTokenizer, PreTrainedTokenizerBase


@pytest.fixture(scope="module")
def servers(bert_server: ServerProcess, gpt2_server: ServerProcess) -> list[ServerProcess]:
    """Two real reward servers with different models, so each reward names its server."""
    return [bert_server, gpt2_server]


@pytest.fixture(scope="module")
def policy_tokenizer(gpt2_policy: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(gpt2_policy)


def score_texts(server: ServerProcess, texts: Sequence[str]) -> list[float]:
    """The server's /score of complete texts."""
    response = httpx.post(f"{server.url}/score", json={"texts": list(texts)}, timeout=30)
    response.raise_for_status()
    return response.json()["scores"]


def which_server(servers: list[ServerProcess], texts: Sequence[str], rewards: Any) -> int:
    """The index of the one server whose /score of ``texts`` equals ``rewards``."""
    assert isinstance(rewards, list) and len(rewards) == len(texts)
    matches = [
        i
        for i, server in enumerate(servers)
        if rewards == pytest.approx(score_texts(server, texts), abs=1e-5)
    ]
    assert len(matches) == 1, f"rewards {rewards} match servers {matches}"
    return matches[0]


def test_single_turn_agent_rewards_equal_score(
    openrlhf_agent: ModuleType,
    servers: list[ServerProcess],
    policy_tokenizer: PreTrainedTokenizerBase,
) -> None:
    executor = openrlhf_agent.SingleTurnAgentExecutor([f"{s.url}/get_reward" for s in servers])
    engine = ScriptedEngine(policy_tokenizer)
    sampling_params = SimpleNamespace(max_tokens=32, logprobs=None)

    async def rollout() -> list[dict[str, Any]]:
        # One sample per call, as OpenRLHF's rollout workers do.
        return [
            await executor.execute(p, f"label {i}", sampling_params, 256, policy_tokenizer, engine)
            for i, p in enumerate(PROMPTS)
        ]

    served = set()
    for output in asyncio.run(rollout()):
        # OpenRLHF sends the prompt and response decoded with special tokens, as one text.
        query = policy_tokenizer.decode(output["observation_tokens"], skip_special_tokens=False)
        assert query.endswith(policy_tokenizer.eos_token)
        served.add(which_server(servers, [query], output["reward"]))
        assert output["scores"] == output["reward"]
    assert served == {0, 1}, "the calls rotate over both servers"

    # A batch of queries is sharded over the servers: 2 items to one, 1 to the other.
    queries = [p + r for p, r in zip(PROMPTS, RESPONSES, strict=True)][:3]
    answers = asyncio.run(executor._fetch_rewards_via_http(queries, PROMPTS[:3], [None] * 3))
    shards = [queries[:2], queries[2:]]
    assert len(answers) == 2
    used = {which_server(servers, s, a["rewards"]) for s, a in zip(shards, answers, strict=True)}
    assert used == {0, 1}


def test_empty_shard_of_older_releases(servers: list[ServerProcess]) -> None:
    """Before 0.11.2, one sample and two URLs sent one server an empty shard: it must be a 200."""
    query = PROMPTS[0] + RESPONSES[0]
    shards = [
        {"query": [query], "prompts": [PROMPTS[0]], "labels": [None]},
        {"query": [], "prompts": [], "labels": []},
    ]
    full, empty = (
        httpx.post(f"{server.url}/get_reward", json=shard, timeout=30)
        for server, shard in zip(servers, shards, strict=True)
    )
    assert full.status_code == 200
    assert full.json()["rewards"] == pytest.approx(score_texts(servers[0], [query]), abs=1e-5)
    assert empty.status_code == 200, empty.text
    assert empty.json() == {"rewards": [], "scores": [], "extra_logs": {}}
    # /score keeps refusing an empty list.
    assert httpx.post(f"{servers[1].url}/score", json={"texts": []}, timeout=30).status_code == 422


def test_make_setup_fetches_the_wheel_these_tests_read() -> None:
    """The Makefile's download rule writes the very file the fixture reads (and pins it)."""
    root = Path(__file__).resolve().parents[2]
    makefile = (root / "Makefile").read_text()
    assert f"OPENRLHF_WHEEL := {(CACHE / WHEEL).relative_to(root)}\n" in makefile
    assert "openrlhf==0.11.2\n" in makefile
    assert re.search(r"^setup:.*\$\(OPENRLHF_WHEEL\)", makefile, re.MULTILINE)
