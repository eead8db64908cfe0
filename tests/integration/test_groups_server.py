"""Groups of items in ``/score`` and ``normalize: group`` / ``group_rank`` (issue 36, items 1
and 3), in an app with a real reward model and a real python verifier.

The combined score of each item is checked against a hand computation from the raw
component scores the same answer carries: each component normalised within its group
(population z-score; centred rank), then weighted and summed. Groups of one and groups whose
scores are all equal give 0 (no NaN). Groups that do not fit are 422s naming the problem.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from helpers.apps import models_app
from helpers.models_files import length_verifier

ROOT = Path(__file__).resolve().parents[2]

QUERIES = ["Say hi."] * 3 + ["Count."] * 3 + ["Alone."]
RESPONSES = ["Hello!", "Hi there, friend.", "Hey", "one", "two", "six", "Solo answer"]
GROUPS = [[0, 1, 2], [3, 4, 5]]  # item 6 is in none: a group of one


@pytest.fixture(scope="module")
def client(llama_rm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    folder = tmp_path_factory.mktemp("groups")
    models = [
        {"name": "rm", "model": str(llama_rm), "weight": 2.0, "normalize": "group"},
        length_verifier(weight=0.5, normalize="group_rank"),
    ]
    with TestClient(models_app(folder, models)) as c:
        yield c


def zscores(values: list[float]) -> list[float]:
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    return [0.0 if std == 0 else (v - mean) / std for v in values]


def centred_ranks(values: list[float]) -> list[float]:
    n = len(values)
    if n == 1:
        return [0.0]
    # average rank of ties, by counting: below + (equal - 1) / 2
    ranks = [sum(w < v for w in values) + (sum(w == v for w in values) - 1) / 2 for v in values]
    return [r / (n - 1) - 0.5 for r in ranks]


def by_hand(raw: list[float], groups: list[list[int]], how: Any) -> list[float]:
    out = [0.0] * len(raw)
    members = {i for g in groups for i in g}
    for group in [*groups, *([i] for i in range(len(raw)) if i not in members)]:
        for i, value in zip(group, how([raw[i] for i in group]), strict=True):
            out[i] = value
    return out


def test_components_are_normalised_within_their_group_before_the_weights(
    client: TestClient,
) -> None:
    r = client.post("/score", json={"queries": QUERIES, "responses": RESPONSES, "groups": GROUPS})
    assert r.status_code == 200, r.text
    data = r.json()
    rm, length = data["components"]["rm"], data["components"]["length"]
    # components keep the raw scores
    assert length == [float(len(t)) for t in RESPONSES]
    normed_rm, normed_length = by_hand(rm, GROUPS, zscores), by_hand(length, GROUPS, centred_ranks)
    want = [2.0 * a + 0.5 * b for a, b in zip(normed_rm, normed_length, strict=True)]
    assert data["scores"] == pytest.approx(want, abs=1e-6)
    # the group of one, and the group whose lengths are all equal (3 each): 0 there
    assert data["scores"][6] == 0.0
    assert by_hand(length, GROUPS, centred_ranks)[3:6] == [0.0, 0.0, 0.0]
    assert not any(math.isnan(s) for s in data["scores"])


def test_a_model_that_normalises_by_group_needs_groups(client: TestClient) -> None:
    r = client.post("/score", json={"queries": QUERIES, "responses": RESPONSES})
    assert r.status_code == 422 and r.json()["type"] == "bad_groups", r.text
    assert "rm" in r.json()["error"] and "groups" in r.json()["error"]
    # one model named alone gives its own raw score, groups or not
    r = client.post("/score", json={"queries": QUERIES, "responses": RESPONSES, "model": "length"})
    assert r.status_code == 422  # still a group-normalising model: its groups are needed


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ([[0, 1], [1, 2]], "item 1 is in groups[0] and [1]"),
        ([[0, 0]], "item 0 is twice"),
        ([[0, 9]], "names item 9"),
        ([[]], "groups[0] is empty"),
        ([[0, 3]], "item 3's prompt differs from item 0's"),
    ],
)
def test_groups_that_do_not_fit_are_422_naming_the_problem(
    client: TestClient, groups: list[list[int]], message: str
) -> None:
    body = {"queries": QUERIES, "responses": RESPONSES, "groups": groups}
    r = client.post("/score", json=body)
    assert r.status_code == 422, r.text
    assert message in r.json()["error"], r.json()


def test_texts_have_no_prompt_to_group_by(client: TestClient) -> None:
    r = client.post("/score", json={"texts": ["a", "b"], "groups": [[0, 1]]})
    assert r.status_code == 422 and "groups need prompts" in r.json()["error"], r.text


def test_conversations_group_by_the_messages_before_the_response(client: TestClient) -> None:
    def conv(prompt: str, response: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]

    convs = [conv("Q", "a"), conv("Q", "bbb"), conv("other", "c")]
    ok = client.post("/score", json={"conversations": convs, "groups": [[0, 1]]})
    assert ok.status_code == 200, ok.text
    bad = client.post("/score", json={"conversations": convs, "groups": [[0, 2]]})
    assert bad.status_code == 422 and "prompt differs" in bad.json()["error"], bad.text
