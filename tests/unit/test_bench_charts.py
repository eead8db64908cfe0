"""bench/charts.py: the charts ``make bench`` writes beside its results, for the docs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from bench.charts import render_charts

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def test_the_committed_charts_are_those_of_the_committed_results(tmp_path: Path) -> None:
    """Re-drawing 2026-12-01's results gives the committed SVGs byte for byte."""
    for name in ("2026-12-01.json", "2026-12-01-engines.json"):
        shutil.copy(RESULTS / name, tmp_path / name)
    written = render_charts(tmp_path / "2026-12-01.json")
    written += render_charts(tmp_path / "2026-12-01-engines.json")
    names = sorted(path.name for path in written)
    assert names == [
        "2026-12-01-engines.svg",
        "2026-12-01-latency.svg",
        "2026-12-01-throughput.svg",
    ]
    for path in written:
        assert path.read_bytes() == (RESULTS / path.name).read_bytes(), path.name


def test_each_chart_shows_its_figures(tmp_path: Path) -> None:
    row = {
        "clients": 4,
        "per_request": 1,
        "texts_per_s": {"median": 123.0},
        "p50_ms": {"median": 10.0},
        "p99_ms": {"median": 40.0},
    }
    results = {
        "meta": {},
        "throughput": {
            "server": [row, {**row, "clients": 16}],
            "naive": [{**row, "texts_per_s": {"median": 50.0}}],
            "inprocess": {"texts_per_s": {"median": 150.0}},
        },
        "engines": {"texts_per_s": {"float32": {"transformers": {"grpo": {"median": 3.0}}}}},
        "verifiers": {"items_per_s": 1.0},
    }
    source = tmp_path / "2030-01-01.json"
    source.write_text(json.dumps(results))
    written = {path.name: path.read_text() for path in render_charts(source)}
    assert set(written) == {
        "2030-01-01-throughput.svg",
        "2030-01-01-latency.svg",
        "2030-01-01-engines.svg",
    }
    throughput = written["2030-01-01-throughput.svg"]
    assert "reward-server, 1 text(s)/request" in throughput and "naive server" in throughput
    assert "in-process scoring" in throughput
    assert "p99" in written["2030-01-01-latency.svg"]
    assert "float32 transformers" in written["2030-01-01-engines.svg"]


def test_a_file_without_chartable_parts_gets_no_charts(tmp_path: Path) -> None:
    source = tmp_path / "2030-01-01-verifiers.json"
    source.write_text(json.dumps({"meta": {}, "verifiers": {"items_per_s": 1.0}}))
    assert render_charts(source) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [source.name]
