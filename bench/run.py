"""``make bench``: throughput/latency (L, S, N) and PPO step time, in one run.

Writes ``bench/results/<date>.json`` and the generated tables of ``BENCHMARKS.md``.
``python -m bench.run --help`` lists the knobs; with no flags it runs the full benchmark on
all-MiniLM-L6-v2 (about 12 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# Nothing is downloaded: the model comes from an installed package, the policy is built here.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

logger = logging.getLogger("bench")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def build_parser() -> argparse.ArgumentParser:
    """Flags of ``python -m bench.run``."""
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    p.add_argument("--model", help="reward model folder (default: MiniLM with a seeded head)")
    p.add_argument("--policy", help="policy folder for the PPO step (default: a tiny GPT-2)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads")
    p.add_argument("--n-texts", type=int, default=256)
    p.add_argument("--min-tokens", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--batch-sizes", type=_ints, default=(1, 4, 8, 16, 32, 64))
    p.add_argument("--clients", type=_ints, default=(1, 4, 16, 64))
    p.add_argument("--per-request", type=_ints, default=(1, 8))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=float, default=1.0, help="seconds before each window")
    p.add_argument("--duration", type=float, default=5.0, help="seconds of each window")
    p.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra reward-server flag (repeatable), e.g. --server-arg=--max-wait-ms=0",
    )
    p.add_argument("--ppo-steps", type=int, default=4, help="measured steps per run")
    p.add_argument("--ppo-rounds", type=int, default=2)
    p.add_argument("--ppo-batch", type=int, default=8, help="rollouts per mini-batch")
    p.add_argument("--ppo-response-length", type=int, default=32)
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--skip-ppo", action="store_true")
    p.add_argument("--results-dir", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--name", help="results file name (default: <date>.json)")
    p.add_argument("--markdown", type=Path, default=REPO / "BENCHMARKS.md")
    p.add_argument("--no-markdown", action="store_true")
    return p


def run(argv: list[str] | None = None) -> tuple[dict[str, Any], Path]:
    """Run the benchmark; return the results and the JSON file written."""
    args = build_parser().parse_args(argv)
    from bench.common import machine_info, versions
    from bench.models import prepare_minilm_reward_model, prepare_tiny_policy
    from bench.report import render, update_markdown

    started = time.perf_counter()
    date = dt.datetime.now().astimezone()
    meta: dict[str, Any] = {
        "date": date.isoformat(timespec="seconds"),
        "command": "make bench" if not argv else "python -m bench.run " + " ".join(argv),
        "machine": machine_info(),
        "versions": versions(),
        "threads": (
            f"torch intra-op threads: {args.threads} in L and the PPO trainer, "
            f"OMP_NUM_THREADS={args.threads} for both servers; load generator: no torch, "
            "OMP_NUM_THREADS=1"
        ),
    }
    model_path = args.model or str(prepare_minilm_reward_model())
    results: dict[str, Any] = {"meta": meta}
    if not args.skip_throughput:
        from bench.throughput import ThroughputConfig, run_throughput

        cfg = ThroughputConfig(
            model_path=model_path,
            n_texts=args.n_texts,
            min_tokens=args.min_tokens,
            max_tokens=args.max_tokens,
            batch_sizes=args.batch_sizes,
            clients=args.clients,
            per_request=args.per_request,
            repeats=args.repeats,
            warmup_s=args.warmup,
            duration_s=args.duration,
            torch_threads=args.threads,
            server_args=tuple(args.server_arg),
        )
        with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
            results["throughput"] = run_throughput(cfg, Path(tmp))
    if not args.skip_ppo:
        from bench.ppo_step import PPOBenchConfig, run_ppo_bench

        policy = args.policy or str(prepare_tiny_policy())
        results["ppo"] = run_ppo_bench(
            PPOBenchConfig(
                reward_model_path=model_path,
                policy_path=policy,
                per_device_train_batch_size=args.ppo_batch,
                rollout_chunk=args.ppo_batch,
                response_length=args.ppo_response_length,
                steps=args.ppo_steps,
                rounds=args.ppo_rounds,
                torch_threads=args.threads,
                server_args=tuple(args.server_arg),
            )
        )
    meta["wall_s"] = time.perf_counter() - started
    meta["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / (args.name or f"{date:%Y-%m-%d}.json")
    text = json.dumps(results, indent=2)
    out.write_text(text + "\n", encoding="utf-8")
    results = json.loads(text)  # what the file holds (tuples as lists)
    if not args.no_markdown:
        update_markdown(args.markdown, render(results))
    return results, out


def main(argv: list[str] | None = None) -> int:
    """CLI entry: run, then print where the results went and which targets hold."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    results, out = run(sys.argv[1:] if argv is None else argv)
    print(f"results: {out}")
    for section in ("throughput", "ppo"):
        for t in results.get(section, {}).get("targets", []):
            med = t["value"]["median"]
            print(
                f"  {'ok  ' if t['holds'] else 'MISS'} {t['name']}: {med:.3f} "
                f"(goal {t['op']} {t['threshold']})"
            )
    print(f"wall time: {results['meta']['wall_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
