"""OpenAI graders' throughput (issue 50, acceptance 5): items/s of ``string_check``,
``text_similarity`` (each metric but cosine) and ``python`` graders on 1,000 items, each
through a grader's pool as the server runs it (:class:`~reward_server.verifiers.VerifierPool`
with ``verifier: grader``, started and warmed beforehand, ``await pool.verify(items)`` for
the whole round); the ``python`` grader (in its warm sandboxed interpreter: many items per
interpreter) against one fresh sandboxed interpreter per item (a new
:class:`~reward_server.verifiers.graders.python_sandbox.PythonSandbox` started, grading one
item, closed: what a runner that starts a process per item pays).

Items are seeded sentences and references that share some words. Each figure is the median
over rounds (min and max beside it). ``python -m bench.graders --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common import machine_info, report_part, start_part, summary
from reward_server.verifiers import Task, VerifierOptions, VerifierPool
from reward_server.verifiers.graders.python_sandbox import GraderLimits, PythonSandbox

WORDS = "the cat sat on a mat while dogs ran past quick brown fox jumps over lazy river".split()
OUT, REF = "{{ sample.output_text }}", "{{ item.reference }}"
PYTHON = (
    "from rapidfuzz import fuzz, utils\n\n"
    "def grade(sample, item):\n"
    "    return fuzz.WRatio(sample['output_text'], item['reference'], "
    "processor=utils.default_process) / 100.0\n"
)
METRICS = ("fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_l")


@dataclass
class GraderBenchConfig:
    """What the graders benchmark measures."""

    items: int = 1000
    rounds: int = 3
    fresh_items: int = 100
    seed: int = 0


def graders() -> dict[str, dict[str, Any]]:
    """The graders measured, by label."""
    out: dict[str, dict[str, Any]] = {
        "string_check": {
            "type": "string_check",
            "name": "s",
            "input": OUT,
            "reference": REF,
            "operation": "ilike",
        }
    }
    for metric in METRICS:
        out[f"text_similarity/{metric}"] = {
            "type": "text_similarity",
            "name": "t",
            "input": OUT,
            "reference": REF,
            "evaluation_metric": metric,
        }
    out["python"] = {"type": "python", "name": "p", "source": PYTHON}
    return out


def make_items(count: int, seed: int) -> list[Task]:
    rng = random.Random(seed)
    tasks = []
    for _ in range(count):
        reference = " ".join(rng.choices(WORDS, k=rng.randint(6, 14)))
        words = reference.split()
        response = " ".join(w if rng.random() < 0.7 else rng.choice(WORDS) for w in words)
        tasks.append(Task(prompt=None, response=response, label={"reference": reference}))
    return tasks


def _pool(grader: dict[str, Any]) -> tuple[VerifierPool, float]:
    options = VerifierOptions(
        verifier="grader", workers=1, timeout_s=60.0, grader=grader, grader_limits=GraderLimits()
    )
    pool = VerifierPool(options, "bench")
    began = time.perf_counter()
    pool.start()
    return pool, time.perf_counter() - began


def _fresh(tasks: list[Task]) -> float:
    """Seconds to grade ``tasks`` with one fresh sandboxed interpreter per item."""
    began = time.perf_counter()
    for task in tasks:
        sandbox = PythonSandbox(GraderLimits())
        sandbox.start()
        sandbox.grade(PYTHON, {"output_text": task.response}, task.label)
        sandbox.close()
    return time.perf_counter() - began


def run_grader_bench(cfg: GraderBenchConfig) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for label, grader in graders().items():
        pool, start_s = _pool(grader)
        try:
            asyncio.run(pool.verify(make_items(16, cfg.seed + 99)))  # warm: imports, sandbox
            rates = []
            for r in range(cfg.rounds):
                tasks = make_items(cfg.items, cfg.seed + r)
                began = time.perf_counter()
                verdicts = asyncio.run(pool.verify(tasks))
                rates.append(len(tasks) / (time.perf_counter() - began))
                failed = [v.error for v in verdicts if v.error is not None]
                if failed:
                    raise RuntimeError(f"{label}: {len(failed)} item(s) failed: {failed[:3]}")
        finally:
            pool.close()
        figures[label] = {"items_per_s": summary(rates), "start_s": round(start_s, 2)}
    fresh = [
        cfg.fresh_items / _fresh(make_items(cfg.fresh_items, cfg.seed + r))
        for r in range(cfg.rounds)
    ]
    figures["python, fresh interpreter per item"] = {"items_per_s": summary(fresh)}
    return {"config": asdict(cfg), "machine": machine_info(), "graders": figures}


def render(result: dict[str, Any]) -> str:
    cfg, machine = result["config"], result["machine"]
    lines = [
        f"OpenAI graders, one worker, {cfg['items']} items x {cfg['rounds']} rounds "
        f"(fresh interpreters: {cfg['fresh_items']} items), {machine['cpu']} "
        f"({machine['cores']} cores)",
        "",
        "| grader | items/s (median) | min-max | start (s) |",
        "|---|---:|---:|---:|",
    ]
    for label, fig in result["graders"].items():
        rate = fig["items_per_s"]
        start = fig.get("start_s", "")
        lines.append(
            f"| {label} | {rate['median']:.0f} | {rate['min']:.0f}-{rate['max']:.0f} | {start} |"
        )
    warm = result["graders"]["python"]["items_per_s"]["median"]
    fresh = result["graders"]["python, fresh interpreter per item"]["items_per_s"]["median"]
    lines += [
        "",
        f"The warm sandbox grades {warm / fresh:.0f}x the items of one fresh interpreter per item.",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.graders", description=__doc__.split("\n")[0])
    p.add_argument("--items", type=int, help="items per round (default 1000; --quick: 32)")
    p.add_argument("--rounds", type=int, help="rounds (default 3; --quick: 1)")
    p.add_argument(
        "--fresh-items", type=int, help="items of the fresh-interpreter run (default 100)"
    )
    p.add_argument("--quick", action="store_true", help="a smoke test: 32 items, one round")
    p.add_argument("--json", type=Path, help="also write every figure to this file")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start_part(logging.WARNING)
    cfg = GraderBenchConfig(
        items=args.items or (32 if args.quick else 1000),
        rounds=args.rounds or (1 if args.quick else 3),
        fresh_items=args.fresh_items or (8 if args.quick else 100),
        seed=args.seed,
    )
    result = run_grader_bench(cfg)
    report_part(result, render(result), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
