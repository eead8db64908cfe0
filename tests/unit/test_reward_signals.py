"""The reward signals' windows and statistics (:mod:`reward_server.scoring.signals`), against
hand computations, and the items' response lengths they read."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reward_server.scoring.items import (
    Conversations,
    Pairs,
    PolicyTexts,
    Sequences,
    Texts,
    response_chars,
)
from reward_server.scoring.metrics import Metrics
from reward_server.scoring.signals import MIN_ITEMS, RewardSignals, pearson, spearman


def test_pearson_by_hand() -> None:
    x, y = [1.0, 2.0, 3.0, 4.0], [2.0, 1.0, 4.0, 3.0]
    # means 2.5 and 2.5; deviations (-1.5, -.5, .5, 1.5) and (-.5, -1.5, 1.5, .5):
    # covariance sum .75 + .75 + .75 + .75 = 3, each sum of squares 5.
    assert pearson(x, y) == pytest.approx(3 / 5)
    assert pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None  # a constant has no correlation
    assert pearson([0.1] * 10, list(range(10))) is None  # nor one whose mean rounds
    assert pearson([1.0, 2.0], [2.0, 4.0]) == 1.0


def test_spearman_averages_tied_ranks() -> None:
    # x's ranks: 1, 2.5, 2.5, 4; y's: 1, 2, 3, 4.
    x, y = [10.0, 20.0, 20.0, 30.0], [1.0, 2.0, 3.0, 4.0]
    rx, ry = [1, 2.5, 2.5, 4], [1, 2, 3, 4]
    mean = 2.5
    cov = sum((a - mean) * (b - mean) for a, b in zip(rx, ry, strict=True))
    var_x = sum((a - mean) ** 2 for a in rx)
    var_y = sum((b - mean) ** 2 for b in ry)
    assert spearman(x, y) == pytest.approx(cov / math.sqrt(var_x * var_y))
    assert spearman([3.0, 1.0, 2.0], [30.0, 10.0, 20.0]) == pytest.approx(1.0)
    assert spearman([3.0, 1.0, 2.0], [0.0, 2.0, 1.0]) == pytest.approx(-1.0)


def test_a_window_keeps_the_last_items_and_reports_correlations_from_ten() -> None:
    signals = RewardSignals(window=12)
    signals.record("t", "m", [100.0] * 5, [False] * 5, [1] * 5)  # pushed out below
    scores = [float(i) for i in range(12)]
    signals.record("t", "m", scores, [False] * 12, [10 * i for i in range(12)])
    (recent,) = signals.snapshot().recent
    assert (recent.model, recent.tenant, recent.items) == ("m", "t", 12)
    assert recent.scores is not None and recent.scores.mean == pytest.approx(5.5)
    assert recent.length_correlation == pytest.approx(1.0)
    assert recent.scores.quantiles[2] == pytest.approx(5.5)
    # Pushed past the ring's end again: still the last 12, whatever their order.
    signals.record("t", "m", [50.0, 60.0], [False] * 2, [0, 0])
    (recent,) = signals.snapshot().recent
    assert recent.items == 12 and recent.scores is not None
    assert recent.scores.mean == pytest.approx((sum(range(2, 12)) + 110) / 12)

    few = RewardSignals(window=100)
    few.record("t", "m", scores[: MIN_ITEMS - 1], [False] * 9, list(range(9)))
    (recent,) = few.snapshot().recent
    assert recent.items == MIN_ITEMS - 1 and recent.length_correlation is None


def test_masked_and_failed_shares() -> None:
    signals = RewardSignals(window=8)
    # 2 masked (None), 1 filled with on_error's number (failed, scored), 5 fine.
    scores = [None, None, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0]
    failed = [True, True, True, False, False, False, False, False]
    signals.record("t", "m", scores, failed, [1, 2, 3, 4, 5, 6, 7, 8])
    (recent,) = signals.snapshot().recent
    assert recent.masked_ratio == pytest.approx(2 / 8)
    assert recent.failed_ratio == pytest.approx(3 / 8)
    assert recent.chars is not None
    assert recent.chars.mean == pytest.approx((3 + 4 + 5 + 6 + 7 + 8) / 6)  # scored items only


def test_agreement_reads_items_both_models_scored() -> None:
    signals = RewardSignals(window=50)
    a = [float(i) for i in range(12)] + [None]
    b = [float(-i) for i in range(12)] + [7.0]
    signals.record_agreement("t", {"b": b, "a": a})
    (agreement,) = signals.snapshot().agreements
    assert (agreement.model, agreement.other, agreement.items) == ("a", "b", 12)
    assert agreement.agreement == pytest.approx(-1.0)
    signals.record_agreement("t", {"only": [1.0]})  # one model: nothing to compare
    assert len(signals.snapshot().agreements) == 1


def _families(metrics: Metrics) -> set[str]:
    return {f.name for f in text_string_to_metric_families(metrics.render().decode())}


def test_the_series_follow_the_window_setting() -> None:
    on = Metrics(reward_window=10)
    on.signals.record("t", "m", [float(i) for i in range(10)], [False] * 10, list(range(10)))
    text = on.render().decode()
    assert 'reward_server_reward_length_correlation{model="m",tenant="t"} 1.0' in text
    assert 'reward_server_reward_score{model="m",quantile="0.5",tenant="t"} 4.5' in text
    off = Metrics(reward_window=0)
    off.signals.record("t", "m", [1.0], [False], [1])
    assert not any(name.startswith("reward_server_reward_") for name in _families(off))
    assert "reward_server_reward_window_items" in _families(on)


def test_response_chars_of_every_shape() -> None:
    assert response_chars(Texts(("abc", ""))) == [3, 0]
    assert response_chars(Pairs(("question",), ("answer",))) == [6]
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert response_chars(Conversations((chat,))) == [5]
    assert response_chars(PolicyTexts(("Q: x A: yes",), prompts=("Q: x A:",))) == [4]
    assert response_chars(PolicyTexts(("whole",))) == [5]
    assert response_chars(Sequences((("only",), ("q", "resp")))) == [4, 4]
