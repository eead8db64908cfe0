"""The graders part of the benchmark (bench/graders.py) runs end to end at a tiny size (no
speed is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import graders


def test_graders_bench_measures_every_grader_and_the_fresh_interpreter(tmp_path: Path) -> None:
    out = tmp_path / "graders.json"
    assert graders.main(["--quick", "--json", str(out)]) == 0
    result = json.loads(out.read_text(encoding="utf-8"))
    figures = result["graders"]
    assert {"string_check", "python", "python, fresh interpreter per item"} <= set(figures)
    assert all(fig["items_per_s"]["median"] > 0 for fig in figures.values())
    assert "| string_check |" in graders.render(result)
