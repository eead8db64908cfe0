"""End to end (issue 21, acceptance 5): TRL's GRPOTrainer learns "What is 3 + 4?" from a
server whose models file holds a ``math`` verifier weighted 1.0 and a learned reward model
weighted 0.1; the reference answer travels from the dataset's ``answer`` column to the
verifier as the item's label.

The policy is a tiny GPT-2 first taught the task's shape (a question, then a one-digit
answer drawn at random), so that it answers with some digit, right about one time in ten;
GRPO must then make it say 7. The verifier's own mean score is TRL's
``rewards/correct/mean`` (one reward function per component of the server's answer).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml
from datasets import Dataset
from server_proc import ServerProcess, metric, running_server
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

import tiny_models
from examples import grpo_remote_reward, gsm8k_prompts
from reward_client.integrations.trl import RemoteReward
from reward_server.config import read_models_file

QUESTION = "What is 3 + 4?"
STEPS = 60
FIRST, LAST = "first", "last"


def _lines(rng: random.Random, n: int) -> list[str]:
    """Questions with a random one-digit answer (right or not): the task's shape only."""
    return [
        f"What is {rng.randint(0, 9)} + {rng.randint(0, 9)}? {rng.randint(0, 9)}" for _ in range(n)
    ]


@pytest.fixture(scope="module")
def arithmetic_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rng = random.Random(0)
    corpus = _lines(rng, 2000)
    tokenizer = tiny_models.byte_bpe_tokenizer(corpus, vocab_size=300, pad_is_eos=True)
    model = tiny_models.gpt2_causal_lm(tokenizer, seed=0, n_positions=64, n_embd=48)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _step in range(300):
        batch = [line + tokenizer.eos_token for line in _lines(rng, 32)]
        enc = tokenizer(batch, return_tensors="pt", padding=True)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        loss = model(**enc, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert loss.item() < 2.5, f"the policy did not learn the task's shape (loss {loss.item()})"
    return tiny_models.save(tmp_path_factory.mktemp("arith-policy"), model, tokenizer)


@pytest.fixture(scope="module")
def maths_server(
    gpt2_rm: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    models = {
        "models": [
            {"name": "correct", "kind": "verifier", "verifier": "math", "weight": 1.0},
            {"name": "rm", "model": str(gpt2_rm), "weight": 0.1},
        ]
    }
    path = tmp_path_factory.mktemp("maths") / "models.yaml"
    path.write_text(yaml.safe_dump(models), encoding="utf-8")
    with running_server(None, "--models", str(path), timeout=120) as server:
        yield server


def test_grpo_learns_the_answer_the_math_verifier_checks(
    arithmetic_policy: Path, maths_server: ServerProcess, tmp_path: Path
) -> None:
    reward = RemoteReward(maths_server.url, label_key="answer")
    correct, rm = reward.components()
    config = GRPOConfig(
        output_dir=str(tmp_path / "grpo"),
        max_steps=STEPS,
        per_device_train_batch_size=8,
        num_generations=8,
        max_completion_length=4,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        reward_weights=[1.0, 0.1],
        temperature=1.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
    )
    tokenizer = AutoTokenizer.from_pretrained(arithmetic_policy)
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(arithmetic_policy),
        reward_funcs=[correct, rm],
        args=config,
        train_dataset=Dataset.from_dict({"prompt": [QUESTION] * 64, "answer": ["7"] * 64}),
        processing_class=tokenizer,
    )
    trainer.train()
    means = [
        h["rewards/correct/mean"] for h in trainer.state.log_history if "rewards/correct/mean" in h
    ]
    assert len(means) == STEPS
    first, last = sum(means[:6]) / 6, sum(means[-6:]) / 6
    # The verifier's mean score rises: the policy says 7 more often than it did.
    assert last > first + 0.2, (first, last, means)
    assert last >= 0.4, means
    assert any(h.get("rewards/rm/mean") is not None for h in trainer.state.log_history)


def test_the_grpo_example_sends_the_label_column(
    arithmetic_policy: Path, maths_server: ServerProcess, tmp_path: Path
) -> None:
    data = tmp_path / "prompts.jsonl"
    rows = [{"prompt": QUESTION, "answer": "7"}] * 8
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    argv = ["--reward-url", maths_server.url, "--model", str(arithmetic_policy)]
    argv += ["--dataset", str(data), "--label-column", "answer", "--output-dir", str(tmp_path)]
    argv += ["--max-steps", "2", "--per-device-train-batch-size", "4", "--num-generations", "4"]
    argv += ["--max-completion-length", "4", "--use-cpu"]
    history = grpo_remote_reward.main(argv)
    rewards = [
        h["rewards/remote_reward/mean"] for h in history if "rewards/remote_reward/mean" in h
    ]
    assert len(rewards) == 2 and all(math.isfinite(r) for r in rewards)
    verified = metric(maths_server.url, "reward_server_model_items_total", model="correct")
    assert verified >= 16  # the verifier scored every completion, with its label


def test_gsm8k_rows_ask_for_a_boxed_answer_and_carry_the_reference() -> None:
    examples = [
        {"question": "Tom has 3 apples and buys 4. How many?", "answer": "3 + 4 = 7\n#### 7"},
        {"question": "How many cents in $12?", "answer": "12 * 100 = 1200\n#### 1,200"},
    ]
    rows = list(gsm8k_prompts.rows(examples))
    assert [row["answer"] for row in rows] == ["7", "1200"]
    assert (
        rows[0]["prompt"][0]["role"] == "system" and "\\boxed{}" in rows[0]["prompt"][0]["content"]
    )
    assert rows[1]["prompt"][1] == {"role": "user", "content": examples[1]["question"]}
    with pytest.raises(ValueError, match="####"):
        gsm8k_prompts.answer_of("no final answer")


def test_the_example_models_file_is_valid() -> None:
    spec = read_models_file(
        Path(__file__).resolve().parents[1] / "examples" / "math_verifier_models.yaml"
    )
    assert [(m.name, m.kind) for m in spec.models] == [("correct", "verifier"), ("rm", "sequence")]
