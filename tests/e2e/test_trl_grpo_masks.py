"""End to end (issue 35, acceptance 2, TRL's half): TRL's GRPOTrainer with a server whose
python verifier raises on about a third of the completions (``on_error: mask``, the
verifiers' default).

The server answers those items ``null`` with the reason ``error``; ``RemoteReward`` hands
TRL None for them; TRL 1.16 leaves such a completion out of its group's baseline, gives it
an advantage of 0 and leaves it out of the logged ``reward``. The run completes, and each
step's logged reward is the mean over the items the server scored, checked against the
server's own answers; the last batch's advantages are checked against a hand computation.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest
from datasets import Dataset
from helpers.servers import serve
from helpers.training import ScoreCapture, grpo_config, grpo_trainer
from server_proc import ServerProcess, metric
from transformers import AutoModelForCausalLM, AutoTokenizer

import tiny_models
from reward_client.integrations.trl import RemoteReward

STEPS = 3
PROMPTS_PER_STEP, GENERATIONS = 2, 4

#: A python verifier that raises for about a third of the responses (chosen by a hash of
#: the text, so the same completion always fails) and scores the others by their length.
VERIFIER = """
import zlib


def third_fails(prompt, response, label):
    if zlib.crc32(response.encode("utf-8")) % 3 == 0:
        raise RuntimeError("no verdict for this one")
    return float(len(response) % 7)
"""


@pytest.fixture(scope="module")
def failing_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("grpo-masks")
    (folder / "third_fails.py").write_text(VERIFIER, encoding="utf-8")
    entry = {
        "name": "check",
        "kind": "verifier",
        "verifier": "python",
        "function": f"{folder / 'third_fails.py'}:third_fails",
        "on_error": "mask",
        "workers": 2,
        "timeout_s": 30,
    }
    with serve(models=[entry], folder=folder) as server:
        yield server


def group_advantages(scores: list[float | None]) -> list[float]:
    """TRL's advantage of each completion of one group, by hand: the scored ones against
    the mean and (Bessel) standard deviation of the scored ones alone; 0 for a masked one,
    and for every one of a group with fewer than two scored (no standard deviation)."""
    scored = [s for s in scores if s is not None]
    if len(scored) < 2:
        return [0.0] * len(scores)
    mean, std = statistics.fmean(scored), statistics.stdev(scored)
    return [0.0 if s is None else (s - mean) / (std + 1e-4) for s in scores]


@pytest.mark.timeout(600)
def test_grpo_runs_through_masked_items_and_logs_the_mean_of_the_scored(
    gpt2_policy: Path, failing_server: ServerProcess, tmp_path: Path
) -> None:
    capture = ScoreCapture()
    reward = RemoteReward(failing_server.url, http_client=capture.client())
    config = grpo_config(
        tmp_path,
        max_steps=STEPS,
        per_device_train_batch_size=PROMPTS_PER_STEP * GENERATIONS,
        num_generations=GENERATIONS,
        temperature=1.0,
    )
    prompts = tiny_models.make_corpus(8, seed=3, min_words=2, max_words=5)
    trainer = grpo_trainer(
        model=AutoModelForCausalLM.from_pretrained(gpt2_policy),
        reward_funcs=[reward],
        args=config,
        train_dataset=Dataset.from_dict({"prompt": prompts * 4}),
        processing_class=AutoTokenizer.from_pretrained(gpt2_policy),
    )
    trainer.train()  # completes: a masked item is no error

    steps = [h for h in trainer.state.log_history if "reward" in h and "step" in h]
    assert [h["step"] for h in steps] == list(range(1, STEPS + 1))
    assert len(capture.answers) == STEPS  # one request per step
    masked_total = 0
    for logged, answer in zip(steps, capture.answers, strict=True):
        scores = answer["scores"]
        assert len(scores) == PROMPTS_PER_STEP * GENERATIONS
        masked = [i for i, s in enumerate(scores) if s is None]
        assert answer.get("masked", [None] * len(scores)) == [
            "error" if s is None else None for s in scores
        ]
        masked_total += len(masked)
        scored = [s for s in scores if s is not None]
        logged_frac = logged["rewards/remote_reward/masked_frac"]
        assert logged_frac == pytest.approx(len(masked) / len(scores))
        if scored:
            # TRL's reward is the mean over the scored items alone (a 0 for each masked one
            # would pull it down).
            mean = statistics.fmean(scored)
            assert logged["reward"] == pytest.approx(mean, rel=1e-5, abs=1e-6)
            assert logged["rewards/remote_reward/mean"] == pytest.approx(mean, rel=1e-5, abs=1e-6)
        else:
            assert math.isnan(logged["reward"])
    # About a third of the completions failed, over the run: masks were really exercised.
    assert 0 < masked_total < STEPS * PROMPTS_PER_STEP * GENERATIONS
    counted = metric(
        failing_server.url, "reward_server_masked_items_total", model="check", reason="error"
    )
    assert counted >= masked_total

    # The last batch: masked rewards are NaN in TRL's table, their advantage 0, and the
    # others' advantages use their group's scored completions alone.
    last = capture.answers[-1]["scores"]
    logged_rewards = list(trainer._logs["rewards"]["remote_reward"])
    assert [math.isnan(r) for r in logged_rewards] == [s is None for s in last]
    expected = [
        a
        for g in range(PROMPTS_PER_STEP)
        for a in group_advantages(last[g * GENERATIONS : (g + 1) * GENERATIONS])
    ]
    assert list(trainer._logs["advantages"]) == pytest.approx(expected, rel=1e-4, abs=1e-4)
