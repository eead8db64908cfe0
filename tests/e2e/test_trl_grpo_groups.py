"""TRL's GRPOTrainer sends its groups (``num_generations`` completions of one prompt) through
``RemoteReward`` to a real server whose reward model and verifier are both ``normalize:
group``, and the rewards TRL gets equal the server's own ``/score`` answer for the same
groups (issue 36, acceptance 3)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from datasets import Dataset
from helpers.models_files import length_verifier
from helpers.servers import serve
from helpers.training import ScoreCapture, grpo_config, grpo_trainer
from server_proc import ServerProcess
from transformers import AutoModelForCausalLM, AutoTokenizer

import tiny_models
from reward_client.integrations.trl import RemoteReward

ROOT = Path(__file__).resolve().parents[2]
GENERATIONS = 4
PROMPTS_PER_STEP = 2
STEPS = 2


@pytest.fixture(scope="module")
def server(bert_rm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A reward model and a python verifier, each normalised within its group."""
    folder = tmp_path_factory.mktemp("trl_groups")
    models = [
        {"name": "rm", "model": str(bert_rm), "weight": 1.0, "normalize": "group"},
        length_verifier(weight=0.5, normalize="group"),
    ]
    with serve(models=models, folder=folder) as srv:
        yield srv


@pytest.mark.timeout(600)
def test_grpo_sends_its_groups_and_gets_the_server_s_scores(
    gpt2_policy: Path, server: ServerProcess, tmp_path: Path
) -> None:
    capture = ScoreCapture(strict=True)
    prompts = tiny_models.make_corpus(8, seed=7, min_words=2, max_words=5)
    assert len(set(prompts)) == len(prompts)
    config = grpo_config(
        tmp_path,
        max_steps=STEPS,
        per_device_train_batch_size=PROMPTS_PER_STEP * GENERATIONS,
        num_generations=GENERATIONS,
        temperature=1.0,
    )
    trainer = grpo_trainer(
        model=AutoModelForCausalLM.from_pretrained(gpt2_policy),
        reward_funcs=[RemoteReward(server.url, http_client=capture.client())],
        args=config,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=AutoTokenizer.from_pretrained(gpt2_policy),
    )
    trainer.train()

    assert len(capture.exchanges) == STEPS  # one request per generation batch
    groups = [list(range(g * GENERATIONS, (g + 1) * GENERATIONS)) for g in range(PROMPTS_PER_STEP)]
    for body, answer in capture.exchanges:
        # TRL's order: num_generations completions of each prompt in a row, one group each.
        assert body["groups"] == groups
        for group in groups:
            assert len({body["queries"][i] for i in group}) == 1
        # The server's own answer for the same items and groups.
        again = httpx.post(f"{server.url}/score", json=body, timeout=60)
        assert again.status_code == 200, again.text
        assert answer["scores"] == pytest.approx(again.json()["scores"], abs=1e-5)
        # Both components are z-scores within each group: the weighted sum is 0 there.
        for group in groups:
            assert sum(answer["scores"][i] for i in group) == pytest.approx(0.0, abs=1e-4)
        # Without its groups such a server refuses the request.
        ungrouped = {k: v for k, v in body.items() if k != "groups"}
        refused = httpx.post(f"{server.url}/score", json=ungrouped, timeout=60)
        assert refused.status_code == 422 and "bad_groups" in refused.text
    # The rewards TRL took for the last batch are the server's scores.
    last_body, last_answer = capture.exchanges[-1]
    assert list(trainer._logs["prompt"]) == last_body["queries"]
    assert list(trainer._logs["completion"]) == last_body["responses"]
    logged = list(trainer._logs["rewards"]["remote_reward"])
    assert logged == pytest.approx(last_answer["scores"], abs=1e-5)
