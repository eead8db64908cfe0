"""PPO with dense rewards from a process reward model (``reward_mode: process``) and running
reward normalisation, in process and end to end through ``ppo-client train``.

The reward server here is the counterpart of tests/counterparts.py (a process model ``prm``
whose steps are split on spaces, and a sequence model ``rm``), reached through the
``prm_server`` fixture only: switching to the real ``reward-server --models`` with a tiny PRM
(``step_separator: " "``) is a fixture change; the checks read the trainer's own outputs.
"""

from __future__ import annotations

import json
import math
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from counterparts import Counterpart, prm_app, serving, split_steps, step_score
from test_ppo_e2e import PPO_CLIENT, _env
from test_trainer import PROMPTS, dataset, make_config, read_jsonl, space_reward
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from ppo_client import PPOTrainer, RewardClient
from ppo_client.config import ConfigError

SEPARATOR = " "


@pytest.fixture(scope="module")
def prm_server() -> Iterator[Counterpart]:
    """A reward server with a process model (steps split on SEPARATOR) and a sequence one."""
    server = Counterpart()
    with serving(prm_app(server, SEPARATOR), server):
        yield server


def check_placement(tokenizer: PreTrainedTokenizerBase, sample: dict[str, Any]) -> None:
    """Each step's score sits on the policy token whose decoded prefix first covers the
    step's last character, as the server split the response the trainer sent it."""
    ids, text = sample["response_ids"], sample["response"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    ends = split_steps(text, SEPARATOR)
    assert len(sample["step_tokens"]) == len(ends) == len(sample["step_scores"])
    starts = [0, *ends[:-1]]
    for start, end, token, score in zip(
        starts, ends, sample["step_tokens"], sample["step_scores"], strict=True
    ):
        assert score == pytest.approx(step_score(text[start:end]))
        if end == 0:  # an empty response: its one step on the last (stop) token
            assert token == len(ids) - 1
            continue

        def covers(n: int, end: int = end) -> bool:
            return tokenizer.decode(ids[:n], skip_special_tokens=True).startswith(text[:end])

        assert covers(token + 1) and not covers(token), (text, end, token)


def test_process_mode_places_step_rewards_and_normalises_outcomes(
    gpt2_policy: Path, prm_server: Counterpart, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    cfg = make_config(
        gpt2_policy,
        out,
        reward_mode="process",
        reward_normalization="running",
        reward_normalization_window=6,
        total_episodes=8 * 2,
        num_ppo_epochs=1,
        save_steps=2,
        num_sample_generations=2,
        num_samples_to_log=8,
        stop_token="eos",
    )
    with RewardClient(prm_server.url) as client:
        history = PPOTrainer(cfg, train_dataset=dataset(), reward_fn=client).train()
    assert [h["step"] for h in history] == [1, 2]
    for row in history:
        assert math.isfinite(row["objective/step_scores_mean"])
        assert 0.0 <= row["objective/step_scores_mean"] < 1.0
        assert row["objective/steps_per_response"] >= 1.0
    tokenizer = AutoTokenizer.from_pretrained(gpt2_policy)
    samples = read_jsonl(out / "samples.jsonl")
    assert len(samples) == 16
    assert any(len(s["step_tokens"]) > 1 for s in samples)  # responses of several steps
    for sample in samples:
        check_placement(tokenizer, sample)
        # The outcome model's score is the score at the last token.
        assert sample["score"] == pytest.approx(len(sample["response"]) / 10, abs=1e-5)
    # The running window holds the last 6 of the 16 outcome scores seen.
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert len(state["reward_window"]) == 6


def test_process_mode_fails_at_start_up_without_a_process_model(
    gpt2_policy: Path, tmp_path: Path
) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/info"
        models = [{"name": "helpful", "kind": "sequence"}, {"name": "safe", "kind": "sequence"}]
        return httpx.Response(200, json={"max_client_batch": 8, "models": models})

    http = httpx.Client(transport=httpx.MockTransport(handler))
    client = RewardClient("http://rm:8000", http_client=http)
    cfg = make_config(gpt2_policy, tmp_path, reward_mode="process")
    with pytest.raises(ConfigError, match=r"serves no kind: process model \(it serves: helpful"):
        PPOTrainer(cfg, train_dataset=dataset(), reward_fn=client)


def test_process_mode_with_a_plain_reward_function_fails_at_the_first_call(
    gpt2_policy: Path, tmp_path: Path
) -> None:
    cfg = make_config(gpt2_policy, tmp_path, reward_mode="process", total_episodes=8)
    trainer = PPOTrainer(cfg, train_dataset=dataset(), reward_fn=space_reward)
    with pytest.raises(ValueError, match="reward_mode is process but the reward answered no"):
        trainer.train()


def test_ppo_client_train_in_process_mode(
    gpt2_policy: Path, prm_server: Counterpart, tmp_path: Path
) -> None:
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:16]))
    out = tmp_path / "out"
    config = tmp_path / "ppo.yaml"
    config.write_text(
        f"model_name_or_path: {gpt2_policy}\n"
        f"reward_url: {prm_server.url}\n"
        f"dataset_name: {data}\n"
        f"output_dir: {out}\n"
        "reward_mode: process\n"
        "per_device_train_batch_size: 4\n"
        "local_rollout_forward_batch_size: 4\n"
        "total_episodes: 12\n"
        "response_length: 8\n"
        "num_ppo_epochs: 1\n"
        "stop_token: eos\n"
        "num_sample_generations: 3\n"
        "num_samples_to_log: 4\n"
        "disable_tqdm: true\n"
    )
    before = prm_server.score_requests()
    proc = subprocess.run(
        [str(PPO_CLIENT), "train", "--config", str(config)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "done: 3 steps" in proc.stdout
    assert prm_server.score_requests() - before == 3  # one chunk of 4 per step
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        assert math.isfinite(row["objective/step_scores_mean"])
        assert row["objective/steps_per_response"] >= 1.0
    tokenizer = AutoTokenizer.from_pretrained(gpt2_policy)
    samples = read_jsonl(out / "samples.jsonl")
    assert len(samples) == 12
    for sample in samples:
        check_placement(tokenizer, sample)
