"""Groups of items (reward_server.scoring.groups): validation and normalisation within a
group, masked items left out of a group's statistics."""

from __future__ import annotations

import math

import pytest

from reward_server.scoring.groups import check_groups, group_of, normalize_in_groups


def test_group_of_adds_every_ungrouped_item_as_a_group_of_one() -> None:
    assert group_of(((2, 0),), 4) == [(2, 0), (1,), (3,)]
    assert group_of(None, 2) == [(0,), (1,)]


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([[0], [0]], "item 0 is in groups[0] and [1]"),
        ([[1, 1]], "item 1 is twice"),
        ([[3]], "names item 3; the request has 3 items"),
        ([[-1]], "names item -1"),
        ([[]], "groups[0] is empty"),
    ],
)
def test_bad_groups_name_the_problem(groups: list[list[int]], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        check_groups(groups, 3)


def test_zscores_within_each_group_and_zero_where_there_is_no_spread() -> None:
    scores = [1.0, 3.0, 5.0, 7.0, 7.0, 2.0]
    out = normalize_in_groups(scores, [False] * 6, ((0, 1), (2, 3, 4)), "group")
    assert out[:2] == [-1.0, 1.0]
    mean, std = 19 / 3, math.sqrt(((5 - 19 / 3) ** 2 + 2 * (7 - 19 / 3) ** 2) / 3)
    assert out[2:5] == pytest.approx([(v - mean) / std for v in (5.0, 7.0, 7.0)])
    assert out[5] == 0.0  # a group of one
    assert normalize_in_groups([4.0, 4.0], [False, False], ((0, 1),), "group") == [0.0, 0.0]


def test_centred_ranks_share_ties() -> None:
    out = normalize_in_groups([3.0, 1.0, 3.0, 2.0], [False] * 4, ((0, 1, 2, 3),), "group_rank")
    # ranks 0..3: 1.0 -> 0, 2.0 -> 1, the two 3.0 share (2 + 3) / 2 = 2.5; / 3 - 0.5
    assert out == pytest.approx([2.5 / 3 - 0.5, -0.5, 2.5 / 3 - 0.5, 1 / 3 - 0.5])
    assert normalize_in_groups([9.0], [False], None, "group_rank") == [0.0]


def test_masked_items_keep_their_value_and_count_in_no_statistic() -> None:
    scores = [1.0, 100.0, 3.0]
    out = normalize_in_groups(scores, [False, True, False], ((0, 1, 2),), "group")
    assert out == [-1.0, 100.0, 1.0]
