"""The ``math`` verifier's throughput: a :class:`~reward_server.verifiers.VerifierPool` with 1
and 2 workers against calling math-verify inline (issue 21, acceptance 6).

Items are synthetic maths answers, seeded: a few sentences of working, then a final answer in
``\\boxed{}`` that is right or wrong by half, of mixed kinds (integers, fractions against
decimals, roots, sets, intervals, polynomials, percentages, units). Every label is distinct
within a round and every round has fresh items, so the workers' cache of parsed labels
helps no more than in a run with one label per item.

- **inline**: what a trainer's reward function does in its own process, one item after the
  other: ``verify(parse(label), parse(response))`` with math-verify's defaults (its signal
  alarms, in the main thread);
- **pool, N workers**: ``await pool.verify(items)`` for the whole round, started and warmed
  beforehand (the start time is reported apart).

Rounds alternate the methods so that a drift of the machine's load hits them alike; each
figure is the median over rounds (min and max beside it). The pool's scores are checked
against inline's: they must agree on every item. ``python -m bench.verifiers --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common import machine_info, report_part, start_part, summary
from reward_server.verifiers import Task, VerifierOptions, VerifierPool

logger = logging.getLogger(__name__)

WORDS = "so we add both sides then divide and simplify the result carefully to get".split()


@dataclass
class VerifierBenchConfig:
    """What the verifier benchmark measures."""

    items: int = 400
    rounds: int = 3
    workers: tuple[int, ...] = (1, 2)
    timeout_s: float = 10.0
    seed: int = 0


def _answer(rng: random.Random, i: int) -> tuple[str, str, str]:
    """(label, right answer as written, wrong answer as written) of kind ``i % 8``."""
    a, b = rng.randint(2, 99), rng.randint(2, 99)
    kind = i % 8
    if kind == 0:
        return str(a * 1000 + i), f"{a * 1000 + i:,}", str(a * 1000 + i + 1)
    if kind == 1:
        return f"\\frac{{{i}}}{{{b}}}", str(round(i / b, 12)), f"\\frac{{{i + 1}}}{{{b}}}"
    if kind == 2:
        return str(i / 4), f"\\frac{{{i}}}{{4}}", f"\\frac{{{i}}}{{5}}"
    if kind == 3:
        return f"{a}\\sqrt{{{b}}}", f"\\sqrt{{{a * a * b}}}", f"{a}\\sqrt{{{b + 1}}}"
    if kind == 4:
        return f"\\{{{a},{i}\\}}", f"\\{{{i}, {a}\\}}", f"\\{{{a},{i + 1}\\}}"
    if kind == 5:
        return f"({a}, {a + i}]", f"({a},{a + i}]", f"[{a},{a + i}]"
    if kind == 6:
        return f"x^2+{2 * a}x+{a * a + i}", f"(x+{a})^2+{i}", f"(x+{a})^2+{i + 1}"
    return f"{i}\\%", f"{i / 100}", f"{i + 1}\\%"


def make_items(count: int, seed: int) -> list[Task]:
    """``count`` seeded items, half with the right final answer, labels distinct."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        label, right, wrong = _answer(rng, i + count * seed)
        working = " ".join(rng.choice(WORDS) for _ in range(rng.randint(10, 40)))
        answer = right if rng.random() < 0.5 else wrong
        response = f"{working}: $x = {rng.randint(1, 9)}$, hence the answer is \\boxed{{{answer}}}."
        out.append(Task(prompt=f"Problem {i}", response=response, label=label))
    return out


def inline_scores(items: Sequence[Task]) -> list[float]:
    """math-verify called inline, item after item, with its default settings."""
    from math_verify import parse, verify

    return [float(verify(parse(f"\\boxed{{{t.label}}}"), parse(t.response))) for t in items]


def _timed(fn: Callable[[], list[float]]) -> tuple[float, list[float]]:
    began = time.perf_counter()
    scores = fn()
    return time.perf_counter() - began, scores


def run_verifier_bench(cfg: VerifierBenchConfig) -> dict[str, Any]:
    """Items per second of inline math-verify and of the pool at each worker count."""
    rounds = [make_items(cfg.items, cfg.seed + r + 1) for r in range(cfg.rounds)]
    inline_scores(make_items(16, cfg.seed))  # import and warm math-verify here too
    pools: dict[int, VerifierPool] = {}
    start_s: dict[int, float] = {}
    rates: dict[str, list[float]] = {"inline": [], **{f"pool-{w}": [] for w in cfg.workers}}
    disagreements = 0
    right = 0.0
    try:
        for w in cfg.workers:
            began = time.perf_counter()
            pool = VerifierPool(
                VerifierOptions("math", workers=w, timeout_s=cfg.timeout_s), f"math-{w}"
            )
            pool.start()
            start_s[w] = time.perf_counter() - began
            pools[w] = pool
            asyncio.run(pool.verify(make_items(8 * w, cfg.seed)))  # warm every worker
        for r, items in enumerate(rounds):
            seconds, expected = _timed(lambda items=items: inline_scores(items))
            rates["inline"].append(len(items) / seconds)
            right += sum(expected) / len(expected) / len(rounds)
            for w, pool in pools.items():
                seconds, scores = _timed(lambda p=pool, it=items: _pool_scores(p, it))
                rates[f"pool-{w}"].append(len(items) / seconds)
                disagreements += sum(a != b for a, b in zip(scores, expected, strict=True))
            logger.info("round %d/%d done", r + 1, cfg.rounds)
    finally:
        for pool in pools.values():
            pool.close()
    figures = {name: summary(values) for name, values in rates.items()}
    inline = figures["inline"]["median"]
    return {
        "config": asdict(cfg),
        "machine": machine_info(),
        "items_per_s": figures,
        "speedup_vs_inline": {k: v["median"] / inline for k, v in figures.items()},
        "pool_start_s": {f"pool-{w}": s for w, s in start_s.items()},
        "disagreements": disagreements,
        "right_share": right,
    }


def _pool_scores(pool: VerifierPool, items: Sequence[Task]) -> list[float]:
    verdicts = asyncio.run(pool.verify(items))
    errors = [v.error for v in verdicts if v.error is not None]
    if errors:
        raise RuntimeError(f"{len(errors)} items failed in the pool: {sorted(set(errors))}")
    return [v.score for v in verdicts]


def render(result: dict[str, Any]) -> str:
    """The figures as a Markdown table."""
    cfg, machine = result["config"], result["machine"]
    lines = [
        f"`math` verifier, {cfg['items']} items x {cfg['rounds']} rounds, "
        f"{machine['cpu']} ({machine['cores']} cores)",
        "",
        "| method | items/s (median) | min-max | vs inline | start (s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, fig in result["items_per_s"].items():
        label = (
            "math-verify inline" if name == "inline" else f"pool, {name.split('-')[1]} worker(s)"
        )
        start = result["pool_start_s"].get(name)
        lines.append(
            f"| {label} | {fig['median']:.0f} | {fig['min']:.0f}-{fig['max']:.0f} | "
            f"{result['speedup_vs_inline'][name]:.2f}x | "
            f"{'' if start is None else f'{start:.2f}'} |"
        )
    lines += [
        "",
        f"Pool and inline scores disagree on {result['disagreements']} item(s); "
        f"{result['right_share']:.0%} of the answers are right.",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.verifiers", description=__doc__.split("\n")[0]
    )
    p.add_argument("--items", type=int, help="items per round (default 400; --quick: 64)")
    p.add_argument("--rounds", type=int, help="rounds, methods alternating (default 3; --quick: 1)")
    p.add_argument("--workers", default="1,2", help="pool sizes, comma-separated (default 1,2)")
    p.add_argument("--quick", action="store_true", help="a smoke test: 64 items, one round")
    p.add_argument("--json", type=Path, help="also write every figure to this file")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start_part(logging.WARNING)
    cfg = VerifierBenchConfig(
        items=args.items or (64 if args.quick else 400),
        rounds=args.rounds or (1 if args.quick else 3),
        workers=tuple(int(w) for w in args.workers.split(",") if w.strip()),
        seed=args.seed,
    )
    result = run_verifier_bench(cfg)
    report_part(result, render(result), args.json)
    return 1 if result["disagreements"] else 0


if __name__ == "__main__":
    sys.exit(main())
