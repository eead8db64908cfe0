"""Rubric judges' arithmetic (``reward_server.scoring.rubric``) and their models-file entry:
criteria read from labels, the explicit score against hand-computed cases (weights,
categories, pitfalls, required criteria, an empty rubric, pitfalls only), generated verdicts
and implicit ratings parsed and normalised, and the entry's checks."""

from __future__ import annotations

import re

import pytest

from reward_server.config.entries import DEFAULT_CATEGORIES, RubricJudge
from reward_server.config.models_file import ModelsFileError, parse_entry, parse_models_file
from reward_server.errors import LabelError
from reward_server.scoring.known_labels import ModelSeries
from reward_server.scoring.rubric import (
    OUT_OF_RANGE,
    PARSE_FAILURE,
    Criterion,
    explicit_score,
    failed_categories,
    minimum_score,
    parse_rating,
    parse_verdict,
    rubric_of,
)
from reward_server.scoring.signals import RewardSignals

CATS = {"essential": 1.0, "important": 0.5, "pitfall": -2.0}


def test_criteria_from_a_list_or_a_mapping() -> None:
    label = [
        {"text": "a", "category": "essential"},
        {"text": "b", "weight": 3, "category": "important", "required": True},
        {"text": "c", "weight": -1.5},
    ]
    want = (
        Criterion("a", 1.0, "essential"),
        Criterion("b", 3.0, "important", True),
        Criterion("c", -1.5),
    )
    assert rubric_of(label, CATS, "item 0") == want
    assert rubric_of({"rubric": label, "reference": "x"}, CATS, "item 0") == want
    assert rubric_of([], CATS, "item 0") == ()
    # null is absent (a dataset's table gives every criterion the same keys).
    nulls = {"text": "a", "weight": None, "category": "essential", "required": None}
    assert rubric_of([nulls], CATS, "item 0") == (want[0],)
    assert want[2].pitfall and not want[0].pitfall


@pytest.mark.parametrize(
    ("label", "message"),
    [
        (None, "item 3: no label"),
        ({"answer": 1}, "item 3: the label has no 'rubric' key"),
        (7, "item 3: the rubric is a int"),
        ([{"text": "a"}], "item 3, criterion 0: give a 'weight' or a 'category'"),
        ([{"text": "a", "weight": True}], "'weight' must be a number"),
        ([{"text": "a", "weight": float("inf")}], "'weight' must be finite"),
        ([{"text": "  ", "weight": 1}], "'text' must be a non-empty string"),
        ([{"text": "a", "category": "vital"}], "unknown category 'vital'"),
    ],
)
def test_malformed_rubrics_name_the_item_and_criterion(label: object, message: str) -> None:
    with pytest.raises(LabelError, match=re.escape(message)):
        rubric_of(label, CATS, "item 3")


def _c(weight: float, required: bool = False) -> Criterion:
    return Criterion("x", weight, None, required)


def test_explicit_score_by_hand() -> None:
    # P = 2 + 1 = 3, a pitfall of weight -1.5: (2 * 0.9 + 1 * 0.4 - 1.5 * 0.2) / 3.
    rubric = [_c(2.0), _c(1.0), _c(-1.5)]
    assert explicit_score(rubric, [0.9, 0.4, 0.2], 0.5) == pytest.approx(1.9 / 3)
    # All met, no pitfall committed: 1; nothing met, every pitfall committed: -N / P.
    assert explicit_score(rubric, [1.0, 1.0, 0.0], 0.5) == pytest.approx(1.0)
    assert explicit_score(rubric, [0.0, 0.0, 1.0], 0.5) == pytest.approx(-0.5)
    assert minimum_score(rubric) == pytest.approx(-0.5)
    # A zero weight is reported, never scored.
    assert explicit_score([_c(1.0), _c(0.0)], [0.25, 1.0], 0.5) == pytest.approx(0.25)


def test_required_criteria_gate_to_the_minimum() -> None:
    rubric = [_c(2.0, required=True), _c(1.0), _c(-1.5)]
    assert explicit_score(rubric, [0.4, 1.0, 0.0], 0.5) == pytest.approx(-0.5)  # failed
    assert explicit_score(rubric, [0.6, 1.0, 0.0], 0.5) == pytest.approx((1.2 + 1) / 3)
    # A required pitfall fails when committed (its probability at the threshold or above).
    rubric = [_c(1.0), _c(-1.0, required=True)]
    assert explicit_score(rubric, [1.0, 0.5], 0.5) == pytest.approx(-1.0)
    assert explicit_score(rubric, [1.0, 0.49], 0.5) == pytest.approx(0.51)
    # The threshold decides.
    assert explicit_score([_c(1.0, required=True)], [0.7], 0.8) == 0.0


def test_an_empty_rubric_and_pitfalls_only() -> None:
    assert explicit_score([], [], 0.5) == 1.0
    # Pitfalls only: 1 - sum |w| v / N, in [0, 1].
    rubric = [_c(-1.0), _c(-3.0)]
    assert explicit_score(rubric, [0.5, 0.25], 0.5) == pytest.approx(1 - (0.5 + 0.75) / 4)
    assert explicit_score(rubric, [0.0, 0.0], 0.5) == 1.0
    assert explicit_score(rubric, [1.0, 1.0], 0.5) == pytest.approx(0.0)
    assert explicit_score([_c(-1.0, required=True)], [0.9], 0.5) == 0.0
    with pytest.raises(ValueError, match="2 verdicts for 1 criteria"):
        explicit_score([_c(1.0)], [0.1, 0.2], 0.5)


def test_failed_categories() -> None:
    rubric = [
        Criterion("a", 1.0, "essential"),
        Criterion("b", 1.0, "essential"),
        Criterion("c", -1.0, "pitfall"),
        Criterion("d", 2.0),
    ]
    got = failed_categories(rubric, [0.9, 0.2, 0.1, 0.7], 0.5)
    assert got == {"essential": True, "pitfall": False, "uncategorised": False}
    got = failed_categories(rubric, [0.9, 0.6, 0.6, 0.1], 0.5)
    assert got == {"essential": False, "pitfall": True, "uncategorised": True}


def test_generated_verdicts_and_ratings() -> None:
    entry = RubricJudge.model_validate(
        {"name": "r", "model": "m", "mode": "rubric", "template": "{{ criterion }}"}
    )
    pattern = re.compile(entry.verdict_regex)
    tokens = entry.verdict_tokens
    assert parse_verdict("Yes, it does.", pattern, tokens) == 1.0
    assert parse_verdict("verdict: no", pattern, tokens) == 0.0
    assert parse_verdict("Nobody knows; yes", pattern, tokens) == 1.0  # words, not prefixes
    assert parse_verdict("maybe", pattern, tokens) is None
    custom = re.compile(r"VERDICT: (\w+)")
    assert parse_verdict("VERDICT: pass", custom, ("pass", "fail")) == 1.0
    assert parse_verdict("VERDICT: other", custom, ("pass", "fail")) is None
    rating = re.compile(r"(-?\d+(?:\.\d+)?)")
    assert parse_rating("Rating: 7/10", rating, 1, 10) == (pytest.approx(6 / 9), None)
    assert parse_rating("10", rating, 1, 10) == (1.0, None)
    assert parse_rating("0", rating, 1, 10) == (None, OUT_OF_RANGE)
    assert parse_rating("no idea", rating, 1, 10) == (None, PARSE_FAILURE)


def _entry(**extra: object) -> dict[str, object]:
    return {
        "name": "r",
        "kind": "judge",
        "model": "m",
        "mode": "rubric",
        "template": "{{ criterion }}",
        **extra,
    }


def test_the_entry_defaults_and_checks() -> None:
    entry = parse_entry(_entry())
    assert isinstance(entry, RubricJudge)
    assert entry.categories == DEFAULT_CATEGORIES
    assert (entry.aggregation, entry.verdict, entry.verdict_tokens) == (
        "explicit",
        "logprobs",
        ("Yes", "No"),
    )
    assert not entry.generates and entry.masks
    assert parse_entry(_entry(aggregation="implicit")).generates
    bad = [
        ({"verdict_tokens": ["Yes", "Yes"]}, "verdict_tokens: two different"),
        ({"verdict": "generate", "verdict_pattern": "(a)(b)"}, "needs exactly one group"),
        ({"verdict_pattern": "(yes)"}, "verdict_pattern is for verdict: generate"),
        ({"score_pattern": "(\\d)"}, "score_pattern is for aggregation: implicit"),
        ({"aggregation": "implicit", "rating_range": [5, 5]}, "rating_range: two finite"),
        ({"categories": {"essential": float("nan")}}, "category weights must be finite"),
        ({"verdict_threshold": 0}, "verdict_threshold"),
        ({"answer_tokens": ["A", "B"]}, "answer_tokens: only for mode: pairwise"),
        ({"mode": "rubrics"}, "'rubric'"),
    ]
    for extra, message in bad:
        with pytest.raises(ModelsFileError, match=re.escape(message)):
            parse_models_file({"models": [_entry(**extra)]})


def test_the_reward_signals_keep_a_window_per_category() -> None:
    signals = RewardSignals(window=3)
    both = (("a", True), ("b", False))
    signals.record_rubric("t", "m", [both, both, (("a", False),), (("a", False),)])
    got = {r.category: (r.items, r.failed_ratio) for r in signals.snapshot().rubrics}
    assert got == {"a": (3, pytest.approx(1 / 3)), "b": (2, 0.0)}
    assert {(r.model, r.tenant) for r in signals.snapshot().rubrics} == {("m", "t")}
    off = RewardSignals(window=0)
    off.record_rubric("t", "m", [both])
    assert off.snapshot().rubrics == ()


def test_a_rubric_judges_series_are_known_at_start() -> None:
    explicit = parse_entry(_entry(categories={"must": 1.0, "never": -1.0}))
    series = ModelSeries.of(explicit, cached=True)
    assert series.rubric_categories == ("must", "never", "uncategorised")
    assert series.verifier_errors == () and series.passes and series.cached
    generated = ModelSeries.of(parse_entry(_entry(verdict="generate")), cached=True)
    assert generated.verifier_errors == ("parse_failure",)
    assert "parse_failure" in generated.masked
    implicit = parse_entry(_entry(aggregation="implicit", template="{{ rubric }}"))
    assert ModelSeries.of(implicit, cached=False).verifier_errors == (
        "parse_failure",
        "out_of_range",
    )
