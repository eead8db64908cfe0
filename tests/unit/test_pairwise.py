"""Pairwise judges' arithmetic (``reward_server.scoring.pairwise``) and their models-file
entry: which pairs are judged, the position-bias average, win rates, the Bradley-Terry fit
against scipy (or, without it, a plain gradient ascent written here), and failures."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from reward_server.config.models_file import ModelsFileError, parse_models_file
from reward_server.scoring.pairwise import (
    BT_PRIOR,
    NO_OPPONENT,
    NON_FINITE,
    aggregate,
    bradley_terry,
    ordered_rows,
    unordered_pairs,
)


def _random_first_better(n: int, seed: int) -> dict[tuple[int, int], float]:
    rng = random.Random(seed)
    return {(i, j): rng.random() for i in range(n) for j in range(n) if i != j}


def _independent_bt(n: int, wins: dict[tuple[int, int], float]) -> list[float]:
    """The same objective maximised independently: scipy's BFGS, else gradient ascent."""
    try:
        import numpy as np
        from scipy.optimize import minimize
    except ImportError:  # pragma: no cover - scipy is in the dev environment
        theta = [0.0] * n
        for _ in range(200_000):
            grad = [-BT_PRIOR * t for t in theta]
            for (a, b), p in wins.items():
                g = p - 1 / (1 + math.exp(theta[b] - theta[a]))
                grad[a] += g
                grad[b] -= g
            theta = [t + 0.1 * g for t, g in zip(theta, grad, strict=True)]
        return theta

    def loss(theta: np.ndarray) -> float:
        total = BT_PRIOR / 2 * float(theta @ theta)
        for (a, b), p in wins.items():
            d = theta[a] - theta[b]
            total += p * np.logaddexp(0, -d) + (1 - p) * np.logaddexp(0, d)
        return float(total)

    found = minimize(loss, np.zeros(n), method="BFGS", options={"gtol": 1e-11})
    return [float(t) for t in found.x]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_k_pairs_are_ring_neighbours_each_response_about_k_times(n: int, k: int) -> None:
    group = list(range(10, 10 + n))
    chosen = unordered_pairs(group, k)
    assert len(set(chosen)) == len(chosen) and all(i < j for i, j in chosen)
    meets = Counter(x for pair in chosen for x in pair)
    want = min(n - 1, 2 * math.ceil(k / 2))
    assert all(meets[x] == want for x in group), meets
    assert len(chosen) <= n * math.ceil(k / 2)
    if want == n - 1:
        assert chosen == unordered_pairs(group, "all")


def test_all_pairs_and_both_orders() -> None:
    assert unordered_pairs([4, 2, 7], "all") == [(4, 2), (4, 7), (2, 7)]
    assert ordered_rows([(4, 2), (2, 7)]) == [(4, 2), (2, 4), (2, 7), (7, 2)]
    assert len(unordered_pairs(list(range(8)), "all")) == 28
    assert len(unordered_pairs(list(range(8)), 2)) == 8


def test_win_rate_averages_both_orders() -> None:
    p = {(0, 1): 0.9, (1, 0): 0.3, (0, 2): 0.5, (2, 0): 0.5, (1, 2): 0.2, (2, 1): 0.6}
    made = aggregate([[0, 1, 2]], "all", p, "win_rate")
    beats01, beats02, beats12 = (0.9 + 0.7) / 2, 0.5, (0.2 + 0.4) / 2
    assert made.failed == {}
    assert made.scores[0] == pytest.approx((beats01 + beats02) / 2)
    assert made.scores[1] == pytest.approx((1 - beats01 + beats12) / 2)
    assert made.scores[2] == pytest.approx((1 - beats02 + 1 - beats12) / 2)


@pytest.mark.parametrize(("n", "seed"), [(2, 0), (4, 1), (8, 2), (8, 3)])
def test_bradley_terry_equals_an_independent_solver(n: int, seed: int) -> None:
    p = _random_first_better(n, seed)
    wins = {(i, j): (p[(i, j)] + 1 - p[(j, i)]) / 2 for i, j in unordered_pairs(range(n), "all")}
    theta = bradley_terry(list(range(n)), wins)
    assert theta == pytest.approx(_independent_bt(n, wins), abs=1e-5)
    assert abs(sum(theta)) < 1e-9  # the prior centres the strengths
    made = aggregate([list(range(n))], "all", p, "bradley_terry")
    assert [made.scores[i] for i in range(n)] == pytest.approx(theta, abs=1e-12)


def test_bradley_terry_of_certain_wins_stays_finite() -> None:
    """P = 1 everywhere (the unregularised fit has no optimum): the prior keeps it finite,
    and the order of the strengths is the order of the wins."""
    wins = {(i, j): 1.0 for i in range(4) for j in range(i + 1, 4)}
    theta = bradley_terry([0, 1, 2, 3], wins)
    assert all(math.isfinite(t) for t in theta)
    assert theta == sorted(theta, reverse=True)
    assert theta == pytest.approx(_independent_bt(4, wins), abs=1e-4)


def test_no_opponent_and_non_finite_fail_their_items_only() -> None:
    p = _random_first_better(5, 4)
    p[(3, 4)] = math.nan
    made = aggregate([[0, 1, 2], [3, 4], [5]], "all", p, "win_rate")
    assert made.failed == {3: NON_FINITE, 4: NON_FINITE, 5: NO_OPPONENT}
    assert sorted(made.scores) == [0, 1, 2]
    bt = aggregate([[0, 1, 2, 3]], "all", p, "bradley_terry")
    assert bt.failed == {} and sorted(bt.scores) == [0, 1, 2, 3]


# --------------------------------------------------------------------------- the entry


def _entry(**extra: object) -> dict[str, object]:
    return {
        "name": "pairs",
        "kind": "judge",
        "model": "/m",
        "mode": "pairwise",
        "template": "{{ prompt }} {{ response_a }} {{ response_b }}",
        "answer_tokens": ["A", "B"],
        **extra,
    }


def test_a_pairwise_entry_and_its_defaults() -> None:
    (spec,) = parse_models_file({"models": [_entry()]}).models
    assert (spec.pairs, spec.pairwise_aggregate, spec.masks) == ("all", "win_rate", True)
    (spec,) = parse_models_file(
        {"models": [_entry(pairs=2, pairwise_aggregate="bradley_terry", on_error=0.0)]}
    ).models
    assert (spec.pairs, spec.pairwise_aggregate, spec.error_score) == (2, "bradley_terry", 0.0)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"answer_tokens": None}, "mode: pairwise needs 'answer_tokens'"),
        ({"answer_tokens": ["A", "A"]}, "answer_tokens: two different, non-empty answers"),
        ({"answer_tokens": ["A", "B", "C"]}, "answer_tokens"),
        ({"pairs": 0}, "pairs: all or an integer k >= 1, not 0"),
        ({"pairs": "some"}, "pairs"),
        ({"pairs": True}, "pairs"),
        ({"pairwise_aggregate": "elo"}, "pairwise_aggregate"),
        # The old name of pairwise_aggregate (aggregate combines the models, at the top).
        ({"aggregate": "win_rate"}, "'aggregate' is now 'pairwise_aggregate'"),
        ({"score_tokens": {"A": 1, "B": 0}}, "score_tokens: only for mode: logprobs"),
        ({"score_pattern": "(x)"}, "score_pattern: only for mode: generate"),
        ({"mode": "logprobs", "score_tokens": {"A": 1, "B": 0}}, "only for mode: pairwise"),
        ({"kind": "sequence", "template": None}, "only for kind: judge"),
    ],
)
def test_bad_pairwise_entries_are_one_line_errors(extra: dict[str, object], message: str) -> None:
    entry = {k: v for k, v in _entry(**extra).items() if v is not None}
    with pytest.raises(ModelsFileError) as err:
        parse_models_file({"models": [entry]})
    assert message in str(err.value) and "\n" not in str(err.value)
