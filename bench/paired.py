"""Two commits' servers side by side, load by load in turns: throughput and latency as paired
ratios that a machine's drifting speed does not move.

``bench.compare`` runs whole parts of ``bench.run`` on each side one after the other (a
quarter of an hour a side for the throughput part), so on a machine whose other work comes
and goes its ratios say more about the minutes than about the code. Here both servers run at
once (the same MiniLM reward model, the score cache off, one started from a git worktree of
the base commit, the other from this tree) and each round drives one, then the other, with
the same short closed-loop load (:func:`bench.loadgen.run_load`), alternating which goes
first; the ratio this tree / base is taken within each pair of windows, and the median over
rounds is the figure::

    .venv/bin/python -m bench.paired --base b5607a8 --rounds 8 --json out.json

Loads: 16 clients of 8 texts and 16 clients of 1 text (texts/s), and 1 client of 1 text
(the median latency). An idle server costs nothing: the one not being driven waits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import machine_info, model_server_env, start_part
from bench.loadgen import run_load
from bench.models import make_texts, prepare_minilm_reward_model
from reward_server.launcher import running_server

logger = logging.getLogger("bench.paired")

REPO = Path(__file__).resolve().parents[1]
#: (name, clients, texts per request, the figure compared).
LOADS: tuple[tuple[str, int, int, str], ...] = (
    ("16 clients x 8 texts", 16, 8, "texts_per_s"),
    ("16 clients x 1 text", 16, 1, "texts_per_s"),
    ("1 client x 1 text", 1, 1, "p50_ms"),
)


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()


def _window(
    url: str, texts: list[str], tokens: list[int], load: tuple[Any, ...], cfg: Any
) -> float:
    """One window of ``load`` against ``url``: its figure (texts/s, or p50 latency in ms)."""
    _, clients, per_request, figure = load
    result = asyncio.run(
        run_load(
            url,
            texts,
            tokens,
            clients=clients,
            per_request=per_request,
            warmup=cfg.warmup,
            duration=cfg.duration,
        )
    )
    if figure == "p50_ms":
        return float(result["latency_ms"]["p50"])
    return float(result[figure])


def run_paired(cfg: argparse.Namespace) -> dict[str, Any]:
    """Both servers, ``cfg.rounds`` rounds of every load in turns; the pairs and their ratios."""
    model = prepare_minilm_reward_model()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    texts, tokens = make_texts(tokenizer, 256, min_tokens=8, max_tokens=256, seed=0)
    base_commit = _git("rev-parse", "--short", cfg.base)
    this_commit = _git("rev-parse", "--short", "HEAD")
    pairs: dict[str, list[dict[str, float]]] = {load[0]: [] for load in LOADS}
    args = ("--score-cache-size", "0")
    with tempfile.TemporaryDirectory(prefix="bench-paired-") as tmp:
        worktree = Path(tmp) / "base"
        _git("worktree", "add", "--detach", str(worktree), base_commit)
        try:
            env = model_server_env(cfg.threads)
            with contextlib.ExitStack() as stack:
                servers = {
                    side: stack.enter_context(
                        running_server(
                            model, *args, env={**env, "PYTHONPATH": str(tree)}, timeout=180
                        )
                    )
                    for side, tree in (("base", worktree), ("this", REPO))
                }
                for server in servers.values():  # first calls pay for allocations
                    _window(server.url, texts, tokens, LOADS[0], cfg)
                for r in range(cfg.rounds):
                    order = ("base", "this") if r % 2 == 0 else ("this", "base")
                    for load in LOADS:
                        got = {
                            side: _window(servers[side].url, texts, tokens, load, cfg)
                            for side in order
                        }
                        pairs[load[0]].append(got)
                        logger.info("round %d/%d, %s: %s", r + 1, cfg.rounds, load[0], got)
        finally:
            _git("worktree", "remove", "--force", str(worktree))
    rows = paired_rows(pairs)
    return {
        "base": base_commit,
        "this": this_commit,
        "rounds": cfg.rounds,
        "duration_s": cfg.duration,
        "machine": machine_info(),
        "load_average_at_end": os.getloadavg(),
        "pairs": pairs,
        "rows": rows,
    }


def paired_rows(pairs: dict[str, list[dict[str, float]]]) -> list[dict[str, Any]]:
    """Each load's medians per side and the ratio this / base taken within each pair (a
    window in which no request ended, 0 texts/s or no latency, makes no pair)."""
    rows = []
    for name, _, _, figure in LOADS:
        got = pairs[name]
        ratios = [p["this"] / p["base"] for p in got if p["base"] > 0 and p["this"] > 0]
        ratios = ratios or [float("nan")]
        rows.append(
            {
                "load": name,
                "figure": figure,
                "base": statistics.median(p["base"] for p in got),
                "this": statistics.median(p["this"] for p in got),
                "ratio_median": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
                "pairs": len(ratios),
            }
        )
    return rows


def render(result: dict[str, Any]) -> str:
    """The table: each load's medians and the paired ratio this / base."""
    cpu = result["machine"].get("cpu", "this CPU")
    lines = [
        f"Base {result['base']} against this tree {result['this']}: {result['rounds']} rounds "
        f"of {result['duration_s']:g} s windows per load and side, in turns; {cpu}.",
        "",
        "| load | figure | base (median) | this tree (median) | this / base, paired (median; min-max) |",
        "|---|---|---:|---:|---:|",
    ]
    for row in result["rows"]:
        unit = "texts/s" if row["figure"] == "texts_per_s" else "p50 latency (ms)"
        lines.append(
            f"| {row['load']} | {unit} | {row['base']:.1f} | {row['this']:.1f} | "
            f"{row['ratio_median']:.3f} ({row['ratio_min']:.3f}-{row['ratio_max']:.3f}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.paired", description=__doc__.split("\n")[0])
    p.add_argument("--base", required=True, help="the base commit")
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--duration", type=float, default=5.0, help="seconds of each window")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds before each window")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads")
    p.add_argument("--json", type=Path, help="also write every figure to this file")
    cfg = p.parse_args(argv)
    start_part()
    result = run_paired(cfg)
    text = render(result)
    sys.stdout.write(text + "\n")
    if cfg.json is not None:
        cfg.json.write_text(json.dumps(result, indent=2, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
