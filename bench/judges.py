"""A judge's throughput (``kind: judge``, issue 21, part 6): items per second of one small
causal LM served as a judge in ``mode: logprobs`` and in ``mode: generate`` with
``max_new_tokens`` 8 and 32, on CPU, through the served path (the app in process: the
models file, the micro-batcher on the compute thread, the HTTP layer by a TestClient).

The judge is a random tiny GPT-2 (hidden 256, 4 layers by default; its vocabulary holds the
score tokens "Yes" and "No"). Random weights rarely end an answer early, so a generate pass
runs its full ``max_new_tokens``: the figures are the cost of answers of that length. Items
are seeded question/answer pairs of mixed lengths, a fresh set each round, sent as one
request per round (the micro-batcher cuts it into passes of ``max_batch_size`` rows).

Rounds alternate the modes so that a drift of the machine's load hits them alike; each
figure is the median over rounds (min and max beside it). ``python -m bench.judges --help``.
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common import machine_info, report_part, start_part, summary

logger = logging.getLogger(__name__)

WORDS = "the answer is right because we add both sides then divide and simplify it".split()
TEMPLATE = (
    "Question: {{ prompt }}\nAnswer: {{ response }}\nIs the answer correct? Reply Yes or No.\n"
)


@dataclass
class JudgeBenchConfig:
    """What the judge benchmark measures."""

    items: int = 128
    rounds: int = 3
    hidden: int = 256
    layers: int = 4
    max_new_tokens: tuple[int, ...] = (8, 32)
    max_batch_size: int = 32
    threads: int | None = None
    seed: int = 0


def save_judge_model(path: Path, cfg: JudgeBenchConfig) -> Path:
    """A random tiny GPT-2 with a chat template and "Yes"/"No" tokens, saved in ``path``."""
    import tiny_models

    tok = tiny_models.chat_tokenizer()
    tok.add_tokens(["Yes", "No"])
    heads = max(1, cfg.hidden // 64)
    model = tiny_models.gpt2_causal_lm(
        tok, seed=cfg.seed, n_positions=512, n_embd=cfg.hidden, n_layer=cfg.layers, n_head=heads
    )
    return tiny_models.save(path, model, tok)


def make_items(count: int, seed: int) -> dict[str, list[str]]:
    """``count`` seeded question/answer pairs of 5 to 60 words."""
    rng = random.Random(seed)
    queries = [f"What is {rng.randint(1, 99)} + {rng.randint(1, 99)}?" for _ in range(count)]
    responses = [" ".join(rng.choices(WORDS, k=rng.randint(5, 60))) for _ in range(count)]
    return {"queries": queries, "responses": responses}


def _entry(folder: Path, mode: str) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": "judge", "kind": "judge", "model": str(folder)}
    entry["template"] = TEMPLATE
    if mode == "logprobs":
        return {**entry, "score_tokens": {"Yes": 1.0, "No": 0.0}}
    return {
        **entry,
        "mode": "generate",
        "score_pattern": r"(Yes|No)",
        "max_new_tokens": int(mode.split("-")[1]),
    }


def run_judge_bench(cfg: JudgeBenchConfig) -> dict[str, Any]:
    """Items per second of the judge in each mode, served in process."""
    import torch
    import yaml
    from fastapi.testclient import TestClient

    from reward_server.config import ServerSettings
    from reward_server.http.app import create_app

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    modes = ["logprobs", *(f"generate-{n}" for n in cfg.max_new_tokens)]
    rates: dict[str, list[float]] = {m: [] for m in modes}
    start_s: dict[str, float] = {}
    parsed: dict[str, int] = dict.fromkeys(modes, 0)
    with tempfile.TemporaryDirectory(prefix="bench-judges-") as tmp:
        folder = save_judge_model(Path(tmp) / "judge", cfg)
        clients: dict[str, TestClient] = {}
        try:
            for mode in modes:
                path = Path(tmp) / f"{mode}.yaml"
                path.write_text(yaml.safe_dump({"models": [_entry(folder, mode)]}), "utf-8")
                settings = ServerSettings(
                    models=str(path), max_wait_ms=1.0, max_batch_size=cfg.max_batch_size
                )
                began = time.perf_counter()
                client = TestClient(create_app(settings)).__enter__()
                start_s[mode] = time.perf_counter() - began
                clients[mode] = client
                _score(client, make_items(4, cfg.seed))  # warm
            for r in range(cfg.rounds):
                body = make_items(cfg.items, cfg.seed + r + 1)
                for mode, client in clients.items():
                    began = time.perf_counter()
                    data = _score(client, body)
                    rates[mode].append(cfg.items / (time.perf_counter() - began))
                    errors = (data.get("verifier_errors") or {}).get("judge") or []
                    parsed[mode] += cfg.items - sum(e is not None for e in errors)
                logger.info("round %d/%d done", r + 1, cfg.rounds)
        finally:
            for client in clients.values():
                client.__exit__(None, None, None)
    figures = {mode: summary(values) for mode, values in rates.items()}
    base = figures["logprobs"]["median"]
    return {
        "config": asdict(cfg),
        "machine": machine_info(),
        "items_per_s": figures,
        "vs_logprobs": {m: fig["median"] / base for m, fig in figures.items()},
        "start_s": start_s,
        "parsed_share": {m: n / (cfg.items * cfg.rounds) for m, n in parsed.items()},
    }


def _score(client: Any, body: dict[str, list[str]]) -> dict[str, Any]:
    r = client.post("/score", json=body)
    if r.status_code != 200:
        raise RuntimeError(f"/score answered {r.status_code}: {r.text}")
    return dict(r.json())


def render(result: dict[str, Any]) -> str:
    """The figures as a Markdown table."""
    cfg, machine = result["config"], result["machine"]
    lines = [
        f"Judge: random GPT-2 (hidden {cfg['hidden']}, {cfg['layers']} layers) on CPU, "
        f"{cfg['items']} question/answer items x {cfg['rounds']} rounds, batches of up to "
        f"{cfg['max_batch_size']}, {machine['cpu']} ({machine['cores']} cores)",
        "",
        "| mode | items/s (median) | min-max | vs logprobs | start (s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for mode, fig in result["items_per_s"].items():
        label = mode if mode == "logprobs" else f"generate, max_new_tokens {mode.split('-')[1]}"
        lines.append(
            f"| {label} | {fig['median']:.1f} | {fig['min']:.1f}-{fig['max']:.1f} | "
            f"{result['vs_logprobs'][mode]:.2f}x | {result['start_s'][mode]:.2f} |"
        )
    lines += [
        "",
        "Random weights: a generate pass runs its full max_new_tokens (no early end of text).",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.judges", description=__doc__.split("\n")[0])
    p.add_argument("--items", type=int, help="items per round (default 128; --quick: 8)")
    p.add_argument("--rounds", type=int, help="rounds, modes alternating (default 3; --quick: 1)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--max-new-tokens", default="8,32", help="generate lengths (default 8,32)")
    p.add_argument("--quick", action="store_true", help="a smoke test: 8 items, one round")
    p.add_argument("--json", type=Path, help="also write every figure to this file")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start_part(logging.WARNING)
    cfg = JudgeBenchConfig(
        items=args.items or (8 if args.quick else 128),
        rounds=args.rounds or (1 if args.quick else 3),
        hidden=args.hidden,
        layers=args.layers,
        max_new_tokens=tuple(int(n) for n in args.max_new_tokens.split(",") if n.strip()),
        seed=args.seed,
    )
    result = run_judge_bench(cfg)
    report_part(result, render(result), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
