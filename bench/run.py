"""``make bench``: throughput/latency (L, S, N), PPO step time and the engines, in one run.

Writes ``bench/results/<date>.json`` and the generated tables of ``BENCHMARKS.md``.
``python -m bench.run --help`` lists the knobs; with no flags it runs the full benchmark:
all-MiniLM-L6-v2 for throughput, PPO and the trainer pattern, a 50M-parameter Llama-style
reward model for the engine comparison. ``--only engines`` runs the engine part alone and
rewrites only its block of ``BENCHMARKS.md``; ``--engines-quick`` shrinks it to a smoke test.
``--only verifiers`` and ``--only judges`` (:mod:`bench.judges`: a judge's items/s in
logprobs and generate modes) each write their own block too, as does ``--only rollout``
(:mod:`bench.rollout`: PPO rollouts with the vLLM engine against transformers'
``generate``; ``--rollout-quick`` shrinks it to a smoke test). ``--only cache``
(:mod:`bench.score_cache`: a GRPO-shaped load with duplicate completions, with and without
the score cache) writes its own block too.
``--only tenants`` (:mod:`bench.tenants`: two tenants on one server, one flooding it, the
other's latency and the total throughput) writes its own block too; ``--tenants-quick``
shrinks it to a smoke test. ``--only code`` (:mod:`bench.code`: tests per second per core of
programs run in the sandbox against bare subprocesses, per language) writes its own block
too; ``--code-quick`` shrinks it to a smoke test. ``--only groups`` (:mod:`bench.groups`: a
pairwise judge on groups of 8, ``pairs: all`` against ``pairs: 2``, vLLM's prefix cache on
against off) writes its own block too, as does ``--only reasoning`` (:mod:`bench.reasoning`: a
reward model and a judge on a 2,000-token thinking trace and a 100-token answer,
``reasoning: strip`` against ``keep``; ``--reasoning-quick`` shrinks it to a smoke test), and
``--only rubrics`` (:mod:`bench.rubrics`: a 10-criterion rubric judge on vLLM, its prefix
cache on against off; ``--rubrics-quick`` shrinks it to a smoke test), and ``--only graders``
(:mod:`bench.graders`: OpenAI graders' items/s, a python grader's warm sandbox against a
fresh interpreter per item).
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

#: Flags the benchmark gives the vLLM servers: eager mode (torch.compile adds one to two
#: minutes to every start here).
VLLM_BENCH_ARGS: tuple[str, ...] = ("--engine-arg", "enforce_eager=true")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


PARTS = (
    "throughput",
    "ppo",
    "engines",
    "verifiers",
    "judges",
    "rollout",
    "cache",
    "tenants",
    "code",
    "groups",
    "reasoning",
    "rubrics",
    "graders",
)


def _parts(text: str) -> tuple[str, ...]:
    parts = tuple(x.strip() for x in text.split(",") if x.strip())
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown part(s) {sorted(unknown)}; choose {PARTS}")
    return parts


def _words(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


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
    p.add_argument("--skip-engines", action="store_true")
    p.add_argument("--skip-verifiers", action="store_true")
    p.add_argument("--skip-judges", action="store_true")
    p.add_argument("--skip-rollout", action="store_true")
    p.add_argument("--skip-tenants", action="store_true")
    p.add_argument("--skip-cache", action="store_true")
    p.add_argument("--skip-code", action="store_true")
    p.add_argument("--skip-groups", action="store_true")
    p.add_argument("--skip-reasoning", action="store_true")
    p.add_argument("--skip-rubrics", action="store_true")
    p.add_argument("--skip-graders", action="store_true")
    p.add_argument(
        "--only", type=_parts, help=f"run only these parts (comma-separated of {', '.join(PARTS)})"
    )
    g = p.add_argument_group("engines (the engine comparison and the trainer pattern)")
    g.add_argument("--engine-model", help="Llama-style reward model folder (default: built)")
    g.add_argument("--engine-rounds", type=int, default=1)
    g.add_argument("--engine-dtypes", type=_words, default=("float32", "bfloat16"))
    g.add_argument(
        "--engine-variants", type=_words, default=("transformers", "vllm", "vllm-no-prefix")
    )
    g.add_argument("--grpo-groups", type=int, default=4)
    g.add_argument("--grpo-group-size", type=int, default=16)
    g.add_argument("--grpo-prompt-tokens", type=int, default=300)
    g.add_argument(
        "--grpo-send", choices=("batch", "group"), default="batch", help="one call or one per group"
    )
    g.add_argument("--distinct-texts", type=int, default=32)
    g.add_argument(
        "--reference-dtypes",
        type=_words,
        default=("float32",),
        help="dtypes in which vllm-no-prefix (a reference) runs",
    )
    g.add_argument(
        "--vllm-arg",
        action="append",
        default=[],
        help="extra flag for the vLLM servers only (repeatable), e.g. --vllm-arg=--engine-arg",
    )
    g.add_argument(
        "--vllm-reserved-cpus",
        type=int,
        default=0,
        help="VLLM_CPU_NUM_OF_RESERVED_CPU of the vLLM servers (-1: vLLM's default, one)",
    )
    g.add_argument("--trainer-texts", type=int, default=256)
    g.add_argument("--trainer-rounds", type=int, default=3, help="0 skips the trainer pattern")
    g.add_argument(
        "--engines-quick",
        action="store_true",
        help="a tiny model and workload (a smoke test of the code, not a measurement)",
    )
    v = p.add_argument_group("verifiers (kind: verifier, the math verifier's pool)")
    v.add_argument("--verifier-items", type=int, default=400, help="maths answers per round")
    v.add_argument("--verifier-rounds", type=int, default=3)
    v.add_argument("--verifier-workers", type=_ints, default=(1, 2))
    j = p.add_argument_group("judges (kind: judge, logprobs and generate modes on CPU)")
    j.add_argument("--judge-items", type=int, default=128, help="question/answer items per round")
    j.add_argument("--judge-rounds", type=int, default=3)
    j.add_argument("--judge-hidden", type=int, default=256, help="the GPT-2 judge's hidden size")
    j.add_argument("--judge-layers", type=int, default=4)
    j.add_argument("--judge-max-new-tokens", type=_ints, default=(8, 32))
    r = p.add_argument_group("rollout (PPO rollouts: vLLM engine vs transformers generate)")
    r.add_argument("--rollout-steps", type=int, help="measured steps per variant (default 2)")
    r.add_argument(
        "--rollout-quick",
        action="store_true",
        help="8 prompts, 16-token responses, a 2-layer policy, 1 step (a smoke test)",
    )
    c = p.add_argument_group("cache (the score cache: GRPO groups with 25 % duplicates)")
    c.add_argument("--cache-groups", type=int, default=32, help="groups of 8 per round")
    c.add_argument("--cache-rounds", type=int, default=5)
    c.add_argument("--cache-clients", type=int, default=4, help="requests in flight")
    t = p.add_argument_group("tenants (two tenants, one flooding: fair scheduling)")
    t.add_argument("--tenants-duration", type=float, default=15.0, help="seconds per window")
    t.add_argument("--tenants-rounds", type=int, default=2)
    t.add_argument("--tenants-a-clients", type=int, default=10, help="the flooding tenant's")
    t.add_argument(
        "--tenants-quick", action="store_true", help="a smoke test (seconds, not figures)"
    )
    k = p.add_argument_group("code (programs in the sandbox against bare subprocesses)")
    k.add_argument(
        "--code-languages", type=_words, default=("python", "c", "cpp", "javascript", "java")
    )
    k.add_argument("--code-items", type=int, default=12, help="items per measurement")
    k.add_argument("--code-tests", type=int, default=20, help="tests of the many-test item")
    k.add_argument("--code-rounds", type=int, default=3)
    k.add_argument(
        "--code-quick", action="store_true", help="a smoke test: python, 2 items of 3 tests"
    )
    w = p.add_argument_group("groups (a pairwise judge on groups of 8: pairs, prefix cache)")
    w.add_argument("--groups-groups", type=int, default=8, help="groups of 8 per request")
    w.add_argument("--groups-rounds", type=int, default=3)
    w.add_argument(
        "--groups-servers", type=_words, default=("transformers", "vllm", "vllm-no-prefix")
    )
    q = p.add_argument_group("reasoning (a thinking trace stripped or kept: reward model, judge)")
    q.add_argument("--reasoning-items", type=int, default=16, help="conversations per request")
    q.add_argument("--reasoning-rounds", type=int, default=7)
    q.add_argument(
        "--reasoning-quick", action="store_true", help="a smoke test (seconds, not figures)"
    )
    r = p.add_argument_group("rubrics (a rubric judge on vLLM: its prefix cache on and off)")
    r.add_argument("--rubrics-items", type=int, default=16, help="items per round")
    r.add_argument("--rubrics-criteria", type=int, default=10)
    r.add_argument("--rubrics-rounds", type=int, default=3)
    r.add_argument("--rubrics-quick", action="store_true", help="a smoke test: 4 items, 1 round")
    p.add_argument("--results-dir", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--name", help="results file name (default: <date>.json)")
    p.add_argument("--markdown", type=Path, default=REPO / "BENCHMARKS.md")
    p.add_argument("--no-markdown", action="store_true")
    return p


def _selected(args: argparse.Namespace) -> tuple[str, ...]:
    """The parts this run measures: ``--only``, else every part not skipped."""
    if args.only:
        return args.only
    skipped = {"throughput": args.skip_throughput, "ppo": args.skip_ppo}
    skipped["engines"] = args.skip_engines
    skipped["verifiers"] = args.skip_verifiers
    skipped["judges"] = args.skip_judges
    skipped["rollout"] = args.skip_rollout
    skipped["tenants"] = args.skip_tenants
    skipped["cache"] = args.skip_cache
    skipped["code"] = args.skip_code
    skipped["groups"] = args.skip_groups
    skipped["reasoning"] = args.skip_reasoning
    skipped["rubrics"] = args.skip_rubrics
    skipped["graders"] = args.skip_graders
    return tuple(part for part in PARTS if not skipped[part])


def run(argv: list[str] | None = None) -> tuple[dict[str, Any], Path]:
    """Run the benchmark; return the results and the JSON file written."""
    args = build_parser().parse_args(argv)
    from bench.common import machine_info, versions
    from bench.models import prepare_minilm_reward_model

    parts = _selected(args)
    started = time.perf_counter()
    date = dt.datetime.now().astimezone()
    meta: dict[str, Any] = {
        "date": date.isoformat(timespec="seconds"),
        "command": "make bench" if not argv else "python -m bench.run " + " ".join(argv),
        "parts": list(parts),
        "machine": machine_info(),
        "versions": versions(),
        "threads": (
            f"torch intra-op threads: {args.threads} in L and the PPO trainer, "
            f"OMP_NUM_THREADS={args.threads} for the servers; load generator: no torch, "
            "OMP_NUM_THREADS=1"
        ),
    }
    model_path = args.model or str(prepare_minilm_reward_model())
    results: dict[str, Any] = {"meta": meta}
    if "throughput" in parts:
        results["throughput"] = _run_throughput(args, model_path)
    if "ppo" in parts:
        results["ppo"] = _run_ppo(args, model_path)
    if "engines" in parts:
        results["engines"], trainer = _run_engines(args, model_path)
        if trainer:
            results["trainer_pattern"] = trainer
    if "graders" in parts:
        from bench.graders import GraderBenchConfig, run_grader_bench

        results["graders"] = run_grader_bench(GraderBenchConfig())
    if "verifiers" in parts:
        from bench.verifiers import VerifierBenchConfig, run_verifier_bench

        results["verifiers"] = run_verifier_bench(
            VerifierBenchConfig(
                items=args.verifier_items,
                rounds=args.verifier_rounds,
                workers=args.verifier_workers,
            )
        )
    if "judges" in parts:
        from bench.judges import JudgeBenchConfig, run_judge_bench

        results["judges"] = run_judge_bench(
            JudgeBenchConfig(
                items=args.judge_items,
                rounds=args.judge_rounds,
                hidden=args.judge_hidden,
                layers=args.judge_layers,
                max_new_tokens=args.judge_max_new_tokens,
                threads=args.threads,
            )
        )
    if "rollout" in parts:
        results["rollout"] = _run_rollout(args, model_path)
    if "cache" in parts:
        from bench.score_cache import CacheBenchConfig, run_cache_bench

        results["cache"] = run_cache_bench(
            CacheBenchConfig(
                model_path=model_path,
                groups=args.cache_groups,
                rounds=args.cache_rounds,
                clients=args.cache_clients,
                threads=args.threads,
                server_args=tuple(args.server_arg),
            )
        )
    if "tenants" in parts:
        results["tenants"] = _run_tenants(args, model_path)
    if "code" in parts:
        from bench.code import CodeBenchConfig, quick_config, run_code_bench

        code_cfg = (
            quick_config()
            if args.code_quick
            else CodeBenchConfig(
                languages=args.code_languages,
                items=args.code_items,
                tests=args.code_tests,
                rounds=args.code_rounds,
            )
        )
        results["code"] = run_code_bench(code_cfg)
    if "groups" in parts:
        from bench.groups import GroupsBenchConfig, run_groups_bench

        results["groups"] = run_groups_bench(
            GroupsBenchConfig(
                groups=args.groups_groups,
                rounds=args.groups_rounds,
                servers=args.groups_servers,
                threads=args.threads,
            )
        )
    if "reasoning" in parts:
        results["reasoning"] = _run_reasoning(args)
    if "rubrics" in parts:
        from bench.rubrics import RubricBenchConfig, run_rubric_bench

        quick = args.rubrics_quick
        results["rubrics"] = run_rubric_bench(
            RubricBenchConfig(
                items=4 if quick else args.rubrics_items,
                criteria=args.rubrics_criteria,
                rounds=1 if quick else args.rubrics_rounds,
                threads=args.threads,
            )
        )
    meta["wall_s"] = time.perf_counter() - started
    meta["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    args.results_dir.mkdir(parents=True, exist_ok=True)
    default_name = f"{date:%Y-%m-%d}" + ("" if args.only is None else "-" + "+".join(parts))
    out = args.results_dir / (args.name or f"{default_name}.json")
    text = json.dumps(results, indent=2)
    out.write_text(text + "\n", encoding="utf-8")
    from bench.charts import render_charts

    render_charts(out)  # its charts beside it, for the docs' Benchmarks page
    results = json.loads(text)  # what the file holds (tuples as lists)
    if not args.no_markdown:
        write_markdown(args.markdown, parts, results)
    return results, out


def write_markdown(path: Path, parts: tuple[str, ...], results: dict[str, Any]) -> None:
    """Rewrite the blocks of BENCHMARKS.md the parts measured (the others stay as they are)."""
    from bench.judges import render as render_judges
    from bench.report import (
        render,
        render_engines,
        update_block,
        update_engines_block,
        update_markdown,
    )
    from bench.rollout import render as render_rollout
    from bench.verifiers import render as render_verifiers

    if "verifiers" in parts:
        update_block(path, "verifiers", render_verifiers(results["verifiers"]), "Verifiers")
    if "judges" in parts:
        update_block(path, "judges", render_judges(results["judges"]), "Judges")
    if "rollout" in parts:
        update_block(path, "rollout", render_rollout(results["rollout"]), "Rollouts")
    if "cache" in parts:
        from bench.score_cache import render as render_cache

        update_block(path, "cache", render_cache(results["cache"]), "Score cache")
    if "tenants" in parts:
        from bench.tenants import render as render_tenants

        update_block(path, "tenants", render_tenants(results["tenants"]), "Tenants")
    if "code" in parts:
        from bench.code import render as render_code

        update_block(path, "code", render_code(results["code"]), "Code")
    if "groups" in parts:
        from bench.groups import render as render_groups

        update_block(path, "groups", render_groups(results["groups"]), "Groups")
    if "reasoning" in parts:
        from bench.reasoning import render as render_reasoning

        update_block(path, "reasoning", render_reasoning(results["reasoning"]), "Reasoning")
    own_blocks = ("verifiers", "judges", "rollout", "cache", "tenants", "code", "groups")
    if "rubrics" in parts:
        from bench.rubrics import render as render_rubrics

        update_block(path, "rubrics", render_rubrics(results["rubrics"]), "Rubrics")
    own_blocks += ("reasoning", "rubrics")
    if "graders" in parts:
        from bench.graders import render as render_graders

        update_block(path, "graders", render_graders(results["graders"]), "OpenAI graders")
    own_blocks += ("graders",)
    rest = [part for part in parts if part not in own_blocks]
    if rest == ["engines"]:
        update_engines_block(path, render_engines(results, with_meta=True))
    elif rest:
        update_markdown(path, render(results))


def _run_throughput(args: argparse.Namespace, model_path: str) -> dict[str, Any]:
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
        return run_throughput(cfg, Path(tmp))


def _run_ppo(args: argparse.Namespace, model_path: str) -> dict[str, Any]:
    from bench.models import prepare_tiny_policy
    from bench.ppo_step import PPOBenchConfig, run_ppo_bench

    policy = args.policy or str(prepare_tiny_policy())
    return run_ppo_bench(
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


def _run_rollout(args: argparse.Namespace, model_path: str) -> dict[str, Any]:
    from bench.rollout import RolloutBenchConfig, quick_config, run_rollout_bench

    given: dict[str, Any] = {"threads": args.threads, "reward_model_path": model_path}
    given["server_args"] = tuple(args.server_arg)
    if args.rollout_steps:
        given["steps"] = args.rollout_steps
    cfg = quick_config(**given) if args.rollout_quick else RolloutBenchConfig(**given)
    return run_rollout_bench(cfg)


def _run_tenants(args: argparse.Namespace, model_path: str) -> dict[str, Any]:
    from bench.tenants import TenantsBenchConfig, quick_config, run_tenants_bench

    given: dict[str, Any] = {"model_path": model_path, "threads": args.threads}
    given["server_args"] = tuple(args.server_arg)
    if args.tenants_quick:
        return run_tenants_bench(quick_config(**given))
    cfg = TenantsBenchConfig(
        **given,
        a_clients=args.tenants_a_clients,
        duration_s=args.tenants_duration,
        rounds=args.tenants_rounds,
    )
    return run_tenants_bench(cfg)


def _run_reasoning(args: argparse.Namespace) -> dict[str, Any]:
    from bench.reasoning import ReasoningBenchConfig, quick_config, run_reasoning_bench

    if args.reasoning_quick:
        return run_reasoning_bench(quick_config(threads=args.threads))
    cfg = ReasoningBenchConfig(
        items=args.reasoning_items, rounds=args.reasoning_rounds, threads=args.threads
    )
    return run_reasoning_bench(cfg)


def _run_engines(
    args: argparse.Namespace, model_path: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The engine comparison (Llama-style model) and the trainer pattern (``model_path``)."""
    from bench.engines import EngineBenchConfig, run_engines
    from bench.models import LLAMA_QUICK_SIZES, prepare_llama_reward_model
    from bench.trainer_pattern import TrainerPatternConfig, run_trainer_pattern

    quick = args.engines_quick
    llama = args.engine_model or str(
        prepare_llama_reward_model(sizes=LLAMA_QUICK_SIZES, vocab_size=512, max_length=256)
        if quick
        else prepare_llama_reward_model()
    )
    common = {
        "model_path": llama,
        "dtypes": args.engine_dtypes,
        "variants": args.engine_variants,
        "reference_dtypes": args.reference_dtypes,
        "grpo_send": args.grpo_send,
        "torch_threads": args.threads,
        "server_args": tuple(args.server_arg),
        "vllm_args": (*VLLM_BENCH_ARGS, *args.vllm_arg),
        "vllm_reserved_cpus": None if args.vllm_reserved_cpus < 0 else args.vllm_reserved_cpus,
    }
    if quick:
        sizes = {"groups": 2, "group_size": 4, "prompt_tokens": 40, "completion_tokens": (4, 12)}
        cfg = EngineBenchConfig(
            **common, **sizes, distinct_texts=6, distinct_tokens=(8, 40), rounds=1
        )
    else:
        cfg = EngineBenchConfig(
            **common,
            groups=args.grpo_groups,
            group_size=args.grpo_group_size,
            prompt_tokens=args.grpo_prompt_tokens,
            distinct_texts=args.distinct_texts,
            rounds=args.engine_rounds,
        )
    engines = run_engines(cfg)
    if not quick and args.trainer_rounds < 1:
        return engines, {}
    trainer = run_trainer_pattern(
        TrainerPatternConfig(
            model_path=model_path,
            n_texts=16 if quick else args.trainer_texts,
            chunk=4 if quick else 64,
            max_tokens=40 if quick else args.max_tokens,
            batch_sizes=(2, 4) if quick else (4, 8, 16),
            rounds=1 if quick else args.trainer_rounds,
            torch_threads=args.threads,
            server_args=tuple(args.server_arg),
        )
    )
    return engines, trainer


def main(argv: list[str] | None = None) -> int:
    """CLI entry: run, then print where the results went and which targets hold."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    results, out = run(sys.argv[1:] if argv is None else argv)
    print(f"results: {out}")
    for section in ("throughput", "ppo", "engines", "trainer_pattern", "cache", "tenants", "code"):
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
