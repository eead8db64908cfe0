"""The score cache under a GRPO-shaped load (issue 23, acceptance 2): throughput of one real
server with the cache against the same server with ``"cache": false`` on every request.

The load: groups of completions per prompt, one ``/score`` request per group (queries and
responses), a few requests in flight at once (closed loop). A quarter of each group's
completions repeat another completion of the same group (short maths answers, a policy
that has converged on a prompt); every group has a fresh prompt and fresh completions, so
nothing is answered from an earlier round: the gain is the duplicates', scored once.

Each round builds one workload and sends it twice, once with the cache and once without
(``"cache": false``: every item scored, nothing read or kept), alternating which goes
first, so a drift of the machine's load hits both alike. Figures: items/s per mode, the
ratio per round (median, min and max over rounds), the rows the model ran (from the
server's /metrics), and the scores: the largest difference between the two modes on the
same items (batch composition differs: the float32 batch invariance of the model, not the
cache), and whether a repeated request answered from the cache equals its first answer bit
for bit. ``python -m bench.score_cache --help``; ``python -m bench.run --only cache``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import struct
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    machine_info,
    parse_prometheus,
    report_part,
    served_model,
    server_env,
    start_part,
    summary,
)

logger = logging.getLogger(__name__)

#: The acceptance target: items/s with the cache over items/s without, at 25 % duplicates.
TARGET = 1.25
ROWS = "reward_server_batch_rows_sum"


@dataclass
class CacheBenchConfig:
    """What the score-cache benchmark measures."""

    model_path: str = ""
    groups: int = 32  # groups (one prompt each) per round
    group_size: int = 8  # completions per prompt
    duplicate_share: float = 0.25  # completions that repeat another of their group
    prompt_tokens: tuple[int, int] = (24, 64)
    completion_tokens: tuple[int, int] = (16, 160)
    clients: int = 4  # requests in flight at once
    rounds: int = 5
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    seed: int = 0
    server_args: tuple[str, ...] = ()


def make_groups(tokenizer: Any, cfg: CacheBenchConfig, seed: int) -> list[dict[str, list[str]]]:
    """``cfg.groups`` request bodies of ``cfg.group_size`` (query, response) pairs each, a
    ``duplicate_share`` of each group's responses copies of others in it (seeded)."""
    from bench.models import make_texts

    rng = random.Random(seed)
    n_dup = round(cfg.group_size * cfg.duplicate_share)
    n_own = cfg.group_size - n_dup
    lo, hi = cfg.prompt_tokens
    prompts, _ = make_texts(tokenizer, cfg.groups, min_tokens=lo, max_tokens=hi, seed=seed)
    lo, hi = cfg.completion_tokens
    own, _ = make_texts(
        tokenizer, cfg.groups * n_own, min_tokens=lo, max_tokens=hi, seed=seed + 500_000
    )
    groups = []
    for g, prompt in enumerate(prompts):
        responses = own[g * n_own : (g + 1) * n_own]
        responses = responses + [rng.choice(responses) for _ in range(n_dup)]
        rng.shuffle(responses)
        groups.append({"queries": [prompt] * cfg.group_size, "responses": responses})
    return groups


async def _send_all(
    url: str, groups: list[dict[str, list[str]]], clients: int, extra: dict[str, Any]
) -> tuple[float, list[list[float]]]:
    """Send every group (``clients`` in flight), return the wall time and each answer's
    scores in group order; RuntimeError on any answer but 200."""
    answers: list[list[float]] = [[] for _ in groups]
    todo = list(range(len(groups)))
    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=clients + 2)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as client:

        async def worker() -> None:
            while todo:
                i = todo.pop(0)
                r = await client.post("/score", json={**groups[i], **extra})
                if r.status_code != 200:
                    raise RuntimeError(f"/score answered {r.status_code}: {r.text}")
                answers[i] = r.json()["scores"]

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        return time.perf_counter() - began, answers


def _rows(url: str) -> float:
    """Rows the server's model has run so far."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return parse_prometheus(text).get(ROWS, 0.0)


def run_cache_bench(cfg: CacheBenchConfig) -> dict[str, Any]:
    """Items/s with and without the score cache on one real server, round by round."""
    from transformers import AutoTokenizer

    from reward_server.launcher import running_server

    tokenizer = AutoTokenizer.from_pretrained(cfg.model_path)
    env = server_env(cfg.threads)
    modes = {"cache": {}, "no cache": {"cache": False}}
    rates: dict[str, list[float]] = {m: [] for m in modes}
    rows: dict[str, float] = dict.fromkeys(modes, 0.0)
    ratios: list[float] = []
    max_diff = 0.0
    items = cfg.groups * cfg.group_size
    with running_server(cfg.model_path, *cfg.server_args, env=env, timeout=180) as server:
        url = server.url
        # A warm-up round of its own (cache off: nothing kept), not measured: the first
        # passes of a server are slower (torch's first calls) and its batcher cuts windows
        # only once its cost model has seen enough passes, which would tilt the first
        # round against whichever mode goes first.
        warm = make_groups(tokenizer, cfg, cfg.seed + 10_000)
        asyncio.run(_send_all(url, warm, cfg.clients, {"cache": False}))
        for r in range(cfg.rounds):
            groups = make_groups(tokenizer, cfg, cfg.seed + r)
            order = list(modes) if r % 2 == 0 else list(reversed(modes))
            scores: dict[str, list[list[float]]] = {}
            for mode in order:
                before = _rows(url)
                wall, scores[mode] = asyncio.run(_send_all(url, groups, cfg.clients, modes[mode]))
                rows[mode] += _rows(url) - before
                rates[mode].append(items / wall)
            ratios.append(rates["cache"][-1] / rates["no cache"][-1])
            for a, b in zip(scores["cache"], scores["no cache"], strict=True):
                max_diff = max(max_diff, *(abs(x - y) for x, y in zip(a, b, strict=True)))
            logger.info("round %d/%d: %.2fx", r + 1, cfg.rounds, ratios[-1])
        # The last round's groups again, with the cache: every item a hit, answered as first.
        _, again = asyncio.run(_send_all(url, groups, cfg.clients, {}))
    identical = all(
        [struct.pack("<d", x) for x in a] == [struct.pack("<d", y) for y in b]
        for a, b in zip(again, scores["cache"], strict=True)
    )
    ratio = summary(ratios)
    return {
        "config": asdict(cfg),
        "machine": machine_info(),
        "items_per_round": items,
        "items_per_s": {m: summary(v) for m, v in rates.items()},
        "ratio": ratio,
        "rows_per_item": {m: rows[m] / (items * cfg.rounds) for m in modes},
        "max_abs_diff_vs_no_cache": max_diff,
        "repeat_identical": identical,
        "targets": [
            {
                "name": "GRPO, 25 % duplicates: items/s with the cache / without",
                "value": ratio,
                "op": ">=",
                "threshold": TARGET,
                "holds": bool(ratio["median"] >= TARGET),
            }
        ],
    }


def render(result: dict[str, Any]) -> str:
    """The figures as Markdown."""
    cfg, machine = result["config"], result["machine"]
    lo, hi = cfg["completion_tokens"]
    plo, phi = cfg["prompt_tokens"]
    lines = [
        f"One server, MiniLM on CPU; {cfg['rounds']} rounds of {cfg['groups']} groups x "
        f"{cfg['group_size']} completions ({cfg['duplicate_share']:.0%} of each group repeat "
        f"another of it; prompts {plo}-{phi} tokens, completions {lo}-{hi}), one request per "
        f"group, {cfg['clients']} in flight; {machine['cpu']} ({machine['cores']} cores), "
        f"the server's model on {cfg['threads']} torch thread(s).",
        "",
        "| mode | items/s (median) | min-max | rows run per item |",
        "|---|---:|---:|---:|",
    ]
    for mode, fig in result["items_per_s"].items():
        lines.append(
            f"| {mode} | {fig['median']:.1f} | {fig['min']:.1f}-{fig['max']:.1f} | "
            f"{result['rows_per_item'][mode]:.2f} |"
        )
    ratio = result["ratio"]
    target = result["targets"][0]
    lines += [
        "",
        f"With / without the cache, per round: **{ratio['median']:.2f}x** (median; "
        f"{ratio['min']:.2f}-{ratio['max']:.2f}); goal >= {target['threshold']}: "
        f"{'holds' if target['holds'] else '**missed**'}. Scores: a repeated request answered "
        f"from the cache equals its first answer bit for bit: "
        f"{'yes' if result['repeat_identical'] else '**no**'}; largest difference between "
        f"the two modes on the same items {result['max_abs_diff_vs_no_cache']:.1e} (the "
        "model's float32 batch invariance: deduplicated requests run other batches).",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.score_cache", description=__doc__.split("\n")[0]
    )
    p.add_argument("--model", help="reward model folder (default: MiniLM with a seeded head)")
    p.add_argument("--groups", type=int, default=32)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", type=Path, help="also write every figure to this file")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start_part()
    cfg = CacheBenchConfig(
        model_path=served_model(args.model),
        groups=args.groups,
        group_size=args.group_size,
        rounds=args.rounds,
        clients=args.clients,
        threads=args.threads,
        seed=args.seed,
    )
    result = run_cache_bench(cfg)
    report_part(result, render(result), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
