"""The reward client's groups against the real app: a call split into several requests (whole
groups each, re-indexed) scores as the server scores the same groups in one request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from helpers.apps import models_app
from helpers.models_files import length_verifier

from reward_client import RewardClient

ROOT = Path(__file__).resolve().parents[2]

QUERIES = ["Say hi.", "Count.", "Say hi.", "Count.", "Say hi.", "Count.", "Alone.", "Name."]
RESPONSES = ["Hello!", "one", "Hi there, friend.", "two three", "Hey", "six", "Solo", "Bo"]
GROUPS = [[0, 2, 4], [1, 3, 5], [7]]  # interleaved; item 6 in none


@pytest.fixture(scope="module")
def app(llama_rm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    folder = tmp_path_factory.mktemp("client_groups")
    models = [
        {"name": "rm", "model": str(llama_rm), "weight": 1.0, "normalize": "group"},
        length_verifier(weight=0.5, normalize="group_rank"),
    ]
    with TestClient(models_app(folder, models)) as c:
        yield c


def test_chunked_groups_score_as_one_request_does(app: TestClient) -> None:
    one = app.post("/score", json={"queries": QUERIES, "responses": RESPONSES, "groups": GROUPS})
    assert one.status_code == 200, one.text
    with RewardClient(str(app.base_url), http_client=app, max_client_batch=4) as client:
        result = client.score_detailed(queries=QUERIES, responses=RESPONSES, groups=GROUPS)
    assert result.scores == pytest.approx(one.json()["scores"], abs=1e-5)
    assert result.components is not None
    for name, raw in one.json()["components"].items():
        assert result.components[name] == pytest.approx(raw, abs=1e-5)
    # Each group's weighted z-scores and centred ranks sum to 0 within it.
    for group in GROUPS:
        assert sum(result.scores[i] for i in group) == pytest.approx(0.0, abs=1e-5)
