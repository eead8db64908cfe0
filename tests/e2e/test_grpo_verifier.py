"""End to end (issue 21, acceptance 5): TRL's GRPOTrainer learns "What is 3 + 4?" from a
server whose models file holds a ``math`` verifier weighted 1.0 and a learned reward model
weighted 0.1; the reference answer travels from the dataset's ``answer`` column to the
verifier as the item's label.

The policy is a tiny GPT-2 first taught the task's shape (a question, then a one-digit
answer, the sum three times in ten and a random digit otherwise), so that it starts right
about one time in five; GRPO must then make it say 7. The verifier's own mean score is TRL's
``rewards/correct/mean`` (one reward function per component of the server's answer).

The claim rides on RL dynamics, which a CPU's kernels, a thread count or a TRL release can
tilt: a policy that starts from nothing and a learning rate at the edge (1e-2) learned on one
CPU and collapsed after its first update on another. So the start is a policy with a real
signal, the learning rate is far from the edge, and several seeds run, most of which must
learn (measured: every seed reaches 1.0 from 0.15-0.31 under ATEN_CPU_CAPABILITY=avx2 and
avx512, ONEDNN_MAX_CPU_ISA=AVX2, one and two torch threads; ``make test-learning``).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from helpers.servers import serve
from helpers.training import grpo_config, grpo_trainer
from server_proc import ServerProcess, metric
from transformers import AutoModelForCausalLM, AutoTokenizer

import tiny_models
from examples import gsm8k_prompts
from reward_client.integrations.trl import RemoteReward
from reward_server.config import read_models_file

QUESTION = "What is 3 + 4?"
STEPS = 40
SEEDS = (0, 1, 2)
#: How often the pre-training corpus gives the right sum (else a random digit).
RIGHT_IN_CORPUS = 0.3
FIRST, LAST = "first", "last"


def _lines(rng: random.Random, n: int) -> list[str]:
    """Questions whose one-digit sum is the answer now and then, a random digit otherwise."""
    lines = []
    for _ in range(n):
        a, b = rng.randint(0, 4), rng.randint(0, 5)
        answer = a + b if rng.random() < RIGHT_IN_CORPUS else rng.randint(0, 9)
        lines.append(f"What is {a} + {b}? {answer}")
    return lines


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
    models = [
        {"name": "correct", "kind": "verifier", "verifier": "math", "weight": 1.0},
        {"name": "rm", "model": str(gpt2_rm), "weight": 0.1},
    ]
    with serve(models=models, folder=tmp_path_factory.mktemp("maths")) as server:
        yield server


def _grpo_run(policy: Path, server_url: str, out: Path, seed: int) -> list[dict[str, float]]:
    """One GRPO run from ``policy`` against the server; TRL's log history."""
    reward = RemoteReward(server_url, label_key="answer")
    correct, rm = reward.components()
    config = grpo_config(
        out,
        max_steps=STEPS,
        per_device_train_batch_size=8,
        num_generations=8,
        max_completion_length=4,
        learning_rate=3e-3,
        lr_scheduler_type="constant",
        reward_weights=[1.0, 0.1],
        temperature=1.0,
        seed=seed,
    )
    trainer = grpo_trainer(
        model=AutoModelForCausalLM.from_pretrained(policy),
        reward_funcs=[correct, rm],
        args=config,
        train_dataset=Dataset.from_dict({"prompt": [QUESTION] * 64, "answer": ["7"] * 64}),
        processing_class=AutoTokenizer.from_pretrained(policy),
    )
    trainer.train()
    return trainer.state.log_history


# Three GRPO runs: about a minute on an idle 2-core machine, several times that beside make
# test's other worker and a busy neighbour (past the suite's 300 s limit once).
@pytest.mark.timeout(900)
def test_grpo_learns_the_answer_the_math_verifier_checks(
    arithmetic_policy: Path,
    maths_server: ServerProcess,
    tmp_path: Path,
    learning_report: Callable[..., None],
) -> None:
    runs = {}
    for seed in SEEDS:
        history = _grpo_run(arithmetic_policy, maths_server.url, tmp_path / f"seed{seed}", seed)
        means = [h["rewards/correct/mean"] for h in history if "rewards/correct/mean" in h]
        assert len(means) == STEPS
        assert any(h.get("rewards/rm/mean") is not None for h in history)
        runs[seed] = (sum(means[:6]) / 6, sum(means[-6:]) / 6)
    # The verifier's mean score rises: the policy says 7 far more often than it did, in most
    # runs (every one, where it was measured).
    learned = [seed for seed, (first, last) in runs.items() if last >= max(0.6, first + 0.3)]
    learning_report("grpo_math_verifier", runs=runs, learned=len(learned))
    assert len(learned) >= 2, runs
    # Every completion of every step was verified by the server, with its label.
    verified = metric(maths_server.url, "reward_server_model_items_total", model="correct")
    assert verified >= len(SEEDS) * STEPS * 8


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
    from examples import grpo_remote_reward  # here, not at collection: trl imports vLLM

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
        Path(__file__).resolve().parents[2] / "examples" / "math_verifier_models.yaml"
    )
    assert [(m.name, m.kind) for m in spec.models] == [("correct", "verifier"), ("rm", "sequence")]
