"""PPOTrainer on a tiny GPT-2 policy with in-process rewards (and a mock reward server)."""

from __future__ import annotations

import json
import math
import shutil
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from helpers.training import (
    PROMPTS,
    TRL_METRICS,
    dataset,
    ppo_config,
    read_jsonl,
    space_reward,
)
from transformers import AutoModelForCausalLM

import tiny_models
from ppo_client import PPOConfig, PPOTrainer
from ppo_client.config import ConfigError
from ppo_client.trainer import default_overlap
from reward_client import RewardClient

ALGORITHM_METRICS = [
    "objective/scores",
    "objective/kl",
    "objective/entropy",
    "loss/policy_avg",
    "loss/value_avg",
    "policy/approxkl_avg",
    "val/ratio",
    "lr",
    "episode",
]


#: Tiny models run fastest on one thread, especially on a shared machine.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ----------------------------------------------------------------------------- config


def test_config_from_yaml_with_overrides(tmp_path: Path) -> None:
    path = tmp_path / "ppo.yaml"
    path.write_text(
        "model_name_or_path: some/model\n"
        "learning_rate: 1e-5\n"  # YAML 1.1 reads this as a string: coerced to float
        "reward_url: [http://a:8000, http://b:8000]\n"
        "stop_token: eos\n"
    )
    cfg = PPOConfig.from_yaml(
        path,
        ["--kl_coef", "0.1", "--use_peft", "--missing_eos_penalty=1", "--output_dir", "123"],
    )
    assert cfg.learning_rate == 1e-5
    assert cfg.reward_url == ["http://a:8000", "http://b:8000"]
    assert (cfg.kl_coef, cfg.use_peft, cfg.missing_eos_penalty) == (0.1, True, 1.0)
    assert cfg.output_dir == "123"  # a string field keeps the text as typed
    assert cfg.stop_token == "eos"
    assert cfg.num_ppo_epochs == 4 and cfg.cliprange == 0.2 and cfg.lam == 0.95  # TRL defaults


def test_config_rejects_unknown_keys_and_bad_values() -> None:
    with pytest.raises(ConfigError, match="did you mean 'learning_rate'"):
        PPOConfig.from_args(["--learnig_rate", "1"])
    with pytest.raises(ConfigError, match="expected int"):
        PPOConfig.from_args(["--per_device_train_batch_size", "eight"])
    with pytest.raises(ConfigError, match="not both"):
        PPOConfig(stop_token="eos", stop_token_id=3)
    with pytest.raises(ConfigError, match="kl_estimator"):
        PPOConfig.from_args(["--kl_estimator", "k2"])


# ----------------------------------------------------------------------------- runs


def test_short_run_writes_metrics_checkpoints_plot_and_samples(
    gpt2_policy: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    cfg = ppo_config(
        gpt2_policy,
        out,
        save_steps=2,
        num_sample_generations=4,
        stop_token="eos",
        missing_eos_penalty=0.5,
        whiten_rewards=True,
        num_mini_batches=2,  # 16 rollouts per step
        total_episodes=16 * 4,
        local_rollout_forward_batch_size=6,  # chunks of 6, 6 and 4 rollouts
    )
    history = PPOTrainer(cfg, train_dataset=dataset(), reward_fn=space_reward).train()

    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4] == [h["step"] for h in history]
    for row in rows:
        for key in TRL_METRICS:
            assert key in row, key
            assert math.isfinite(row[key]), (key, row[key])
    assert [r["episode"] for r in rows] == [16, 32, 48, 64]
    assert rows[0]["objective/kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference
    # a response without EOS is penalised: score = raw score - 0.5
    assert rows[0]["objective/scores"] <= rows[0]["objective/raw_scores"]

    for step in (2, 4):
        ckpt = out / f"checkpoint-{step}"
        for name in ("optimizer.pt", "scheduler.pt", "rng_state_0.pt", "trainer_state.json"):
            assert (ckpt / name).is_file(), name
        assert (ckpt / "policy" / "model.safetensors").is_file()
        assert (ckpt / "policy" / "tokenizer.json").is_file()
        assert (ckpt / "value_model" / "model.safetensors").is_file()
        state = json.loads((ckpt / "trainer_state.json").read_text())
        assert (state["step"], state["episode"], state["data_position"]) == (step, step * 16, step)
    assert not list(out.glob(".tmp-*")), "temporary checkpoint folders must be renamed"

    assert (out / "reward_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    samples = read_jsonl(out / "samples.jsonl")
    assert samples and {"step", "prompt", "response", "score"} <= set(samples[0])
    assert samples[0]["prompt"] in PROMPTS

    trained = AutoModelForCausalLM.from_pretrained(out)  # the final policy, loadable as is
    assert trained.config.vocab_size == 350


def test_zero_learning_rate_keeps_ratio_one_and_kl_zero(gpt2_policy: Path, tmp_path: Path) -> None:
    """Rollout and update log-probs agree exactly: same masks, positions and temperature,
    whatever the prompt padding, chunking, mini-batching and stop tokens."""
    cfg = ppo_config(
        gpt2_policy,
        tmp_path / "run",
        learning_rate=0.0,
        temperature=0.7,
        stop_token="eos",
        total_episodes=16,
        num_mini_batches=2,
        local_rollout_forward_batch_size=5,
        kl_estimator="k3",
    )
    history = PPOTrainer(cfg, train_dataset=dataset(), reward_fn=space_reward).train()
    for row in history:
        assert row["val/ratio"] == pytest.approx(1.0, abs=1e-5)
        assert row["policy/approxkl_avg"] == pytest.approx(0.0, abs=1e-9)
        assert row["policy/clipfrac_avg"] == 0.0
        assert row["objective/kl"] == pytest.approx(0.0, abs=1e-5)


def test_peft_policy_uses_the_base_model_as_reference(gpt2_policy: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    cfg = ppo_config(
        gpt2_policy, out, use_peft=True, lora_r=4, lora_alpha=8, learning_rate=1e-2, save_steps=2
    )
    trainer = PPOTrainer(cfg, train_dataset=dataset(), reward_fn=space_reward)
    assert trainer.ref_policy is None  # no second copy: the adapter is disabled instead
    history = trainer.train()
    assert history[0]["objective/kl"] == pytest.approx(0.0, abs=1e-6)
    assert history[-1]["objective/kl"] != pytest.approx(0.0, abs=1e-6)  # the adapter learned
    assert (out / "adapter_model.safetensors").is_file()
    assert (out / "value_model" / "adapter_model.safetensors").is_file()
    assert (out / "checkpoint-2" / "policy" / "adapter_model.safetensors").is_file()
    # The base weights are untouched; only the LoRA matrices trained.
    base = AutoModelForCausalLM.from_pretrained(gpt2_policy)
    policy = trainer.accelerator.unwrap_model(trainer.model).policy.get_base_model()
    trained = dict(policy.named_parameters())
    for name, param in base.named_parameters():
        if name not in trained:  # a layer LoRA wraps keeps its weights under base_layer
            name = name.replace(".weight", ".base_layer.weight").replace(
                ".bias", ".base_layer.bias"
            )
        torch.testing.assert_close(trained[name], param)
    # Resuming loads the adapters (policy and value head) back from the last checkpoint.
    resumed = PPOTrainer(
        ppo_config(
            gpt2_policy, out, use_peft=True, lora_r=4, lora_alpha=8, resume_from_checkpoint="latest"
        ),
        train_dataset=dataset(),
        reward_fn=space_reward,
    )
    assert resumed.state.step == 4
    want = dict(trainer.accelerator.unwrap_model(trainer.model).named_parameters())
    got = dict(resumed.accelerator.unwrap_model(resumed.model).named_parameters())
    assert want.keys() == got.keys()
    for name, param in want.items():
        torch.testing.assert_close(got[name], param, msg=name)


def test_policy_learns_a_text_reward(
    gpt2_policy: Path, tmp_path: Path, learning_report: Callable[..., None]
) -> None:
    cfg = ppo_config(
        gpt2_policy,
        tmp_path / "run",
        per_device_train_batch_size=16,
        gradient_accumulation_steps=1,
        local_rollout_forward_batch_size=16,
        total_episodes=16 * 30,
        num_ppo_epochs=4,
        response_length=10,
        seed=42,
    )
    history = PPOTrainer(cfg, train_dataset=dataset(), reward_fn=space_reward).train()
    scores = [row["objective/scores"] for row in history]
    first, last = statistics.mean(scores[:5]), statistics.mean(scores[-5:])
    learning_report("ppo_text_reward", first=first, last=last)
    assert last > first + 0.05, (first, last, scores)


# ----------------------------------------------------------------------------- resume


class CrashingReward:
    """The space reward, but the reward server "goes away" on call number ``crash_at``."""

    def __init__(self, crash_at: int) -> None:
        self.calls = 0
        self.crash_at = crash_at

    def __call__(self, prompts: list[Any], responses: list[str]) -> list[float]:
        self.calls += 1
        if self.calls == self.crash_at:
            raise RuntimeError("reward server went away")
        return space_reward(prompts, responses)


def test_resume_continues_from_the_checkpoint(gpt2_policy: Path, tmp_path: Path) -> None:
    settings = {"total_episodes": 8 * 6, "save_steps": 2, "num_sample_generations": 6}
    full = PPOTrainer(
        ppo_config(gpt2_policy, tmp_path / "full", **settings),
        train_dataset=dataset(),
        reward_fn=space_reward,
    ).train()

    out = tmp_path / "crashed"
    with pytest.raises(RuntimeError, match="went away"):
        PPOTrainer(
            ppo_config(gpt2_policy, out, **settings),
            train_dataset=dataset(),
            reward_fn=CrashingReward(crash_at=6),  # one reward call per step: dies in step 6
        ).train()
    before = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in before] == [1, 2, 3, 4, 5]
    # save_steps gave 2 and 4; the failed reward call of step 6 checkpointed step 5 on its way
    # out (the weights were still those of update 5: a rollout changes none).
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [
        "checkpoint-2",
        "checkpoint-4",
        "checkpoint-5",
    ]
    # Step 5's checkpoint holds step 5's end; resuming from 4 instead drops the log's step 5.
    from_4 = PPOTrainer(
        ppo_config(gpt2_policy, out, resume_from_checkpoint=str(out / "checkpoint-4"), **settings),
        train_dataset=dataset(),
        reward_fn=space_reward,
    )
    assert from_4.state.step == 4
    shutil.rmtree(out / "checkpoint-5")

    resumed = PPOTrainer(
        ppo_config(gpt2_policy, out, resume_from_checkpoint="latest", **settings),
        train_dataset=dataset(),
        reward_fn=space_reward,
    )
    assert resumed.state.step == 4
    resumed.train()
    after = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in after] == [1, 2, 3, 4, 5, 6]
    assert after[:4] == before[:4]  # step 5 of the crashed run was dropped, not duplicated
    assert json.loads((out / "checkpoint-6" / "trainer_state.json").read_text())["step"] == 6
    assert {r["step"] for r in read_jsonl(out / "samples.jsonl")} == {1, 2, 3, 4, 5, 6}
    # Same data order, RNG, weights and optimiser state: the resumed steps repeat the
    # uninterrupted run's.
    for got, want in zip(after[4:], full[4:], strict=True):
        for key in ALGORITHM_METRICS:
            assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), (got["step"], key)


def test_resume_from_an_explicit_checkpoint_path(gpt2_policy: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    PPOTrainer(
        ppo_config(gpt2_policy, out, total_episodes=16, save_steps=1),
        train_dataset=dataset(),
        reward_fn=space_reward,
    ).train()
    resumed = PPOTrainer(
        ppo_config(
            gpt2_policy, out, total_episodes=16, resume_from_checkpoint=str(out / "checkpoint-1")
        ),
        train_dataset=dataset(),
        reward_fn=space_reward,
    )
    assert resumed.state.step == 1 and resumed.state.episode == 8
    with pytest.raises(ConfigError, match="not a checkpoint"):
        PPOTrainer(
            ppo_config(gpt2_policy, out, resume_from_checkpoint=str(tmp_path)),
            train_dataset=dataset(),
            reward_fn=space_reward,
        )


# ----------------------------------------------------------------------------- rewards


def test_reward_function_must_return_one_score_per_response(
    gpt2_policy: Path, tmp_path: Path
) -> None:
    trainer = PPOTrainer(
        ppo_config(gpt2_policy, tmp_path / "run"),
        train_dataset=dataset(),
        reward_fn=lambda prompts, responses: [0.0],
    )
    with pytest.raises(ValueError, match="returned 1 scores for 8 responses"):
        trainer.train()


def test_score_transform_baseline_and_scale(gpt2_policy: Path, tmp_path: Path) -> None:
    cfg = ppo_config(
        gpt2_policy,
        tmp_path / "run",
        total_episodes=8,
        reward_baseline=2.0,
        reward_scale=0.5,
        learning_rate=0.0,
    )
    history = PPOTrainer(
        cfg, train_dataset=dataset(), reward_fn=lambda p, r: [3.0] * len(r)
    ).train()
    assert history[0]["objective/raw_scores"] == pytest.approx(3.0)
    assert history[0]["objective/scores"] == pytest.approx((3.0 - 2.0) * 0.5)


@pytest.fixture(scope="module")
def chat_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny GPT-2 chat policy: Zephyr-style markup as special tokens, EOS "</s>"."""
    return tiny_models.save_gpt2_chat_policy(tmp_path_factory.mktemp("chat_policy"))


def test_chat_prompts_reach_the_server_as_conversations(chat_policy: Path, tmp_path: Path) -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/info":
            return httpx.Response(200, json={"model": "rm", "max_client_batch": 64})
        body = json.loads(request.content)
        bodies.append(body)
        n = len(body["conversations"])
        scores = [len(c[-1]["content"]) / 10 for c in body["conversations"]]
        return httpx.Response(
            200,
            json={"scores": scores, "tokens": [5] * n, "truncated": [i % 4 == 0 for i in range(n)]},
        )

    client = RewardClient(
        "http://rm.test", http_client=httpx.Client(transport=httpx.MockTransport(handler))
    )
    chats = [
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": p}]
        if i % 2
        else [{"role": "user", "content": p}]
        for i, p in enumerate(PROMPTS)
    ]
    cfg = ppo_config(chat_policy, tmp_path / "run", stop_token="eos", total_episodes=16)
    history = PPOTrainer(
        cfg, train_dataset=[{"prompt": c} for c in chats], reward_fn=client
    ).train()

    assert bodies and all(set(b) <= {"conversations", "truncate"} for b in bodies)
    conversations = [c for b in bodies for c in b["conversations"]]
    assert len(conversations) == 16
    for conversation in conversations:
        *prompt, answer = conversation
        assert prompt in chats  # the original messages, not the rendered template
        assert answer["role"] == "assistant"
        for marker in ("<|user|>", "<|assistant|>", "<|system|>", "</s>"):
            assert marker not in json.dumps(conversation), marker
    assert [row["reward/truncated_frac"] for row in history] == [0.25, 0.25]


def _mock_client(seen: list[str]) -> RewardClient:
    """A RewardClient whose transport records the thread each request is sent from."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/info":
            return httpx.Response(200, json={"model": "rm", "max_client_batch": 64})
        seen.append(threading.current_thread().name)
        n = len(json.loads(request.content)["responses"])
        body = {"scores": [0.5] * n, "tokens": [3] * n, "truncated": [False] * n}
        return httpx.Response(200, json=body)

    return RewardClient(
        "http://rm.test", http_client=httpx.Client(transport=httpx.MockTransport(handler))
    )


@pytest.mark.parametrize(
    ("remote", "overlap", "expected_thread"),
    [
        (True, None, "ppo-reward"),  # default for the HTTP client: overlapped
        (False, None, "MainThread"),  # default for a local function: inline
        (False, True, "ppo-reward"),
        (True, False, "MainThread"),
    ],
)
def test_reward_overlap_default_and_override(
    gpt2_policy: Path,
    tmp_path: Path,
    remote: bool,
    overlap: bool | None,
    expected_thread: str,
) -> None:
    seen: list[str] = []

    def local(prompts: list[Any], responses: list[str]) -> list[float]:
        seen.append(threading.current_thread().name)
        time.sleep(0.05)
        return space_reward(prompts, responses)

    reward_fn = _mock_client(seen) if remote else local
    cfg = ppo_config(gpt2_policy, tmp_path / "run", total_episodes=8, overlap_reward=overlap)
    trainer = PPOTrainer(cfg, train_dataset=dataset(), reward_fn=reward_fn)
    assert trainer.overlap_reward is (expected_thread != "MainThread")
    history = trainer.train()
    assert len(history) == 1 and seen  # one step, scored
    assert all(name.startswith(expected_thread) for name in seen), seen
    if expected_thread == "MainThread" and not remote:
        # not overlapped: all of the reward's time is time the trainer waited for it
        assert history[0]["time/reward_wait_s"] >= 0.05 * len(seen)


@pytest.mark.parametrize(
    ("urls", "device", "expected"),
    [
        (["http://127.0.0.1:8000"], "cpu", False),  # same CPU: the two would compete
        (["http://localhost:8000", "http://[::1]:8001"], "cpu", False),
        (["http://127.0.0.1:8000"], "cuda", True),  # a GPU trainer leaves the CPU free
        (["http://rm-0:8000"], "cpu", True),  # another machine (or container name)
        (["http://127.0.0.1:8000", "http://10.1.2.3:8000"], "cpu", True),
    ],
)
def test_default_overlap_follows_where_the_reward_runs(
    urls: list[str], device: str, expected: bool
) -> None:
    client = RewardClient(urls, http_client=httpx.Client())
    assert default_overlap(client, torch.device(device)) is expected
    # a reward computed in process competes with the passes on any device
    assert default_overlap(space_reward, torch.device(device)) is False


# ----------------------------------------------------------------------------- precision, trackers


@pytest.fixture
def fresh_accelerate_state() -> Iterator[None]:
    """accelerate keeps one process-wide state; a different precision needs a fresh one."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.usefixtures("fresh_accelerate_state")
def test_bf16_mixed_precision_run(gpt2_policy: Path, tmp_path: Path) -> None:
    cfg = ppo_config(gpt2_policy, tmp_path / "run", bf16=True, total_episodes=16)
    trainer = PPOTrainer(cfg, train_dataset=dataset(), reward_fn=space_reward)
    assert trainer.accelerator.mixed_precision == "bf16"
    history = trainer.train()
    for row in history:
        assert all(math.isfinite(row[k]) for k in TRL_METRICS), row


def test_missing_tracker_is_skipped_with_a_warning(
    gpt2_policy: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    # tensorboard is installed here: hide it (and tensorboardX) from the import system.
    find_spec = importlib.util.find_spec

    def hidden(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.split(".")[0] in ("tensorboard", "tensorboardX"):
            return None
        return find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", hidden)
    cfg = ppo_config(gpt2_policy, tmp_path / "run", total_episodes=8, report_to="tensorboard")
    with caplog.at_level("WARNING", logger="ppo_client.reporting"):
        history = PPOTrainer(cfg, train_dataset=dataset(), reward_fn=space_reward).train()
    assert len(history) == 1
    assert "tensorboard is not installed" in caplog.text
