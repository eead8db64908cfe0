"""bench.paired's figures: the ratio this / base is taken within each pair of windows, a
window without an answer makes no pair, and the table says each load's medians."""

from __future__ import annotations

import math

from bench.paired import LOADS, paired_rows, render


def _pairs(values: list[tuple[float, float]]) -> dict[str, list[dict[str, float]]]:
    return {name: [{"base": b, "this": t} for b, t in values] for name, *_ in LOADS}


def test_ratios_are_taken_pair_by_pair() -> None:
    # The machine slowed down between rounds: both sides alike, so every pair says 1.1.
    rows = paired_rows(_pairs([(10.0, 11.0), (20.0, 22.0), (40.0, 44.0)]))
    for row in rows:
        assert math.isclose(row["ratio_median"], 1.1)
        assert math.isclose(row["ratio_min"], 1.1) and math.isclose(row["ratio_max"], 1.1)
        assert (row["base"], row["this"], row["pairs"]) == (20.0, 22.0, 3)


def test_a_window_without_answers_makes_no_pair() -> None:
    rows = paired_rows(_pairs([(10.0, 0.0), (0.0, 5.0), (10.0, 9.0)]))
    assert all(row["pairs"] == 1 and math.isclose(row["ratio_median"], 0.9) for row in rows)
    empty = paired_rows(_pairs([(0.0, 1.0)]))
    assert all(math.isnan(row["ratio_median"]) for row in empty)


def test_the_table_has_a_row_per_load() -> None:
    result = {
        "base": "abc1234",
        "this": "def5678",
        "rounds": 3,
        "duration_s": 5.0,
        "machine": {"cpu": "Some CPU"},
        "rows": paired_rows(_pairs([(10.0, 11.0), (20.0, 22.0), (40.0, 44.0)])),
    }
    text = render(result)
    assert "Base abc1234 against this tree def5678: 3 rounds of 5 s windows" in text
    assert "Some CPU" in text
    for name, *_ in LOADS:
        assert f"| {name} |" in text
    assert text.count("| 1.100 (1.100-1.100) |") == len(LOADS)
