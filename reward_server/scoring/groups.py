"""Groups of items: the responses of one prompt that GRPO-like trainers score together.

A request may say which of its items form a group (``groups``: lists of item indices; every
item of a group shares its prompt; an item is in at most one group; items in none are
groups of one). Two things read them: models that score within a group (a pairwise judge:
:data:`current_groups`, set by the pipeline as the deadline is), and ``normalize: group`` /
``normalize: group_rank``, which the pipeline applies to a model's own scores before the
weights (:func:`normalize_in_groups`).

Group normalisation of a model's scores ``s_i`` over the scored (unmasked) items of a group:

- ``group``: ``(s_i - mean) / std`` (population standard deviation); a group whose scores
  are all equal (a group of one among them) gives 0 for each;
- ``group_rank``: the item's rank among them (ties share their average rank, 0-based),
  centred and scaled to ``[-0.5, 0.5]``: ``rank / (n - 1) - 0.5``; a group of one gives 0.

No torch, no HTTP.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Literal, TypeAlias

__all__ = [
    "GroupNormalize",
    "Groups",
    "check_groups",
    "current_groups",
    "group_of",
    "normalize_in_groups",
]

#: Lists of item indices, each one group.
Groups: TypeAlias = tuple[tuple[int, ...], ...]
#: How a model's scores are normalised within their group.
GroupNormalize: TypeAlias = Literal["group", "group_rank"]

#: The groups of the request being scored (None: it sent none), for the served models.
current_groups: ContextVar[Groups | None] = ContextVar("reward_groups", default=None)


def check_groups(groups: Sequence[Sequence[int]], count: int) -> Groups:
    """``groups`` as tuples, or ValueError naming the problem: an empty group, an index
    outside the request's ``count`` items, an item in two groups (or twice in one)."""
    seen: dict[int, int] = {}
    for g, group in enumerate(groups):
        if not group:
            raise ValueError(f"groups[{g}] is empty")
        for index in group:
            if not 0 <= index < count:
                raise ValueError(
                    f"groups[{g}] names item {index}; the request has {count} items "
                    f"(0 to {count - 1})"
                )
            if index in seen:
                where = "twice" if seen[index] == g else f"in groups[{seen[index]}] and [{g}]"
                raise ValueError(f"item {index} is {where}: an item is in at most one group")
            seen[index] = g
    return tuple(tuple(group) for group in groups)


def group_of(groups: Groups | None, count: int) -> list[tuple[int, ...]]:
    """Every item's group, as a partition of ``range(count)``: the given groups, then each
    item in none as a group of one."""
    grouped = list(groups or ())
    member = {i for group in grouped for i in group}
    grouped.extend((i,) for i in range(count) if i not in member)
    return grouped


def normalize_in_groups(
    scores: Sequence[float],
    masked: Sequence[bool],
    groups: Groups | None,
    how: GroupNormalize,
) -> list[float]:
    """``scores`` normalised within each group (module docstring); a masked item keeps its
    value and counts in no group's statistics."""
    out = list(scores)
    for group in group_of(groups, len(scores)):
        members = [i for i in group if not masked[i]]
        values = [scores[i] for i in members]
        normed = _zscores(values) if how == "group" else _centred_ranks(values)
        for i, value in zip(members, normed, strict=True):
            out[i] = value
    return out


def _zscores(values: Sequence[float]) -> list[float]:
    n = len(values)
    if n == 0:
        return []
    mean = math.fsum(values) / n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / n)
    # All equal (a group of one too): no spread to measure, every item is average.
    if std == 0.0:
        return [0.0] * n
    return [(v - mean) / std for v in values]


def _centred_ranks(values: Sequence[float]) -> list[float]:
    n = len(values)
    if n < 2:
        return [0.0] * n
    order = sorted(range(n), key=lambda i: values[i])
    ranks = [0.0] * n
    start = 0
    while start < n:  # ties share the average of the ranks they span
        end = start
        while end + 1 < n and values[order[end + 1]] == values[order[start]]:
            end += 1
        for k in range(start, end + 1):
            ranks[order[k]] = (start + end) / 2
        start = end + 1
    return [r / (n - 1) - 0.5 for r in ranks]
