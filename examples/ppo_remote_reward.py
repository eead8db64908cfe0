"""This project's PPO trainer against a running reward server.

The policy (any causal LM) and the reward model (whatever `reward-server` hosts) keep
their own tokenizers: the trainer sends decoded text, the server re-tokenizes it.

    reward-server --model OpenAssistant/reward-model-deberta-v3-large-v2 --port 8000 &
    python examples/ppo_remote_reward.py --model Qwen/Qwen2.5-0.5B-Instruct \\
        --reward-url http://127.0.0.1:8000 --dataset trl-lib/ultrafeedback-prompt \\
        --output-dir runs/qwen-ppo -- --response_length 128 --total_episodes 20000

Everything after `--` is passed as PPOConfig overrides (`--key value`, TRL's names).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from ppo_client import PPOConfig, PPOTrainer
from reward_client import RewardClient


def main(argv: Sequence[str] | None = None) -> list[dict[str, float]]:
    """Train; return the per-step metrics."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="policy: hub id or folder")
    parser.add_argument(
        "--reward-url", action="append", required=True, help="reward server (repeat for several)"
    )
    parser.add_argument("--api-key", default=None, help="the server's --api-key, if any")
    parser.add_argument(
        "--dataset", required=True, help="hub id or .jsonl/.json/.csv with 'prompt'"
    )
    parser.add_argument("--output-dir", default="runs/ppo-remote-reward")
    parser.add_argument("overrides", nargs="*", help="PPOConfig overrides after --")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    config = PPOConfig.from_args(
        args.overrides,
        base={
            "model_name_or_path": args.model,
            "reward_url": args.reward_url,
            "dataset_name": args.dataset,
            "output_dir": args.output_dir,
            "stop_token": "eos",
            "missing_eos_penalty": 1.0,
        },
    )
    # The client is the reward function: (prompts, responses) -> scores, over HTTP.
    with RewardClient(args.reward_url, api_key=args.api_key) as reward:
        return PPOTrainer(config, reward_fn=reward).train()


if __name__ == "__main__":
    main(sys.argv[1:])
