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
import signal
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from ppo_client.config import ConfigError, PPOConfig, reject_unknown_args
from ppo_client.stopping import TrainingStopped, stop_at_once, stop_in_chain
from reward_client import RewardClientError
from settings_cli import EPILOG, HelpFormatter
from settings_cli.exit import exit_now

if TYPE_CHECKING:
    from ppo_client.trainer import PPOTrainer

__all__ = ["build_parser", "main", "run", "train_config"]

#: The last trainer of this process, kept until the process ends (see exit_now): freeing it
#: would tear down torch.distributed's gloo group, whose destructor joins the group's worker
#: threads, and one may wait forever on a peer rank that already exited (seen: a two-rank
#: CPU run that had finished and saved everything hung there for an hour).
_last_trainer: list[object] = []

logger = logging.getLogger("ppo_client.cli")


def build_parser() -> argparse.ArgumentParser:
    """The ``ppo-client`` parser; ``train`` has a flag for every PPOConfig key."""
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
        usage="%(prog)s [--config FILE] [--log-level LEVEL] [--KEY VALUE ...]",
        description="Run PPO. Options come from --config (YAML) and any --key value "
        "overrides (--learning-rate 1e-6, --learning_rate=1e-6); keys are the PPOConfig "
        "fields listed below (see the README). The environment variables REWARD_URL and "
        "REWARD_API_KEY, when set, override the file's reward_url and reward_api_key (flags "
        "override both).",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    train.add_argument("--config", metavar="FILE", help="YAML file of PPOConfig options")
    train.add_argument(
        "--log-level", default=os.environ.get("PPO_CLIENT_LOG_LEVEL", "info"), help="logging level"
    )
    PPOConfig.add_arguments(train.add_argument_group("config keys"))

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
    tls = score.add_mutually_exclusive_group()
    tls.add_argument(
        "--ca-bundle",
        metavar="FILE",
        default=os.environ.get("REWARD_CA_BUNDLE") or None,
        help="CA bundle that signed an https server's certificate (default: $REWARD_CA_BUNDLE, "
        "else the system's CAs)",
    )
    tls.add_argument(
        "--insecure",
        action="store_true",
        help="do not check an https server's certificate (testing only)",
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


def train_config(args: argparse.Namespace, rest: Sequence[str] = ()) -> PPOConfig:
    """The run's config: the --config file, then REWARD_URL / REWARD_API_KEY, then the flags.

    ``rest`` holds the arguments the parser did not take; any is an error.
    """
    reject_unknown_args(rest)
    flags = {key: value for key, value in vars(args).items() if key in PPOConfig.model_fields}
    return PPOConfig.from_sources(args.config, flags)


def _train(args: argparse.Namespace, rest: Sequence[str]) -> int:
    try:
        config = train_config(args, rest)
    except (ConfigError, OSError) as exc:
        print(f"ppo-client train: {exc}", file=sys.stderr)
        return 2
    trainer = None
    try:
        from ppo_client.trainer import PPOTrainer

        trainer = PPOTrainer(config)
        _last_trainer[:] = [trainer]
        trainer.train()
    except ConfigError as exc:
        print(f"ppo-client train: {exc}", file=sys.stderr)
        return 2
    except (RewardClientError, TrainingStopped, KeyboardInterrupt) as exc:
        return _report_stop(exc, trainer)
    except Exception as exc:
        # A signal that lands inside an import can come back wrapped: Python re-raises an
        # exception from a class body's __set_name__ as a RuntimeError with it as the cause
        # (seen with SIGINT during `import torch`). Still a stop, not a crash.
        stopped = stop_in_chain(exc)
        if stopped is None:
            raise
        return _report_stop(stopped, trainer)
    if trainer.accelerator.is_main_process:
        print(f"done: {trainer.state.step} steps, outputs in {config.output_dir}")
    return 0


def _report_stop(exc: BaseException, trainer: PPOTrainer | None) -> int:
    """Say why the run stopped, without a traceback, and give its exit code: the reward
    server failed for good (after retries) or a signal came; the trainer checkpointed its
    last completed update."""
    reason = str(exc) or "interrupted"
    where = f"at step {trainer.state.step}" if trainer is not None else "before the first update"
    print(
        f"ppo-client train: stopped {where}: {reason}; resume with --resume_from_checkpoint latest",
        file=sys.stderr,
    )
    if isinstance(exc, TrainingStopped):
        return exc.exit_code
    return 130 if isinstance(exc, KeyboardInterrupt) else 1


def _score(args: argparse.Namespace) -> int:
    from reward_client import RewardClient, RewardServerError

    urls = [u.strip() for arg in args.reward_url for u in arg.split(",") if u.strip()]
    verify = False if args.insecure else (args.ca_bundle or True)
    try:
        client = RewardClient(
            urls,
            api_key=args.api_key,
            timeout=args.timeout,
            max_retries=args.max_retries,
            verify=verify,
        )
    except ValueError as exc:  # a bad URL or an unreadable CA bundle
        print(f"ppo-client score: {exc}", file=sys.stderr)
        return 2
    with client:
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
    # A masked item (the server could not compute its reward) has the score None and,
    # from a client that reports them, its reason.
    reasons = getattr(result, "masked", None)
    if args.json:
        answer = {"scores": result.scores, "tokens": result.tokens, "truncated": result.truncated}
        if reasons is not None:
            answer["masked"] = reasons
        print(json.dumps(answer))
    else:
        for k, value in enumerate(result.scores):
            if value is None:
                reason = reasons[k] if reasons is not None else None
                print(f"masked ({reason})" if reason else "masked")
            else:
                print(f"{value:.6g}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``ppo-client`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "train":
        # From here on a signal ends the run cleanly, whatever it is doing.
        entered = False
        try:
            with stop_at_once():
                entered = True
                logging.basicConfig(
                    level=args.log_level.upper(),
                    format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                )
                # One line per reward request would drown the progress bar; retries and
                # failures are logged by the reward client itself.
                logging.getLogger("httpx").setLevel(logging.WARNING)
                return _train(args, rest)
        except TrainingStopped as exc:
            if entered:
                raise  # came while the outcome was being reported: run() exits with it
            # A signal a launcher held back while this process started, delivered as the
            # handlers came (stop_at_once unblocks it).
            return _report_stop(exc, None)
    # Started with the signals blocked by a launcher that expected `train`: Ctrl-C must work.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return _score(args)


def run() -> NoReturn:
    """Entry point of the ``ppo-client`` console script (and ``python -m ppo_client``):
    :func:`main`, then :func:`exit_now`."""
    try:
        code = main()
    except TrainingStopped as exc:  # a signal while the outcome was being reported
        code = exc.exit_code
    except KeyboardInterrupt:
        code = 130
    exit_now(code)


if __name__ == "__main__":
    run()
