"""GSM8K as GRPO prompts with reference answers, for a server with a ``math`` verifier.

    python examples/gsm8k_prompts.py --out runs/gsm8k.jsonl --max-samples 2000

Each line holds ``prompt`` (chat messages: a system message asking for the final answer in
``\\boxed{}``, then the question) and ``answer`` (GSM8K's number after ``####``), the column
``examples/grpo_remote_reward.py --label-column answer`` sends as labels.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."


def answer_of(solution: str) -> str:
    """GSM8K's final answer: the text after ``####``, thousands commas removed."""
    if "####" not in solution:
        raise ValueError(f"no '####' in the solution: {solution[-80:]!r}")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def rows(examples: Iterable[Mapping[str, str]]) -> Iterator[dict[str, Any]]:
    """GSM8K rows (``question``, ``answer``) as prompt + answer rows."""
    for example in examples:
        prompt = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": example["question"]},
        ]
        yield {"prompt": prompt, "answer": answer_of(example["answer"])}


def main(argv: Sequence[str] | None = None) -> Path:
    """Write the prompts file and return its path."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("runs/gsm8k.jsonl"))
    p.add_argument("--split", default="train")
    p.add_argument("--max-samples", type=int, default=None)
    args = p.parse_args(argv)
    from datasets import load_dataset

    data = load_dataset("openai/gsm8k", "main", split=args.split)
    if args.max_samples is not None:
        data = data.select(range(min(args.max_samples, len(data))))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as f:
        for row in rows(data):
            f.write(json.dumps(row) + "\n")
    print(f"{len(data)} prompts written to {args.out}")
    return args.out


if __name__ == "__main__":
    main()
