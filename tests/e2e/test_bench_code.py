"""The code part of the benchmark (bench/code.py) runs end to end at a tiny size, alone and
through ``python -m bench.run --only code`` (no speed is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import code, run


def test_code_part_measures_both_modes_and_checks_every_output(tmp_path: Path) -> None:
    out = tmp_path / "code.json"
    assert code.main(["--quick", "--json", str(out)]) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    assert result["wrong_outputs"] == 0
    figures = result["languages"]["python"]
    assert set(figures["tests_per_s_per_core"]) == {
        "sandboxed/trivial",
        "bare/trivial",
        "sandboxed/item",
        "bare/item",
    }
    assert all(fig["median"] > 0 for fig in figures["tests_per_s_per_core"].values())
    assert {t["name"] for t in result["targets"]} == {
        "python: 3-test item, sandboxed / bare",
        "python: per-test cost sandboxed / a bare python start",
    }
    table = code.render(result)
    assert "| python |" in table and "3-test: sandboxed" in table


def test_code_part_runs_alone_and_writes_its_own_block(tmp_path: Path) -> None:
    markdown = tmp_path / "BENCHMARKS.md"
    markdown.write_text("# Benchmarks\n\nprose that stays\n", encoding="utf-8")
    argv = ["--only", "code", "--code-quick", "--results-dir", str(tmp_path)]
    argv += ["--markdown", str(markdown)]
    results, out = run.run(argv)
    assert out.exists() and set(results) == {"meta", "code"}
    assert results["code"]["wrong_outputs"] == 0
    text = markdown.read_text(encoding="utf-8")
    assert "prose that stays" in text and "<!-- bench:code:begin -->" in text
    assert "## Code" in text
    run.run(argv)  # a second run replaces the block
    assert markdown.read_text(encoding="utf-8").count("<!-- bench:code:begin -->") == 1
