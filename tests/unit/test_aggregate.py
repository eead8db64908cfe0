"""The arithmetic of composite rewards against hand-computed cases (no models)."""

from __future__ import annotations

import pytest

from reward_server.scoring.aggregate import Weighting, combine, label_weights, own_score

SCORES = {"helpful": [1.0, -2.0, 0.5], "safe": [3.0, 1.0, -1.0]}


def test_weighted_sum_mean_and_min_of_plain_scores() -> None:
    plain = {"helpful": Weighting(), "safe": Weighting()}
    assert combine(SCORES, plain, "weighted_sum") == pytest.approx([4.0, -1.0, -0.5])
    assert combine(SCORES, plain, "mean") == pytest.approx([2.0, -0.5, -0.25])
    assert combine(SCORES, plain, "min") == pytest.approx([1.0, -2.0, -1.0])


def test_normalize_comes_before_the_weight() -> None:
    # helpful: 2 * (s - 1) / 0.5 = 4s - 4; safe: -1 * (s + 1) / 2
    weighting = {"helpful": Weighting(weight=2.0, mean=1.0, std=0.5), "safe": Weighting(-1, -1, 2)}
    helpful = [0.0, -12.0, -2.0]
    safe = [-2.0, -1.0, 0.0]
    expected_sum = [h + s for h, s in zip(helpful, safe, strict=True)]
    assert combine(SCORES, weighting, "weighted_sum") == pytest.approx(expected_sum)
    assert combine(SCORES, weighting, "mean") == pytest.approx([v / 2 for v in expected_sum])
    assert combine(SCORES, weighting, "min") == pytest.approx([-2.0, -12.0, -2.0])
    # weight on the raw score would give another answer: the order matters
    assert Weighting(weight=2.0, mean=1.0, std=0.5).apply(3.0) == pytest.approx(8.0)


def test_one_model_is_its_weighted_normalised_score() -> None:
    weighting = {"only": Weighting(weight=3.0, mean=0.5, std=2.0)}
    assert combine({"only": [0.5, 2.5]}, weighting, "weighted_sum") == pytest.approx([0.0, 3.0])
    assert combine({"only": [0.5, 2.5]}, weighting, "min") == pytest.approx([0.0, 3.0])


def test_combine_refuses_what_cannot_be_combined() -> None:
    with pytest.raises(ValueError, match="different numbers of items"):
        combine({"a": [1.0], "b": [1.0, 2.0]}, {"a": Weighting(), "b": Weighting()}, "mean")
    with pytest.raises(ValueError, match="no model scores"):
        combine({}, {}, "mean")
    with pytest.raises(ValueError, match="unknown aggregate 'max'"):
        combine({"a": [1.0]}, {"a": Weighting()}, "max")  # type: ignore[arg-type]


def test_objectives_weigh_labels_by_name() -> None:
    labels = ["helpfulness", "safety", "verbosity"]
    weights = label_weights(labels, {"safety": 0.3, "helpfulness": 0.7})
    assert weights == [0.7, 0.3, 0.0]  # by index; a label not named weighs nothing
    assert own_score([2.0, -1.0, 5.0], 0, weights) == pytest.approx(0.7 * 2.0 - 0.3)
    with pytest.raises(ValueError, match=r"unknown label\(s\) 'honesty'.*helpfulness, safety"):
        label_weights(labels, {"honesty": 1.0})


def test_own_score_reads_the_label_without_objectives() -> None:
    assert own_score([2.0, -1.0, 5.0], 2, None) == 5.0
    assert own_score([0.25], 0, None) == 0.25
    with pytest.raises(ValueError, match="2 objective weights for 3 logits"):
        own_score([1.0, 2.0, 3.0], 0, [1.0, 1.0])
