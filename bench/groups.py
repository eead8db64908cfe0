"""Group rewards (issue 36, acceptance 5): a pairwise judge (``kind: judge``,
``mode: pairwise``) scoring GRPO groups of 8, with ``pairs: all`` (28 pairs, 56 rows per
group) against ``pairs: 2`` (8 pairs, 16 rows), and vLLM's prefix cache on against off.

Three real servers of one random tiny Llama-style judge (64-wide heads, as vLLM's CPU
kernels need; hidden 256 and 4 layers by default), each started once:

- ``transformers``: ``--engine transformers``, two entries (``all``, ``k2``);
- ``vllm``: ``--engine vllm`` (prefix cache on, its default), the same two entries;
- ``vllm-no-prefix``: ``--engine vllm --no-enable-prefix-caching``, the ``all`` entry.

Each round builds fresh groups (a question of about ``question_words`` words shared by the
group's 8 responses of 10 to 40 words; nothing repeats an earlier round) and sends them as
one ``/score`` request with ``groups`` to each (server, entry), in turns, so that a drift of
the machine's load hits them alike. The score cache is off (the workload's rows never
repeat anyway). Figures per (server, entry): items/s and rows/s (median, min and max over
rounds), the tokens of the rows of a round, and on vLLM the share of them read from the
prefix cache (``reward_server_model_cached_tokens_total``). Run it with
``python -m bench.run --only groups`` (its own block of ``BENCHMARKS.md``) or
``python -m bench.groups``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
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

logger = logging.getLogger(__name__)

WORDS = (
    "the answer is right because we add both sides then divide and simplify it so that "
    "each term cancels and what remains is the value we wanted from the start of the proof"
).split()
TEMPLATE = (
    "Question: {{ prompt }}\nA: {{ response_a }}\nB: {{ response_b }}\n"
    "Which answer is better? Reply A or B.\n"
)
#: Each server's flags, and the entries it serves.
SERVERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "transformers": (("--engine", "transformers"), ("all", "k2")),
    "vllm": (("--engine", "vllm", "--engine-arg", "enforce_eager=true"), ("all", "k2")),
    "vllm-no-prefix": (
        ("--engine", "vllm", "--engine-arg", "enforce_eager=true", "--no-enable-prefix-caching"),
        ("all",),
    ),
}
PAIRS = {"all": "all", "k2": 2}


@dataclass
class GroupsBenchConfig:
    """What the groups benchmark measures."""

    groups: int = 8
    group_size: int = 8
    rounds: int = 3
    question_words: int = 60
    hidden: int = 256
    layers: int = 4
    servers: tuple[str, ...] = tuple(SERVERS)
    threads: int = os.cpu_count() or 1
    start_timeout: float = 900.0
    seed: int = 0


def save_judge_model(path: Path, cfg: GroupsBenchConfig) -> Path:
    """A random tiny Llama causal LM with 64-wide heads, a chat template with a generation
    prompt, and "A" and "B" as single tokens."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    import tiny_models

    tok = tiny_models.byte_bpe_tokenizer(
        eos="</s>",
        bos="<s>",
        extra_special=tiny_models.CHAT_SPECIAL_TOKENS,
        chat_template=tiny_models.POLICY_CHAT_TEMPLATE,
    )
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=cfg.hidden, intermediate_size=2 * cfg.hidden,
        num_hidden_layers=cfg.layers, num_attention_heads=cfg.hidden // 64,
        num_key_value_heads=max(1, cfg.hidden // 128), max_position_embeddings=2048,
        tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
    )  # fmt: skip
    torch.manual_seed(cfg.seed)
    return tiny_models.save(path, AutoModelForCausalLM.from_config(config), tok)


def make_groups(cfg: GroupsBenchConfig, seed: int) -> dict[str, Any]:
    """``cfg.groups`` groups of ``cfg.group_size`` responses, each group its own question."""
    rng = random.Random(seed)
    queries: list[str] = []
    responses: list[str] = []
    groups: list[list[int]] = []
    for _ in range(cfg.groups):
        question = " ".join(rng.choices(WORDS, k=cfg.question_words)) + "?"
        groups.append(list(range(len(queries), len(queries) + cfg.group_size)))
        for _ in range(cfg.group_size):
            queries.append(question)
            responses.append(" ".join(rng.choices(WORDS, k=rng.randint(10, 40))))
    return {"queries": queries, "responses": responses, "groups": groups}


def _models_file(folder: Path, entries: tuple[str, ...], path: Path) -> Path:
    import yaml

    models = [
        {
            "name": name,
            "kind": "judge",
            "model": str(folder),
            "mode": "pairwise",
            "template": TEMPLATE,
            "answer_tokens": ["A", "B"],
            "pairs": PAIRS[name],
            "pairwise_aggregate": "win_rate",
        }
        for name in entries
    ]
    path.write_text(yaml.safe_dump({"models": models}), encoding="utf-8")
    return path


@contextlib.contextmanager
def _servers(cfg: GroupsBenchConfig, folder: Path, tmp: Path) -> Iterator[dict[str, Any]]:
    """Every server of ``cfg.servers``, started one after the other, stopped at exit."""
    from reward_server.launcher import running_server

    env = model_server_env(cfg.threads)
    with contextlib.ExitStack() as stack:
        started: dict[str, Any] = {}
        for name in cfg.servers:
            flags, entries = SERVERS[name]
            own = dict(env)
            if name.startswith("vllm"):
                own["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
                own.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
            path = _models_file(folder, entries, tmp / f"{name}.yaml")
            began = time.perf_counter()
            started[name] = stack.enter_context(
                running_server(
                    None, "--models", str(path), *flags, "--max-wait-ms", "1", env=own,
                    timeout=cfg.start_timeout,
                )
            )  # fmt: skip
            logger.info("groups: %s ready in %.0f s", name, time.perf_counter() - began)
        yield started


def _cached(url: str, model: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return metric_sum(
        parse_prometheus(text), "reward_server_model_cached_tokens_total", model=model
    )


def _measure(url: str, model: str, body: dict[str, Any]) -> dict[str, float]:
    """One request of the round to one entry: seconds, tokens of its rows, cached tokens."""
    before = _cached(url, model)
    began = time.perf_counter()
    r = httpx.post(f"{url}/score", json={**body, "model": model}, timeout=3600)
    seconds = time.perf_counter() - began
    if r.status_code != 200:
        raise RuntimeError(f"/score of {model} answered {r.status_code}: {r.text[:500]}")
    tokens = float(sum(r.json()["tokens"]))
    return {"seconds": seconds, "tokens": tokens, "cached": _cached(url, model) - before}


def _rows_per_group(cfg: GroupsBenchConfig, entry: str) -> int:
    from reward_server.scoring.pairwise import unordered_pairs

    return 2 * len(unordered_pairs(list(range(cfg.group_size)), PAIRS[entry]))  # type: ignore[arg-type]


def run_groups_bench(cfg: GroupsBenchConfig) -> dict[str, Any]:
    """Items/s, rows/s and the prefix cache's share of each (server, entry)."""
    runs: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-groups-") as tmp:
        folder = save_judge_model(Path(tmp) / "judge", cfg)
        with _servers(cfg, folder, Path(tmp)) as servers:
            keys = [(s, e) for s in servers for e in SERVERS[s][1]]
            warm = make_groups(GroupsBenchConfig(groups=1, group_size=cfg.group_size), -1)
            for server, entry in keys:
                _measure(servers[server].url, entry, warm)
            for r in range(cfg.rounds):
                body = make_groups(cfg, cfg.seed + r)
                turn = keys[r % len(keys) :] + keys[: r % len(keys)]
                for server, entry in turn:
                    got = _measure(servers[server].url, entry, body)
                    runs.setdefault(f"{server}/{entry}", []).append(got)
                logger.info("groups: round %d/%d done", r + 1, cfg.rounds)
    items = cfg.groups * cfg.group_size
    figures: dict[str, Any] = {}
    for key, measured in runs.items():
        rows = _rows_per_group(cfg, key.split("/")[1]) * cfg.groups
        figures[key] = {
            "rows_per_round": rows,
            "items_per_s": summary(items / m["seconds"] for m in measured),
            "rows_per_s": summary(rows / m["seconds"] for m in measured),
            "tokens_per_round": summary(m["tokens"] for m in measured)["median"],
            "cached_share": summary(m["cached"] / m["tokens"] for m in measured)["median"],
        }
    return {"config": asdict(cfg), "machine": machine_info(), "figures": figures}


def render(result: dict[str, Any]) -> str:
    """The figures as a Markdown table."""
    cfg, machine = result["config"], result["machine"]
    lines = [
        f"Pairwise judge: random Llama (hidden {cfg['hidden']}, {cfg['layers']} layers, "
        f"64-wide heads) on CPU, {cfg['groups']} groups of {cfg['group_size']} per request "
        f"(a {cfg['question_words']}-word question each, responses of 10-40 words), "
        f"{cfg['rounds']} rounds, aggregate win_rate, score cache off, {machine['cpu']} "
        f"({machine['cores']} cores)",
        "",
        "| server | pairs | rows/round | items/s (median) | min-max | rows/s | tokens/round "
        "| prefix-cached |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for key, fig in result["figures"].items():
        server, entry = key.split("/")
        items, rows = fig["items_per_s"], fig["rows_per_s"]
        cached = "-" if server == "transformers" else f"{100 * fig['cached_share']:.0f} %"
        lines.append(
            f"| {server} | {PAIRS[entry]} | {fig['rows_per_round']} | {items['median']:.1f} | "
            f"{items['min']:.1f}-{items['max']:.1f} | {rows['median']:.0f} | "
            f"{fig['tokens_per_round']:.0f} | {cached} |"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.groups", description=__doc__.split("\n")[0])
    p.add_argument("--groups", type=int, default=8, help="groups of 8 per request")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--question-words", type=int, default=60)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--servers", default=",".join(SERVERS), help="of " + ", ".join(SERVERS))
    p.add_argument("--json", type=Path, help="also write every figure to this file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start_part(logging.INFO)
    cfg = GroupsBenchConfig(
        groups=args.groups,
        rounds=args.rounds,
        question_words=args.question_words,
        hidden=args.hidden,
        layers=args.layers,
        servers=tuple(s for s in args.servers.split(",") if s.strip()),
    )
    result = run_groups_bench(cfg)
    report_part(result, render(result), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
