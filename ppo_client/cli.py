"""``ppo-client``: train with PPO against a reward server, or score texts with one.

    ppo-client train --config ppo.yaml [--key value ...]
    ppo-client score --reward-url URL [--api-key KEY] TEXT [TEXT ...]

Under ``accelerate launch`` run it as a module: ``accelerate launch -m ppo_client train ...``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence

from ppo_client.config import PPOConfig

__all__ = ["main"]

logger = logging.getLogger("ppo_client.cli")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ppo-client",
        description="PPO trainer and client for a remote reward model.",
        allow_abbrev=False,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser(
        "train",
        help="run PPO",
        allow_abbrev=False,
        description="Run PPO. Options come from --config (YAML) and any --key value "
        "overrides; keys are the PPOConfig fields (see the README). The environment "
        "variables REWARD_URL and REWARD_API_KEY, when set, override the file's reward_url "
        "and reward_api_key (flags override both).",
        epilog="config keys: " + ", ".join(PPOConfig.field_names()),
    )
    train.add_argument("--config", help="YAML file of PPOConfig options")
    train.add_argument(
        "--log-level", default=os.environ.get("PPO_CLIENT_LOG_LEVEL", "info"), help="logging level"
    )

    score = sub.add_parser("score", help="score texts with a running reward server")
    score.add_argument(
        "--reward-url",
        action="append",
        required=True,
        help="server base URL (repeat the flag for several servers)",
    )
    score.add_argument(
        "--api-key", default=os.environ.get("REWARD_API_KEY"), help="default: $REWARD_API_KEY"
    )
    score.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    score.add_argument("--max-retries", type=int, default=5, help="retries per request")
    score.add_argument(
        "--query",
        help="score TEXTs as responses to this query (sent as query/response pairs)",
    )
    score.add_argument("--json", action="store_true", help="print the detailed answer as JSON")
    score.add_argument("texts", nargs="+", metavar="TEXT")
    return parser


#: Environment variables that override config keys (compose sets them for the trainer).
ENV_KEYS = {"REWARD_URL": "reward_url", "REWARD_API_KEY": "reward_api_key"}


def env_overrides(environ: Mapping[str, str]) -> list[str]:
    """``--key value`` overrides from the environment; empty variables count as unset.

    They are placed before the command line's overrides, so flags win over the environment,
    which wins over the YAML file.
    """
    return [
        arg
        for var, key in ENV_KEYS.items()
        if environ.get(var)
        for arg in (f"--{key}", environ[var])
    ]


def _train(args: argparse.Namespace, overrides: Sequence[str]) -> int:
    from ppo_client.config import ConfigError

    from_env = env_overrides(os.environ)
    try:
        if args.config:
            config = PPOConfig.from_yaml(args.config, [*from_env, *overrides])
        else:
            config = PPOConfig.from_args([*from_env, *overrides])
    except (ConfigError, OSError) as exc:
        print(f"ppo-client train: {exc}", file=sys.stderr)
        return 2
    from ppo_client.trainer import PPOTrainer

    try:
        trainer = PPOTrainer(config)
    except ConfigError as exc:
        print(f"ppo-client train: {exc}", file=sys.stderr)
        return 2
    from ppo_client.client import RewardClientError

    try:
        trainer.train()
    except RewardClientError as exc:
        # The reward server failed for good (after retries): say so without a traceback.
        print(
            f"ppo-client train: stopped at step {trainer.state.step}: {exc}; resume with "
            "--resume_from_checkpoint latest",
            file=sys.stderr,
        )
        return 1
    if trainer.accelerator.is_main_process:
        print(f"done: {trainer.state.step} steps, outputs in {config.output_dir}")
    return 0


def _score(args: argparse.Namespace) -> int:
    from ppo_client.client import RewardClient, RewardServerError

    urls = [u.strip() for arg in args.reward_url for u in arg.split(",") if u.strip()]
    with RewardClient(
        urls, api_key=args.api_key, timeout=args.timeout, max_retries=args.max_retries
    ) as client:
        try:
            if args.query is not None:
                result = client.score_detailed(
                    queries=[args.query] * len(args.texts), responses=args.texts
                )
            else:
                result = client.score_detailed(texts=args.texts)
        except RewardServerError as exc:
            print(f"ppo-client score: {exc}", file=sys.stderr)
            return 1
    if args.json:
        print(
            json.dumps(
                {"scores": result.scores, "tokens": result.tokens, "truncated": result.truncated}
            )
        )
    else:
        for value in result.scores:
            print(f"{value:.6g}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ppo-client`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "train":
        logging.basicConfig(
            level=args.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        # One line per reward request would drown the progress bar; retries and failures
        # are logged by the reward client itself.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        return _train(args, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return _score(args)


if __name__ == "__main__":
    raise SystemExit(main())
