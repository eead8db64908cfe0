"""The engines side by side: ``reward-server --engine transformers`` against ``--engine vllm``.

The same Llama-style reward model (random weights, built by :mod:`bench.models`), the same
texts, the same server flags but the engine, through :class:`~reward_client.RewardClient`:

- **GRPO**: groups of completions sharing a long prompt, sent as a GRPO trainer sends them
  (one call for the whole batch by default, or one call per group);
- **distinct**: texts of the plain mix (8-256 tokens), one call.

Each dtype (float32, bfloat16) gets its own servers: the transformers engine, vLLM with its
prefix cache (its default) and vLLM without it, all running at once and measured in turns,
round by round, so a drift of the machine's load hits them alike. Every round scores fresh
texts: a prompt vLLM has seen would come out of its cache. Scores are kept to measure what
bfloat16 costs in precision against float32, per engine, on the same texts.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from bench.common import model_server_env, summary
from reward_server.launcher import ServerProcess, running_server

logger = logging.getLogger(__name__)

#: Each variant's engine flags; every other flag is the same for all.
VARIANT_FLAGS: dict[str, tuple[str, ...]] = {
    "transformers": ("--engine", "transformers"),
    "vllm": ("--engine", "vllm"),
    "vllm-no-prefix": ("--engine", "vllm", "--no-enable-prefix-caching"),
}
WORKLOADS = ("grpo", "distinct")

#: Targets of issue 12: vLLM (prefix cache) over transformers, same dtype.
GRPO_TARGET = 2.5
DISTINCT_TARGET = 0.9


@dataclass
class EngineBenchConfig:
    """What the engine comparison measures."""

    model_path: str
    groups: int = 4
    group_size: int = 16
    prompt_tokens: int = 300
    completion_tokens: tuple[int, int] = (10, 120)
    distinct_texts: int = 32
    distinct_tokens: tuple[int, int] = (8, 256)
    rounds: int = 1
    dtypes: tuple[str, ...] = ("float32", "bfloat16")
    variants: tuple[str, ...] = ("transformers", "vllm", "vllm-no-prefix")
    #: The dtypes in which ``vllm-no-prefix`` (a reference, no target) runs: each vLLM
    #: server costs a start of a minute or more.
    reference_dtypes: tuple[str, ...] = ("float32",)
    #: "batch": one call with every group (a GRPO trainer's reward call); "group": one per group.
    grpo_send: str = "batch"
    seed: int = 0
    torch_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    #: Flags every server gets (the engine flags come from VARIANT_FLAGS).
    server_args: tuple[str, ...] = ()
    #: Flags the vLLM servers get on top (vLLM-only settings).
    vllm_args: tuple[str, ...] = ()
    #: CPUs vLLM's CPU backend keeps away from its model threads (its default is one per
    #: worker, half of a 2-core machine; the transformers engine's threads get every core);
    #: None leaves vLLM's default.
    vllm_reserved_cpus: int | None = 0
    start_timeout: float = 600.0


# ------------------------------------------------------------------------------ texts


@dataclass
class Workloads:
    """Every round's texts (round -1, a few texts of each kind, warms up); the same for
    every server."""

    grpo: list[list[list[str]]]  # round -> group -> texts
    distinct: list[list[str]]  # round -> texts

    def calls(self, workload: str, rnd: int, send: str) -> list[list[str]]:
        """The RewardClient calls of one workload in round ``rnd`` (-1: the warm-up)."""
        if workload == "distinct":
            return [self.distinct[rnd + 1]]
        groups = self.grpo[rnd + 1]
        return [list(g) for g in groups] if send == "group" else [[t for g in groups for t in g]]


def make_workloads(tokenizer: Any, cfg: EngineBenchConfig) -> Workloads:
    """Seeded texts: fresh GRPO prompts and distinct texts for the warm-up and every round."""
    from bench.models import make_texts

    grpo: list[list[list[str]]] = []
    distinct: list[list[str]] = []
    lo, hi = cfg.completion_tokens
    for rnd in range(cfg.rounds + 1):
        base = cfg.seed + 1000 * (rnd + 1)
        warm_up = rnd == 0
        groups = []
        for g in range(1 if warm_up else cfg.groups):
            (prompt,), _ = make_texts(
                tokenizer,
                1,
                min_tokens=cfg.prompt_tokens,
                max_tokens=cfg.prompt_tokens,
                seed=base + g,
            )
            completions, _ = make_texts(
                tokenizer,
                min(4, cfg.group_size) if warm_up else cfg.group_size,
                min_tokens=lo,
                max_tokens=hi,
                seed=base + 500 + g,
            )
            groups.append([f"{prompt} {c}" for c in completions])
        grpo.append(groups)
        dlo, dhi = cfg.distinct_tokens
        texts, _ = make_texts(
            tokenizer,
            min(4, cfg.distinct_texts) if warm_up else cfg.distinct_texts,
            min_tokens=dlo,
            max_tokens=dhi,
            seed=base + 999,
        )
        distinct.append(texts)
    return Workloads(grpo=grpo, distinct=distinct)


# ------------------------------------------------------------------------------ servers


def variants_of(cfg: EngineBenchConfig, dtype: str) -> list[str]:
    """The variants measured in ``dtype`` (the no-prefix reference only in some)."""
    return [v for v in cfg.variants if v != "vllm-no-prefix" or dtype in cfg.reference_dtypes]


@contextlib.contextmanager
def engine_servers(cfg: EngineBenchConfig, dtype: str) -> Iterator[dict[str, ServerProcess]]:
    """One server per variant in ``dtype``, started one after the other, all stopped at exit."""
    env = model_server_env(cfg.torch_threads)
    with contextlib.ExitStack() as stack:
        servers: dict[str, ServerProcess] = {}
        for variant in variants_of(cfg, dtype):
            flags = [*VARIANT_FLAGS[variant], "--dtype", dtype, *cfg.server_args]
            variant_env = dict(env)
            if variant.startswith("vllm"):
                flags += cfg.vllm_args
                if cfg.vllm_reserved_cpus is not None:
                    variant_env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(cfg.vllm_reserved_cpus)
            started = time.perf_counter()
            servers[variant] = stack.enter_context(
                running_server(cfg.model_path, *flags, env=variant_env, timeout=cfg.start_timeout)
            )
            logger.info(
                "engines: %s %s ready in %.0f s", variant, dtype, time.perf_counter() - started
            )
        yield servers


def _run_calls(client: Any, calls: Sequence[Sequence[str]]) -> tuple[float, list[float], list[int]]:
    """The calls one after the other: seconds, scores and token counts in order."""
    scores: list[float] = []
    tokens: list[int] = []
    started = time.perf_counter()
    for texts in calls:
        result = client.score_detailed(texts=list(texts))
        scores.extend(result.scores)
        tokens.extend(result.tokens)
    return time.perf_counter() - started, scores, tokens


@dataclass
class _Runs:
    """Measurements of one dtype: per (variant, workload), texts/s by round and the scores."""

    rates: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    scores: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    tokens: dict[str, list[int]] = field(default_factory=dict)


def measure_dtype(cfg: EngineBenchConfig, dtype: str, work: Workloads) -> tuple[_Runs, dict]:
    """Every variant in ``dtype``, in turns round by round; also the first server's /info."""
    from reward_client import RewardClient

    runs = _Runs()
    with engine_servers(cfg, dtype) as servers, contextlib.ExitStack() as stack:
        clients = {
            v: stack.enter_context(RewardClient(s.url, timeout=600.0)) for v, s in servers.items()
        }
        info = httpx.get(f"{next(iter(servers.values())).url}/info", timeout=30).json()
        for client in clients.values():  # warm-up: allocations, kernels, connections
            for workload in WORKLOADS:
                _run_calls(client, work.calls(workload, -1, cfg.grpo_send))
        variants = list(servers)
        for rnd in range(cfg.rounds):
            # Rotate who goes first, so that no variant always follows the same one.
            order = variants[rnd % len(variants) :] + variants[: rnd % len(variants)]
            for variant in order:
                for workload in WORKLOADS:
                    calls = work.calls(workload, rnd, cfg.grpo_send)
                    seconds, scores, tokens = _run_calls(clients[variant], calls)
                    n = len(scores)
                    runs.rates.setdefault((variant, workload), []).append(n / seconds)
                    runs.scores.setdefault((variant, workload), []).extend(scores)
                    if variant == variants[0]:
                        runs.tokens.setdefault(workload, []).extend(tokens)
                    logger.info(
                        "engines round %d %s %s %s: %.1f texts/s",
                        rnd + 1,
                        dtype,
                        variant,
                        workload,
                        n / seconds,
                    )
    return runs, info


# ------------------------------------------------------------------------------ figures


def paired(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Round-by-round ratios a/b, summarised."""
    return summary(x / y for x, y in zip(a, b, strict=False) if y > 0)


def precision_cost(low: Sequence[float], ref: Sequence[float]) -> dict[str, float]:
    """|low - ref| over the same texts: max, mean, and both over ref's spread (its std)."""
    diffs = [abs(x - y) for x, y in zip(low, ref, strict=True)]
    spread = statistics.pstdev(ref) if len(ref) > 1 else math.nan
    worst = max(diffs, default=math.nan)
    mean = statistics.fmean(diffs) if diffs else math.nan
    return {
        "n": len(diffs),
        "max_abs": worst,
        "mean_abs": mean,
        "score_std": spread,
        "max_rel_std": worst / spread if spread else math.nan,
        "mean_rel_std": mean / spread if spread else math.nan,
    }


def _scores_of(runs: _Runs, variant: str) -> list[float]:
    return [s for w in WORKLOADS for s in runs.scores.get((variant, w), [])]


def _target(name: str, value: dict[str, float], op: str, threshold: float) -> dict[str, Any]:
    med = value.get("median", math.nan)
    holds = med >= threshold if op == ">=" else med <= threshold
    return {"name": name, "value": value, "op": op, "threshold": threshold, "holds": bool(holds)}


def assemble(
    cfg: EngineBenchConfig, by_dtype: dict[str, _Runs], info: dict[str, Any]
) -> dict[str, Any]:
    """Tables, paired ratios, the bf16 precision cost and the targets."""
    table = {
        dtype: {
            variant: {w: summary(runs.rates.get((variant, w), [])) for w in WORKLOADS}
            for variant in variants_of(cfg, dtype)
        }
        for dtype, runs in by_dtype.items()
    }
    ratios: dict[str, dict[str, float]] = {}
    targets: list[dict[str, Any]] = []
    for dtype, runs in by_dtype.items():
        base = {w: runs.rates.get(("transformers", w), []) for w in WORKLOADS}
        for variant in variants_of(cfg, dtype):
            if variant == "transformers":
                continue
            for w in WORKLOADS:
                ratios[f"{w} {dtype} {variant}/transformers"] = paired(
                    runs.rates.get((variant, w), []), base[w]
                )
        if "vllm" in cfg.variants and "transformers" in cfg.variants:
            targets.append(
                _target(
                    f"GRPO {dtype}: vLLM (prefix cache) / transformers",
                    ratios[f"grpo {dtype} vllm/transformers"],
                    ">=",
                    GRPO_TARGET,
                )
            )
            targets.append(
                _target(
                    f"distinct texts {dtype}: vLLM / transformers",
                    ratios[f"distinct {dtype} vllm/transformers"],
                    ">=",
                    DISTINCT_TARGET,
                )
            )
    precision: dict[str, dict[str, float]] = {}
    agreement: dict[str, float] = {}
    if {"float32", "bfloat16"} <= set(by_dtype):
        both = [v for v in variants_of(cfg, "float32") if v in variants_of(cfg, "bfloat16")]
        for variant in both:
            precision[variant] = precision_cost(
                _scores_of(by_dtype["bfloat16"], variant), _scores_of(by_dtype["float32"], variant)
            )
    for dtype, runs in by_dtype.items():
        ref = _scores_of(runs, "transformers")
        for variant in variants_of(cfg, dtype):
            if variant != "transformers" and ref:
                other = _scores_of(runs, variant)
                agreement[f"{dtype} {variant}"] = max(
                    (abs(x - y) for x, y in zip(other, ref, strict=True)), default=math.nan
                )
    any_runs = next(iter(by_dtype.values()))
    texts = {
        w: {
            "n": len(toks),
            "mean_tokens": statistics.fmean(toks) if toks else math.nan,
            "min_tokens": min(toks, default=0),
            "max_tokens": max(toks, default=0),
        }
        for w, toks in any_runs.tokens.items()
    }
    return {
        "config": {k: v for k, v in asdict(cfg).items() if k != "model_path"},
        "model": info,
        "texts": texts,
        "texts_per_s": table,
        "ratios": ratios,
        "bf16_cost": precision,
        "engine_gap": agreement,
        "targets": targets,
    }


def run_engines(cfg: EngineBenchConfig) -> dict[str, Any]:
    """Measure every dtype and variant; return the figures (see BENCHMARKS.md)."""
    import json
    from pathlib import Path

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(cfg.model_path)
    work = make_workloads(tokenizer, cfg)
    marker = Path(cfg.model_path) / "prepared.json"
    by_dtype: dict[str, _Runs] = {}
    info: dict[str, Any] = {}
    for dtype in cfg.dtypes:
        by_dtype[dtype], dtype_info = measure_dtype(cfg, dtype, work)
        info = info or dtype_info
    results = assemble(cfg, by_dtype, info)
    if marker.exists():
        results["model"]["parameters"] = json.loads(marker.read_text("utf-8")).get("parameters")
    return results
