"""PPO with dense rewards from a process reward model (``reward_mode: process``) and running
reward normalisation, in process and end to end through ``ppo-client train``.

The reward server is the real ``reward-server --models`` serving a tiny process reward model
``prm`` (a GPT-2 token classifier, two labels, steps split on spaces and read at the step
tag) and a tiny sequence model ``rm`` (BERT), so that answers carry ``outcome_scores``. What
the trainer did is checked against the server's own answer for each logged sample: its
``step_ends`` placed on the policy's tokens by decoding prefixes of the response's ids.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from helpers.apps import models_app
from helpers.servers import serve
from helpers.training import (
    PPO_CLIENT,
    PROMPTS,
    dataset,
    ppo_client_env,
    ppo_config,
    read_jsonl,
    space_reward,
    write_prompts,
)
from server_proc import ServerProcess, score_requests
from transformers import AutoTokenizer, PreTrainedTokenizerBase

import tiny_models
from ppo_client import PPOTrainer
from ppo_client.config import ConfigError
from reward_client import RewardClient
from reward_server.config import LoadOptions
from reward_server.engines._process_reward import load
from reward_server.text.steps import StepOptions

SEPARATOR = " "
ATOL = 1e-5


#: How the server splits and reads the process model's steps.
STEPS = StepOptions(separator=SEPARATOR, tag=tiny_models.STEP_TAG, aggregate="mean")


@pytest.fixture(scope="module")
def prm_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny process reward model (a GPT-2 token classifier, two labels)."""
    return tiny_models.save_process_reward_model(tmp_path_factory.mktemp("prm"), seed=3)


@pytest.fixture(scope="module")
def prm_server(
    bert_rm: Path, prm_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A reward server with a process model (steps split on SEPARATOR) and a sequence one."""
    prm = {
        "name": "prm",
        "model": str(prm_path),
        "kind": "process",
        "step_separator": STEPS.separator,
        "step_tag": STEPS.tag,
        "step_aggregate": STEPS.aggregate,
    }
    models = [prm, {"name": "rm", "model": str(bert_rm)}]
    folder = tmp_path_factory.mktemp("models")
    with serve(None, "--max-wait-ms", "1", models=models, folder=folder) as server:
        yield server


def server_answers(server: ServerProcess, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The server's own answer for each sample's query and response, item by item."""
    with RewardClient(server.url) as client:
        result = client.score_detailed(
            queries=[s["query"] for s in samples],
            responses=[s["response"] for s in samples],
        )
    assert result.step_scores is not None and result.step_ends is not None
    assert result.outcome_scores is not None and result.steps_dropped is not None
    return [
        {
            "step_scores": result.step_scores[i],
            "step_ends": result.step_ends[i],
            "steps_dropped": result.steps_dropped[i],
            "outcome": result.outcome_scores[i],
        }
        for i in range(len(samples))
    ]


def expected_token(tokenizer: PreTrainedTokenizerBase, ids: list[int], text: str, end: int) -> int:
    """The policy token a step ending at ``end`` goes on: the first whose prefix of the
    response decodes to a text covering ``text[:end]`` (an empty step: the last token)."""
    if end == 0:
        return len(ids) - 1
    for n in range(1, len(ids) + 1):
        if tokenizer.decode(ids[:n], skip_special_tokens=True).startswith(text[:end]):
            return n - 1
    raise AssertionError(f"no prefix of {ids} covers {text[:end]!r}")


def check_samples(
    tokenizer: PreTrainedTokenizerBase,
    server: ServerProcess,
    samples: list[dict[str, Any]],
) -> None:
    """Each sample's step scores are the server's, each on the token its step ends in, and
    its outcome score the sequence model's."""
    for sample, answer in zip(samples, server_answers(server, samples), strict=True):
        ids, text = sample["response_ids"], sample["response"]
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
        ends = answer["step_ends"]
        assert answer["steps_dropped"] == 0
        # The server's steps: split where the separator ends, the last at the text's end.
        assert ends == sorted(ends) and ends[-1] == len(text)
        assert all(text[:end].endswith(SEPARATOR) for end in ends[:-1]), (text, ends)
        assert sample["step_scores"] == pytest.approx(answer["step_scores"], abs=ATOL)
        expected = [expected_token(tokenizer, ids, text, end) for end in ends]
        assert sample["step_tokens"] == expected, (text, ends)
        # The outcome (sequence) model's score is the score at the last token.
        assert sample["score"] == pytest.approx(answer["outcome"], abs=ATOL)


def test_process_mode_places_step_rewards_and_normalises_outcomes(
    gpt2_policy: Path, prm_server: ServerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    cfg = ppo_config(
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
        # Two labels: each step score is a probability.
        assert 0.0 <= row["objective/step_scores_mean"] <= 1.0
        assert row["objective/steps_per_response"] >= 1.0
    samples = read_jsonl(out / "samples.jsonl")
    assert len(samples) == 16
    assert any(len(s["step_tokens"]) > 1 for s in samples)  # responses of several steps
    check_samples(AutoTokenizer.from_pretrained(gpt2_policy), prm_server, samples)
    # The running window holds the last 6 of the 16 outcome scores seen.
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    assert len(state["reward_window"]) == 6


def test_process_mode_fails_at_start_up_without_a_process_model(
    gpt2_policy: Path, bert_rm: Path, gpt2_rm: Path, tmp_path: Path
) -> None:
    models = [
        {"name": "helpful", "model": str(bert_rm)},
        {"name": "safe", "model": str(gpt2_rm)},
    ]
    cfg = ppo_config(gpt2_policy, tmp_path, reward_mode="process")
    no_process = pytest.raises(
        ConfigError, match=r"serves no kind: process model \(it serves: helpful"
    )
    # The app in process through the client's http_client seam: a second server process
    # would add nothing to what the module's real server shows.
    app = models_app(tmp_path, models)
    with (
        TestClient(app) as http,
        RewardClient("http://testserver", http_client=http) as client,
        no_process,
    ):
        PPOTrainer(cfg, train_dataset=dataset(), reward_fn=client)


def test_process_mode_with_a_plain_reward_function_fails_at_the_first_call(
    gpt2_policy: Path, tmp_path: Path
) -> None:
    cfg = ppo_config(gpt2_policy, tmp_path, reward_mode="process", total_episodes=8)
    trainer = PPOTrainer(cfg, train_dataset=dataset(), reward_fn=space_reward)
    with pytest.raises(ValueError, match="reward_mode is process but the reward answered no"):
        trainer.train()


def test_ppo_client_train_in_process_mode(
    gpt2_policy: Path, prm_server: ServerProcess, prm_path: Path, tmp_path: Path
) -> None:
    """``ppo-client train`` with ``reward_mode: process`` against ``reward-server --models``
    (the one end-to-end PRM run): it completes, each step's score is the server's and the
    process model's run here for the pair the trainer sent, on the policy token of its last
    character."""
    data = write_prompts(tmp_path / "prompts.jsonl", PROMPTS[:16])
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
    before = score_requests(prm_server.url)
    proc = subprocess.run(
        [str(PPO_CLIENT), "train", "--config", str(config)],
        capture_output=True,
        text=True,
        env=ppo_client_env(),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "done: 3 steps" in proc.stdout
    assert score_requests(prm_server.url) - before == 3  # one chunk of 4 per step
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for row in rows:
        # Two labels: each step score is a probability.
        assert 0.0 <= row["objective/step_scores_mean"] <= 1.0
        assert row["objective/steps_per_response"] >= 1.0
    samples = read_jsonl(out / "samples.jsonl")
    assert len(samples) == 12
    check_samples(AutoTokenizer.from_pretrained(gpt2_policy), prm_server, samples)
    # And the step scores are the process model's own, run here in one pass.
    model = load(LoadOptions(model=str(prm_path), device="cpu"), STEPS)
    items = model.rendering.encode_pairs(
        [s["query"] for s in samples], [s["response"] for s in samples], truncate=True
    )
    for sample, expected in zip(samples, model.score_steps(items), strict=True):
        assert sample["step_scores"] == pytest.approx(expected.step_scores, abs=ATOL)
