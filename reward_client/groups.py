"""Groups of items (GRPO's responses to one prompt): checked, made from per-item keys, and
kept whole when a call is split into requests (no I/O).

A call's ``groups`` are lists of item indices (``[[0, 1, 2, 3], [4, 5, 6, 7]]``): the items
of a group share their prompt, an item is in at most one group, and an item in none is a
group of one. Only this project's server (protocol ``remote-reward``) takes them; only
query/response pairs and conversations have a prompt to group by.

The server normalises and judges within a group, so a group must reach it in one request:
:func:`grouped_requests` packs whole groups into requests of at most ``max_client_batch``
items (in order of each group's first item), re-indexes each request's groups, and gives
the order in which the requests hold the items, which :func:`restore` undoes on the merged
result. A group larger than ``max_client_batch`` is a ValueError: no request could hold it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from reward_client.results import BREAKDOWN, ScoreResult
from reward_client.wire import remote_reward
from reward_client.wire.base import WireRequest

__all__ = ["check_groups", "cut", "grouped_requests", "groups_by", "restore", "runs"]

#: A call's groups: lists of item indices.
Groups = list[list[int]]


def check_groups(groups: object, columns: Mapping[str, list[Any]], count: int) -> Groups:
    """``groups`` as plain lists, or TypeError/ValueError naming the problem: not lists of
    ints, an empty group, an index outside the ``count`` items, an item in two groups, or
    items (``texts``) that have no prompt to group by."""
    if isinstance(groups, (str, bytes, Mapping)) or not isinstance(groups, Sequence):
        raise TypeError(f"groups must be lists of item indices, not {type(groups).__name__}")
    if "texts" in columns:
        raise ValueError(
            "groups need prompts: send queries+responses or conversations (a text has no "
            "prompt to group by)"
        )
    seen: dict[int, int] = {}
    out: Groups = []
    for g, group in enumerate(groups):
        if isinstance(group, (str, bytes, Mapping)) or not isinstance(group, Sequence):
            raise TypeError(f"groups[{g}] must be a list of item indices")
        if not group:
            raise ValueError(f"groups[{g}] is empty")
        for index in group:
            if isinstance(index, bool) or not isinstance(index, int):
                raise TypeError(f"groups[{g}] holds {index!r}, not an item index")
            if not 0 <= index < count:
                raise ValueError(f"groups[{g}] names item {index}; there are {count} items")
            if index in seen:
                where = "twice" if seen[index] == g else f"in groups[{seen[index]}] and [{g}]"
                raise ValueError(f"item {index} is {where}: an item is in at most one group")
            seen[index] = g
        out.append([int(i) for i in group])
    return out


def groups_by(keys: Sequence[Hashable | None]) -> Groups:
    """The groups of items whose keys are equal (None: in no group), in order of each
    group's first item; a key held by one item alone makes no group."""
    members: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        if key is not None:
            members.setdefault(key, []).append(i)
    return [group for group in members.values() if len(group) > 1]


def runs(keys: Sequence[object]) -> Groups:
    """The groups of consecutive items whose keys are equal (``==``; a run of one makes
    no group)."""
    out: Groups = []
    start = 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or keys[i] != keys[start]:
            if i - start > 1:
                out.append(list(range(start, i)))
            start = i
    return out


def cut(groups: Groups, size: int) -> Groups:
    """``groups`` with each group of more than ``size`` items cut into consecutive pieces
    of at most ``size``."""
    return [group[i : i + size] for group in groups for i in range(0, len(group), size)]


def _packed(groups: Groups, count: int, size: int) -> list[list[list[int]]]:
    """Every item's group (given ones, then items in none alone) packed, in order of each
    group's first item, into chunks of at most ``size`` items."""
    group_of = {i: group for group in groups for i in group}
    units: list[list[int]] = []
    for i in range(count):
        group = group_of.get(i)
        if group is None:
            units.append([i])
        elif min(group) == i:
            units.append(group)
    chunks: list[list[list[int]]] = [[]]
    filled = 0
    for unit in units:
        if len(unit) > size:
            g = groups.index(unit)
            raise ValueError(
                f"groups[{g}] has {len(unit)} items but a request holds at most {size} "
                "(max_client_batch, the server's limit): a group must go in one request"
            )
        if filled + len(unit) > size:
            chunks.append([])
            filled = 0
        chunks[-1].append(unit)
        filled += len(unit)
    return [chunk for chunk in chunks if chunk]


def grouped_requests(
    columns: dict[str, list[Any]],
    groups: Groups,
    size: int,
    truncate: bool | None,
    fields: Mapping[str, Any],
) -> tuple[list[WireRequest], list[int]]:
    """``/score`` requests of at most ``size`` items holding whole groups, each with its
    groups re-indexed, and the items' order across the requests (for :func:`restore`)."""
    count = len(next(iter(columns.values())))
    given = {i for group in groups for i in group}
    requests: list[WireRequest] = []
    order: list[int] = []
    for chunk in _packed(groups, count, size):
        items = sorted(i for unit in chunk for i in unit)
        local = {item: j for j, item in enumerate(items)}
        part = {name: [values[i] for i in items] for name, values in columns.items()}
        (request,) = remote_reward.requests(part, len(items), truncate, fields)
        request.body["groups"] = [[local[i] for i in unit] for unit in chunk if unit[0] in given]
        requests.append(request)
        order.extend(items)
    return requests, order


def restore(result: ScoreResult, order: Sequence[int]) -> ScoreResult:
    """``result``, whose item ``j`` is input item ``order[j]``, back in input order."""
    if list(order) == list(range(len(order))):
        return result
    at = [0] * len(order)
    for j, item in enumerate(order):
        at[item] = j

    def take(values: list[Any]) -> list[Any]:
        return [values[j] for j in at]

    breakdown: dict[str, Any] = {}
    for key in BREAKDOWN:
        value = getattr(result, key)
        if isinstance(value, dict):
            breakdown[key] = {name: take(column) for name, column in value.items()}
        elif value is not None:
            breakdown[key] = take(value)
    return ScoreResult(
        scores=take(result.scores),
        tokens=take(result.tokens),
        truncated=take(result.truncated),
        masked=None if result.masked is None else take(result.masked),
        **breakdown,
    )
