"""Pairwise judgements within a group, and the per-response scores made from them
(``kind: judge``, ``mode: pairwise``; the served model is
:mod:`reward_server.scoring.pairwise_model`). Plain Python: no torch, no HTTP.

Which pairs (:func:`unordered_pairs`), over a group's members ``g[0..n-1]`` in the order the
request lists them:

- ``pairs: all``: every unordered pair ``{g[a], g[b]}``, ``a < b``: ``n (n - 1) / 2`` pairs;
- ``pairs: k``: the ring pairs ``{g[a], g[(a + d) mod n]}`` for ``d = 1 .. ceil(k / 2)``,
  each once: every response meets ``2 ceil(k / 2)`` others (``k`` rounded up to even), or
  all of them when that is ``n - 1`` or more; ``n ceil(k / 2)`` pairs at most, O(n k).

Each unordered pair ``{i, j}`` (``i`` before ``j`` in the group) is judged in both orders:
``p_ij`` is the judge's probability that the first response shown is the better, and

    P(i beats j) = (p_ij + 1 - p_ji) / 2        P(j beats i) = 1 - P(i beats j)

(the judge's position bias averaged out). Per-response scores (:func:`aggregate`):

- ``win_rate``: the mean of ``P(i beats j)`` over the opponents ``j`` of ``i`` (in [0, 1]);
- ``bradley_terry``: the strengths ``theta`` that maximise

      sum over judged pairs of  P_ij log sigmoid(theta_i - theta_j)
                              + (1 - P_ij) log sigmoid(theta_j - theta_i)
      - (BT_PRIOR / 2) sum_i theta_i^2

  (a tiny L2 prior, :data:`BT_PRIOR`, so that the fit exists and is unique even when some
  ``P_ij`` is exactly 0 or 1; the pair terms cancel in the gradient's sum, so the optimum
  has ``sum theta = 0``), solved by Newton's method with a backtracking line search to a step
  below 1e-12; the score is ``theta_i``.

A judged pair whose probability is not finite is left out, and both its items are failed
(:data:`NON_FINITE`); an item with no judged pair left (a group of one among them) has no
score (:data:`NO_OPPONENT`, unless it already failed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias

__all__ = [
    "BT_PRIOR",
    "NON_FINITE",
    "NO_OPPONENT",
    "PairwiseAggregate",
    "Scores",
    "aggregate",
    "bradley_terry",
    "ordered_rows",
    "unordered_pairs",
    "win_probabilities",
]

#: How the judgements of a group make each response's score.
PairwiseAggregate: TypeAlias = Literal["win_rate", "bradley_terry"]
#: The L2 prior's weight in the Bradley-Terry fit.
BT_PRIOR = 1e-3
#: The reason of an item without an opponent (alone in its group).
NO_OPPONENT = "no_opponent"
#: The reason of an item one of whose pairs the judge gave a non-finite probability.
NON_FINITE = "non_finite"

_NEWTON_STEPS = 200
_TOLERANCE = 1e-12


def unordered_pairs(group: Sequence[int], pairs: int | Literal["all"]) -> list[tuple[int, int]]:
    """The unordered pairs of ``group`` to judge (module docstring), each as ``(i, j)`` with
    ``i`` listed before ``j`` in the group, in a deterministic order."""
    n = len(group)
    if pairs == "all" or 2 * math.ceil(pairs / 2) >= n - 1:
        return [(group[a], group[b]) for a in range(n) for b in range(a + 1, n)]
    chosen: set[tuple[int, int]] = set()
    for d in range(1, math.ceil(pairs / 2) + 1):
        for a in range(n):
            b = (a + d) % n
            chosen.add((min(a, b), max(a, b)))
    return [(group[a], group[b]) for a, b in sorted(chosen)]


def ordered_rows(pairs: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Each unordered pair in both orders: ``(i, j)`` then ``(j, i)``, the judge's rows."""
    return [row for i, j in pairs for row in ((i, j), (j, i))]


def win_probabilities(
    pairs: Sequence[tuple[int, int]], first_better: Mapping[tuple[int, int], float]
) -> dict[tuple[int, int], float]:
    """``P(i beats j) = (p_ij + 1 - p_ji) / 2`` of each pair whose two judgements are finite."""
    out = {}
    for i, j in pairs:
        p_ij, p_ji = first_better[(i, j)], first_better[(j, i)]
        if math.isfinite(p_ij) and math.isfinite(p_ji):
            out[(i, j)] = (p_ij + 1.0 - p_ji) / 2.0
    return out


@dataclass(frozen=True, slots=True)
class Scores:
    """Per item of the groups: its score, or the reason it has none."""

    scores: dict[int, float]
    failed: dict[int, str]


def aggregate(
    groups: Sequence[Sequence[int]],
    pairs: int | Literal["all"],
    first_better: Mapping[tuple[int, int], float],
    how: PairwiseAggregate,
) -> Scores:
    """Every grouped item's score from the judge's ``first_better`` probabilities of its
    group's ordered rows (module docstring)."""
    scores: dict[int, float] = {}
    failed: dict[int, str] = {}
    for group in groups:
        judged = unordered_pairs(group, pairs)
        wins = win_probabilities(judged, first_better)
        for i, j in judged:
            if (i, j) not in wins:
                failed[i] = failed[j] = NON_FINITE
        members = sorted({k for pair in wins for k in pair}, key=list(group).index)
        for k in group:
            if k not in members and k not in failed:
                failed[k] = NO_OPPONENT
        if not members:
            continue
        if how == "win_rate":
            own = _win_rates(members, wins)
        else:
            own = dict(zip(members, bradley_terry(members, wins), strict=True))
        scores.update((k, v) for k, v in own.items() if k not in failed)
    return Scores(scores, failed)


def _win_rates(members: Sequence[int], wins: Mapping[tuple[int, int], float]) -> dict[int, float]:
    total = dict.fromkeys(members, 0.0)
    count = dict.fromkeys(members, 0)
    for (i, j), p in wins.items():
        total[i] += p
        total[j] += 1.0 - p
        count[i] += 1
        count[j] += 1
    return {k: total[k] / count[k] for k in members}


def _log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def _objective(theta: Sequence[float], edges: Sequence[tuple[int, int, float]]) -> float:
    pair_terms = math.fsum(
        p * _log_sigmoid(theta[a] - theta[b]) + (1.0 - p) * _log_sigmoid(theta[b] - theta[a])
        for a, b, p in edges
    )
    return pair_terms - BT_PRIOR / 2 * math.fsum(t * t for t in theta)


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """``matrix x = rhs`` for a symmetric positive definite ``matrix`` (Cholesky)."""
    n = len(rhs)
    low = [[0.0] * n for _ in range(n)]
    for r in range(n):
        for c in range(r + 1):
            s = matrix[r][c] - math.fsum(low[r][k] * low[c][k] for k in range(c))
            low[r][c] = math.sqrt(s) if r == c else s / low[c][c]
    y = [0.0] * n
    for r in range(n):
        y[r] = (rhs[r] - math.fsum(low[r][k] * y[k] for k in range(r))) / low[r][r]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (y[r] - math.fsum(low[k][r] * x[k] for k in range(r + 1, n))) / low[r][r]
    return x


def bradley_terry(members: Sequence[int], wins: Mapping[tuple[int, int], float]) -> list[float]:
    """The Bradley-Terry strengths of ``members`` (module docstring) from their pairs'
    ``P(i beats j)``, in the order of ``members``."""
    at = {k: a for a, k in enumerate(members)}
    edges = [(at[i], at[j], p) for (i, j), p in wins.items()]
    n = len(members)
    theta = [0.0] * n
    value = _objective(theta, edges)
    for _ in range(_NEWTON_STEPS):
        grad = [-BT_PRIOR * t for t in theta]
        # The negated Hessian: positive definite (the prior's BT_PRIOR on the diagonal).
        hess = [[BT_PRIOR if r == c else 0.0 for c in range(n)] for r in range(n)]
        for a, b, p in edges:
            s = _sigmoid(theta[a] - theta[b])
            grad[a] += p - s
            grad[b] -= p - s
            w = s * (1.0 - s)
            hess[a][a] += w
            hess[b][b] += w
            hess[a][b] -= w
            hess[b][a] -= w
        step = _solve(hess, grad)
        t = 1.0
        while t >= 1e-9:
            trial = [x + t * d for x, d in zip(theta, step, strict=True)]
            trial_value = _objective(trial, edges)
            if trial_value >= value:
                break
            t /= 2
        else:
            break  # no step improves on theta: it is the optimum to float precision
        theta, value = trial, trial_value
        if max(abs(t * d) for d in step) < _TOLERANCE:
            break
    return theta
