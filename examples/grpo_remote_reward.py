"""Train with TRL's GRPOTrainer, scoring completions with a running reward server.

Start a server, then train against it::

    reward-server --model OpenAssistant/reward-model-deberta-v3-large-v2 --port 8000
    python examples/grpo_remote_reward.py --reward-url http://127.0.0.1:8000 \\
        --model Qwen/Qwen2.5-0.5B-Instruct --dataset trl-lib/tldr

The policy and the reward model never share a tokenizer: ``RemoteReward`` sends text
(``queries``/``responses``, or ``conversations`` when the dataset's ``prompt`` column holds
chat messages) and the server tokenizes with the reward model's own tokenizer and template.
``--dataset`` is a hub dataset id or a local ``.jsonl``/``.json``/``.csv`` file with a
``prompt`` column. Pass ``--reward-url`` several times to spread requests over servers.
``--label-column answer`` sends each prompt's reference answer with its completions, for a
server with verifiers (``examples/math_verifier_models.yaml``; prompts and answers from
GSM8K: ``examples/gsm8k_prompts.py``).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset, load_dataset
from trl import GRPOConfig, GRPOTrainer

from reward_client.integrations.trl import RemoteReward

logger = logging.getLogger("grpo_remote_reward")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options; the defaults train a small instruct model on TL;DR prompts."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--reward-url",
        action="append",
        required=True,
        help="Base URL of a reward server; repeat the flag for several servers.",
    )
    p.add_argument(
        "--reward-api-key",
        default=os.environ.get("REWARD_API_KEY"),
        help="Bearer key of the reward server (default: $REWARD_API_KEY).",
    )
    p.add_argument(
        "--model", default="Qwen/Qwen2.5-0.5B-Instruct", help="Policy: hub id or folder."
    )
    p.add_argument("--dataset", default="trl-lib/tldr", help="Hub id or .jsonl/.json/.csv file.")
    p.add_argument("--dataset-split", default="train")
    p.add_argument(
        "--label-column",
        default=None,
        help="Column sent with each prompt's completions as their label (a reference answer, "
        "for the server's verifiers).",
    )
    p.add_argument("--max-samples", type=int, default=None, help="Use the first N prompts only.")
    p.add_argument("--output-dir", default="runs/grpo-remote-reward")
    p.add_argument("--max-steps", type=int, default=100)
    p.add_argument("--learning-rate", type=float, default=1e-6)
    p.add_argument("--per-device-train-batch-size", type=int, default=8)
    p.add_argument("--gradient-accumulation-steps", type=int, default=1)
    p.add_argument("--num-generations", type=int, default=8)
    p.add_argument("--max-completion-length", type=int, default=64)
    p.add_argument("--logging-steps", type=int, default=1)
    p.add_argument("--save-steps", type=int, default=0, help="0: save only at the end.")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--use-cpu", action="store_true", help="Train on CPU even if a GPU is present.")
    p.add_argument("--report-to", default="none", help="none, tensorboard, wandb, trackio, ...")
    return p.parse_args(argv)


def load_prompts(name: str, split: str, max_samples: int | None) -> Dataset:
    """A dataset with a ``prompt`` column from the hub or a local file."""
    path = Path(name)
    if path.is_file():
        kind = {".jsonl": "json", ".json": "json", ".csv": "csv"}.get(path.suffix)
        if kind is None:
            raise SystemExit(f"unsupported dataset file {path}: use .jsonl, .json or .csv")
        dataset = load_dataset(kind, data_files=str(path), split="train")
    else:
        dataset = load_dataset(name, split=split)
    if "prompt" not in dataset.column_names:
        raise SystemExit(f"dataset {name} has no 'prompt' column: {dataset.column_names}")
    if max_samples is not None:
        dataset = dataset.select(range(min(max_samples, len(dataset))))
    return dataset


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Train and return TRL's log history (one entry per logging step, then a summary)."""
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    dataset = load_prompts(args.dataset, args.dataset_split, args.max_samples)
    reward = RemoteReward(args.reward_url, api_key=args.reward_api_key, label_key=args.label_column)
    on_gpu = torch.cuda.is_available() and not args.use_cpu
    config = GRPOConfig(
        output_dir=args.output_dir,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        per_device_train_batch_size=args.per_device_train_batch_size,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        logging_steps=args.logging_steps,
        save_strategy="steps" if args.save_steps else "no",
        save_steps=args.save_steps or 500,
        seed=args.seed,
        use_cpu=not on_gpu,
        bf16=on_gpu and torch.cuda.is_bf16_supported(),
        report_to=args.report_to,
    )
    trainer = GRPOTrainer(
        model=args.model, reward_funcs=[reward], args=config, train_dataset=dataset
    )
    trainer.train()
    trainer.save_model(args.output_dir)
    last = [h for h in trainer.state.log_history if f"rewards/{reward.__name__}/mean" in h]
    if last:
        print(f"final reward mean: {last[-1][f'rewards/{reward.__name__}/mean']:.4f}")
    print(f"model saved to {args.output_dir}")
    return list(trainer.state.log_history)


if __name__ == "__main__":
    main()
