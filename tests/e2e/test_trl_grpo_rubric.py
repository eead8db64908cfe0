"""End to end (issue 51, acceptance 4, TRL's half): TRL's GRPOTrainer trains a tiny policy on
a rubric judge's reward. Each prompt of the dataset carries its rubric in a column
(``rubric``: criteria with categories, weights, a pitfall and a required one), which
``RemoteReward(label_key="rubric")`` sends as the items' labels; the server judges each
criterion in a row of its own. Every step's logged reward equals the mean of the server's
scores of that step's completions, and the answers carry each completion's criteria.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from datasets import Dataset
from helpers import rubrics
from helpers.servers import serve
from helpers.training import ScoreCapture, grpo_config, grpo_trainer
from server_proc import ServerProcess, metric
from transformers import AutoModelForCausalLM, AutoTokenizer

import tiny_models
from reward_client.integrations.trl import RemoteReward

STEPS = 2
PROMPTS_PER_STEP, GENERATIONS = 2, 4
#: Two rubrics, each criterion with every key (a dataset's table gives each row the same
#: keys: a missing one is null, which the server reads as absent).
RUBRICS: list[list[dict[str, Any]]] = [
    [
        {"text": "Is polite", "category": "essential", "weight": None, "required": None},
        {"text": "Is short", "category": None, "weight": 2.0, "required": None},
        {"text": "Is rude", "category": "pitfall", "weight": None, "required": None},
    ],
    [
        {"text": "Answers", "category": "important", "weight": None, "required": True},
        {"text": "Is clear", "category": "optional", "weight": None, "required": None},
        {"text": "Repeats itself", "category": None, "weight": -1.0, "required": None},
    ],
]


@pytest.fixture(scope="module")
def rubric_server(
    judges: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    entry = rubrics.entry(judges["gpt2"], max_length=128, truncation_side="left")
    with serve(
        None, "--max-wait-ms", "1", models=[entry], folder=tmp_path_factory.mktemp("rg")
    ) as srv:
        yield srv


@pytest.mark.timeout(600)
def test_grpo_trains_on_a_rubric_judges_reward(
    gpt2_policy: Path, rubric_server: ServerProcess, tmp_path: Path
) -> None:
    capture = ScoreCapture(strict=True)
    reward = RemoteReward(rubric_server.url, label_key="rubric", http_client=capture.client())
    config = grpo_config(
        tmp_path,
        max_steps=STEPS,
        per_device_train_batch_size=PROMPTS_PER_STEP * GENERATIONS,
        num_generations=GENERATIONS,
        temperature=1.0,
    )
    prompts = tiny_models.make_corpus(4, seed=5, min_words=2, max_words=4)
    data = {"prompt": prompts * 2, "rubric": [RUBRICS[i % 2] for i in range(8)]}
    trainer = grpo_trainer(
        model=AutoModelForCausalLM.from_pretrained(gpt2_policy),
        reward_funcs=[reward],
        args=config,
        train_dataset=Dataset.from_dict(data),
        processing_class=AutoTokenizer.from_pretrained(gpt2_policy),
    )
    trainer.train()

    steps = [h for h in trainer.state.log_history if "reward" in h and "step" in h]
    assert [h["step"] for h in steps] == list(range(1, STEPS + 1))
    assert len(capture.exchanges) == STEPS  # one request per step
    for logged, (body, answer) in zip(steps, capture.exchanges, strict=True):
        scores = answer["scores"]
        assert len(scores) == PROMPTS_PER_STEP * GENERATIONS and None not in scores
        # The labels sent are the rows' rubrics; each completion's criteria come back.
        assert [len(label) for label in body["labels"]] == [3] * len(scores)
        criteria = answer["criteria"]["rubric"]
        assert [len(c) for c in criteria] == [3] * len(scores)
        mean = statistics.fmean(scores)
        assert logged["reward"] == pytest.approx(mean, rel=1e-5, abs=1e-6)
        assert logged["rewards/remote_reward/mean"] == pytest.approx(mean, rel=1e-5, abs=1e-6)
    # Three rows per completion went through the judge's scheduler.
    rows = metric(rubric_server.url, "reward_server_model_batch_rows_sum", model="rubric")
    assert rows >= 3 * STEPS * PROMPTS_PER_STEP * GENERATIONS
    # The logged per-completion rewards of the last step are the server's.
    last = capture.answers[-1]["scores"]
    assert list(trainer._logs["rewards"]["remote_reward"]) == pytest.approx(last, abs=1e-6)
