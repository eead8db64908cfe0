"""End to end (issue 50, acceptance 4): TRL's GRPOTrainer against a server whose reward is an
OpenAI ``multi`` grader of a ``python``, a ``string_check`` and a ``score_model`` leaf, the
score model a tiny local judge (helpers.grader_judge, a ``kind: judge`` entry of the same
file), the dataset's ``item`` column the grader's ``item`` namespace.

For every step, the reward TRL logs equals the mean of what OpenAI's
``/v1/fine_tuning/alpha/graders/run`` answers, asked through the ``openai`` package, for the
same completions and items: the grader object is served as-is by both routes. ``on_error:
0`` (OpenAI's behaviour): a grade that fails is 0 in both.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from datasets import Dataset
from helpers.grader_judge import EXACT, judge_entry
from helpers.servers import serve
from helpers.training import ScoreCapture, grpo_config, grpo_trainer
from server_proc import ServerProcess
from transformers import AutoModelForCausalLM, AutoTokenizer

import tiny_models
from reward_client.integrations.trl import RemoteReward

STEPS = 2
PROMPTS_PER_STEP, GENERATIONS = 2, 4
GRADER = {
    "type": "multi",
    "name": "rft",
    "graders": {
        "py": {
            "type": "python",
            "name": "py",
            "source": "def grade(sample, item):\n    return min(1.0, len(sample['output_text'].split()) / 8)\n",
        },
        "exact": EXACT,
        "judge": {
            "type": "score_model",
            "name": "judge",
            "model": "judge",
            # the judge was trained to rate by the last word: the item's
            "input": [
                {"role": "user", "content": "Rate: {{ sample.output_text }} {{ item.word }}"}
            ],
            "sampling_params": {"max_completions_tokens": 24},
        },
    },
    "calculate_output": "(py + exact + judge) / 3",
}


@pytest.fixture(scope="module")
def server(grader_judge: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    entries = [
        judge_entry(grader_judge, on_error=0),
        {"name": "rft", "kind": "grader", "grader": GRADER, "on_error": 0, "workers": 2},
    ]
    with serve(None, models=entries, folder=tmp_path_factory.mktemp("grpo-graders")) as srv:
        yield srv


@pytest.mark.timeout(900)
def test_trl_logs_the_reward_graders_run_gives(
    gpt2_policy: Path, server: ServerProcess, tmp_path: Path
) -> None:
    capture = ScoreCapture(strict=True)
    reward = RemoteReward(server.url, model="rft", label_key="item", http_client=capture.client())
    config = grpo_config(
        tmp_path,
        max_steps=STEPS,
        per_device_train_batch_size=PROMPTS_PER_STEP * GENERATIONS,
        num_generations=GENERATIONS,
        temperature=1.0,
    )
    prompts = tiny_models.make_corpus(8, seed=3, min_words=2, max_words=5)
    words = ["great", "bad", "good", "great"]
    items = [{"answer": p.split()[0], "word": words[i % 4]} for i, p in enumerate(prompts)]
    trainer = grpo_trainer(
        model=AutoModelForCausalLM.from_pretrained(gpt2_policy),
        reward_funcs=[reward],
        args=config,
        train_dataset=Dataset.from_dict({"prompt": prompts * 2, "item": items * 2}),
        processing_class=AutoTokenizer.from_pretrained(gpt2_policy),
    )
    trainer.train()

    logged = [h for h in trainer.state.log_history if "reward" in h and "step" in h]
    assert [h["step"] for h in logged] == list(range(1, STEPS + 1))
    assert len(capture.exchanges) == STEPS
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)
    judged = 0
    for step, (body, answer) in zip(logged, capture.exchanges, strict=True):
        runs = [
            client.fine_tuning.alpha.graders.run(grader=GRADER, model_sample=response, item=item)  # type: ignore[arg-type]
            for response, item in zip(body["responses"], body["labels"], strict=True)
        ]
        assert answer["scores"] == pytest.approx([run.reward for run in runs])
        mean = statistics.fmean(run.reward for run in runs)
        assert step["reward"] == pytest.approx(mean, rel=1e-5, abs=1e-6)
        judged += sum(bool(run.sub_rewards.get("judge")) for run in runs)
    assert judged > 0  # the score model answered, not only failed
