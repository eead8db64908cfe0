"""A rubric judge on the vLLM engine (``kind: judge``, ``mode: rubric``, issue 51): items per
second of a 10-criterion rubric, vLLM's prefix cache on against off.

Each item is one prompt (about ``prompt_words`` words), one response and a rubric of
``criteria`` criteria; the judge (a random GPT-2, hidden 256, 4 layers, 64-wide heads as
vLLM's CPU kernels need; Yes/No verdicts by logprobs) reads one row per criterion whose
template puts the criterion last, so an item's rows share their head (chat template,
template head, prompt, response). Two ``reward-server --engine vllm`` processes serve the
same judge, one with ``--no-enable-prefix-caching``; rounds alternate between them so that a
drift of the machine's load hits both alike, each round with fresh items (a head vLLM has
seen would come out of its cache) and the score cache off (``cache: false``). Each figure is
the median over rounds; the prompt tokens served from the prefix cache per item come from
``reward_server_model_cached_tokens_total``. ``python -m bench.rubrics --help``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    machine_info,
    metric_sum,
    model_server_env,
    parse_prometheus,
    report_part,
    start_part,
    summary,
)
from reward_server.launcher import ServerProcess, running_server

logger = logging.getLogger(__name__)

WORDS = "the light sky blue air sun scatters waves short long molecules red day why".split()
TEMPLATE = (
    "Question: {{ prompt }}\nAnswer: {{ response }}\nDoes the answer meet this? {{ criterion }}\n"
)
#: A 10-criterion rubric in the RaR style (categories, a pitfall, a required criterion).
RUBRIC: list[dict[str, Any]] = [
    {"text": "Names Rayleigh scattering", "category": "essential", "required": True},
    {"text": "Says blue light has a short wavelength", "category": "essential"},
    {"text": "Says shorter wavelengths scatter more", "category": "important"},
    {"text": "Mentions molecules of the air", "category": "important"},
    {"text": "Explains why sunsets look red", "category": "optional"},
    {"text": "Mentions the sun as the source", "category": "optional"},
    {"text": "Is under two hundred words", "category": "optional"},
    {"text": "Says the sky reflects the ocean", "category": "pitfall"},
    {"text": "Confuses scattering with absorption", "category": "pitfall"},
    {"text": "Is written in plain language", "weight": 0.5},
]
VARIANTS: dict[str, tuple[str, ...]] = {
    "prefix cache on": (),
    "prefix cache off": ("--no-enable-prefix-caching",),
}


@dataclass
class RubricBenchConfig:
    """What the rubric benchmark measures."""

    items: int = 16
    criteria: int = 10
    rounds: int = 3
    prompt_words: int = 150
    response_words: int = 40
    hidden: int = 256
    layers: int = 4
    threads: int = 2
    seed: int = 0
    start_timeout: float = 900.0


def save_judge_model(path: Path, cfg: RubricBenchConfig) -> Path:
    """A random GPT-2 with a chat template, "Yes"/"No" tokens and 64-wide heads."""
    import tiny_models

    tok = tiny_models.chat_tokenizer()
    tok.add_tokens(["Yes", "No"])
    model = tiny_models.gpt2_causal_lm(
        tok,
        seed=cfg.seed,
        n_positions=1024,
        n_embd=cfg.hidden,
        n_layer=cfg.layers,
        n_head=max(1, cfg.hidden // 64),
    )
    return tiny_models.save(path, model, tok)


def make_items(cfg: RubricBenchConfig, seed: int) -> dict[str, Any]:
    """``cfg.items`` seeded prompts and responses, each with the rubric's first
    ``cfg.criteria`` criteria (repeated with a number when more are asked)."""
    rng = random.Random(seed)
    rubric = [
        {**RUBRIC[j % len(RUBRIC)], "text": f"{RUBRIC[j % len(RUBRIC)]['text']} ({j})"}
        for j in range(cfg.criteria)
    ]
    return {
        "queries": [" ".join(rng.choices(WORDS, k=cfg.prompt_words)) for _ in range(cfg.items)],
        "responses": [" ".join(rng.choices(WORDS, k=cfg.response_words)) for _ in range(cfg.items)],
        "labels": [rubric] * cfg.items,
        "cache": False,
    }


@contextlib.contextmanager
def servers(models: Path, cfg: RubricBenchConfig) -> Iterator[dict[str, ServerProcess]]:
    """One vLLM server per variant, started one after the other, all stopped at exit."""
    env = model_server_env(cfg.threads)
    with contextlib.ExitStack() as stack:
        out: dict[str, ServerProcess] = {}
        for name, flags in VARIANTS.items():
            began = time.perf_counter()
            out[name] = stack.enter_context(
                running_server(
                    None,
                    *("--models", str(models), "--engine", "vllm", "--max-wait-ms", "0"),
                    *("--engine-arg", "enforce_eager=true", *flags),
                    env=env,
                    timeout=cfg.start_timeout,
                )
            )
            logger.info("rubrics: %s ready in %.0f s", name, time.perf_counter() - began)
        yield out


def _cached(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return metric_sum(parse_prometheus(text), "reward_server_model_cached_tokens_total")


def run_rubric_bench(cfg: RubricBenchConfig) -> dict[str, Any]:
    """Items per second of the rubric judge on vLLM, prefix cache on and off."""
    import yaml

    rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    cached: dict[str, float] = dict.fromkeys(VARIANTS, 0.0)
    scores: dict[str, list[float]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-rubrics-") as tmp:
        folder = save_judge_model(Path(tmp) / "judge", cfg)
        entry = {
            "name": "rubric",
            "kind": "judge",
            "mode": "rubric",
            "model": str(folder),
            "template": TEMPLATE,
        }
        models = Path(tmp) / "models.yaml"
        models.write_text(yaml.safe_dump({"models": [entry]}), "utf-8")
        with servers(models, cfg) as running, httpx.Client(timeout=900) as client:
            for server in running.values():  # warm: kernels compiled before timing
                client.post(f"{server.url}/score", json=make_items(cfg, -1)).raise_for_status()
            for r in range(cfg.rounds):
                body = make_items(cfg, cfg.seed + r + 1)
                for name, server in running.items():
                    before = _cached(server.url)
                    began = time.perf_counter()
                    answer = client.post(f"{server.url}/score", json=body)
                    took = time.perf_counter() - began
                    answer.raise_for_status()
                    rates[name].append(cfg.items / took)
                    cached[name] += _cached(server.url) - before
                    scores[name] = answer.json()["scores"]
                logger.info("round %d/%d done", r + 1, cfg.rounds)
    figures = {name: summary(values) for name, values in rates.items()}
    on, off = figures["prefix cache on"]["median"], figures["prefix cache off"]["median"]
    same = max(
        abs(a - b)
        for a, b in zip(scores["prefix cache on"], scores["prefix cache off"], strict=True)
    )
    return {
        "config": asdict(cfg),
        "machine": machine_info(),
        "items_per_s": figures,
        "speedup": on / off,
        "cached_tokens_per_item": {n: c / (cfg.items * cfg.rounds) for n, c in cached.items()},
        "max_score_difference": same,
    }


def render(result: dict[str, Any]) -> str:
    """The figures as a Markdown table."""
    cfg, machine = result["config"], result["machine"]
    lines = [
        f"Rubric judge on vLLM: random GPT-2 (hidden {cfg['hidden']}, {cfg['layers']} layers), "
        f"{cfg['criteria']}-criterion rubric, {cfg['items']} items x {cfg['rounds']} rounds "
        f"(prompts of {cfg['prompt_words']} words, responses of {cfg['response_words']}), "
        f"{machine['cpu']} ({machine['cores']} cores)",
        "",
        "| prefix cache | items/s (median) | rows/s | min-max | cached prompt tokens / item |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, fig in result["items_per_s"].items():
        lines.append(
            f"| {name.removeprefix('prefix cache ')} | {fig['median']:.2f} | "
            f"{fig['median'] * cfg['criteria']:.1f} | {fig['min']:.2f}-{fig['max']:.2f} | "
            f"{result['cached_tokens_per_item'][name]:.0f} |"
        )
    lines += [
        "",
        f"Prefix cache on / off: {result['speedup']:.2f}x; the scores of the two differ by "
        f"at most {result['max_score_difference']:.1e}.",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.rubrics", description=__doc__.split("\n")[0])
    p.add_argument("--items", type=int, help="items per round (default 16; --quick: 4)")
    p.add_argument("--criteria", type=int, default=10)
    p.add_argument(
        "--rounds", type=int, help="rounds, variants alternating (default 3; --quick: 1)"
    )
    p.add_argument("--prompt-words", type=int, default=150)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--threads", type=int, default=2, help="torch threads of each server")
    p.add_argument("--quick", action="store_true", help="a smoke test: 4 items, one round")
    p.add_argument("--json", type=Path, help="also write every figure to this file")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start_part(logging.INFO)
    cfg = RubricBenchConfig(
        items=args.items or (4 if args.quick else 16),
        criteria=args.criteria,
        rounds=args.rounds or (1 if args.quick else 3),
        prompt_words=args.prompt_words,
        hidden=args.hidden,
        layers=args.layers,
        threads=args.threads,
        seed=args.seed,
    )
    result = run_rubric_bench(cfg)
    report_part(result, render(result), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
