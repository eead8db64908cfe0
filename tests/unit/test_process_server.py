"""A process reward model behind the server (``kind: process`` in a models file): served
alone and beside a sequence model, its answers equal to the model run in process."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from helpers.apps import models_app
from helpers.posting import assert_error

import tiny_models
from reward_server.config import LoadOptions, ServerSettings
from reward_server.engines._process_reward import load
from reward_server.http.app import create_app
from reward_server.text.steps import StepOptions, StepResult

QUERIES = ["what did you think?", "and the film?"]
RESPONSES = ["it was good\n\nthe end was bad\n\nso: fine", "日本 é 🙂"]
#: Where each step of RESPONSES ends, in code points.
STEP_ENDS = [[13, 30, 38], [6]]
PAIRS = {"queries": QUERIES, "responses": RESPONSES}
ATOL = 1e-5


@pytest.fixture(scope="module")
def prm_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny process model without a chat template: pairs are joined."""
    return tiny_models.save_process_reward_model(tmp_path_factory.mktemp("prm"))


@pytest.fixture(scope="module")
def chat_prm_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_models.save_process_reward_model(
        tmp_path_factory.mktemp("chat_prm"), seed=3, chat_template=tiny_models.CHAT_TEMPLATE
    )


def serve(tmp_path: Path, entries: list[dict[str, Any]], **top: Any) -> TestClient:
    """A test client of a server of the models file with ``entries``."""
    return TestClient(models_app(tmp_path, entries, top=top))


def in_process(path: Path, steps: StepOptions = StepOptions(), **options: Any) -> list[StepResult]:
    """The pairs scored by the process model loaded here, in one pass."""
    model = load(LoadOptions(model=str(path), device="cpu", **options), steps)
    items = model.rendering.encode_pairs(QUERIES, RESPONSES, truncate=True)
    return model.score_steps(items)


def assert_steps(body: dict[str, Any], expected: list[StepResult]) -> None:
    """The answer's step fields are the in-process results."""
    assert body["step_ends"] == [r.step_ends for r in expected]
    assert body["steps_dropped"] == [r.steps_dropped for r in expected]
    for got, want in zip(body["step_scores"], expected, strict=True):
        assert got == pytest.approx(want.step_scores, abs=ATOL)


@pytest.fixture
def prm_alone(tmp_path: Path, prm_path: Path) -> Iterator[TestClient]:
    with serve(tmp_path, [{"name": "prm", "model": str(prm_path), "kind": "process"}]) as client:
        yield client


def test_a_process_model_alone_answers_its_steps(prm_alone: TestClient, prm_path: Path) -> None:
    r = prm_alone.post("/score", json=PAIRS)
    assert r.status_code == 200, r.text
    body = r.json()
    expected = in_process(prm_path)
    assert body["step_ends"] == STEP_ENDS
    assert_steps(body, expected)
    # The score is the least step score (step_aggregate: min), the model's own.
    assert body["scores"] == pytest.approx([min(s) for s in body["step_scores"]], abs=1e-12)
    assert body["scores"] == pytest.approx([r.score for r in expected], abs=ATOL)
    assert body["model"] == "prm" and body["truncated"] == [False, False]
    assert "outcome_scores" not in body and "objectives" not in body
    asked = prm_alone.post("/score", json={**PAIRS, "components": True}).json()
    assert asked["components"] == {"prm": body["scores"]}


def test_texts_to_a_process_model_are_refused_with_the_reason(prm_alone: TestClient) -> None:
    body = assert_error(
        prm_alone.post("/score", json={"texts": ["a\n\nb"]}), 422, "response_not_found"
    )
    assert "texts cannot be split into prompt and response" in body["error"]
    assert "'prm'" in body["error"]
    assert_error(prm_alone.post("/get_reward", json={"query": ["a"]}), 422, "response_not_found")


def test_info_describes_the_process_model(prm_alone: TestClient) -> None:
    info = prm_alone.get("/info").json()
    (entry,) = info["models"]
    assert entry["name"] == "prm" and entry["kind"] == "process"
    assert entry["step_separator"] == "\n\n" and entry["step_tag"] is None
    assert entry["step_aggregate"] == "min"
    assert entry["labels"] == ["LABEL_0", "LABEL_1"] and entry["label_index"] == 1
    assert info["architecture"] == "GPT2ForTokenClassification"


def test_step_tag_aggregate_and_truncation_through_the_server(
    tmp_path: Path, prm_path: Path
) -> None:
    steps = StepOptions(tag=tiny_models.STEP_TAG, aggregate="prod")
    model = load(LoadOptions(model=str(prm_path), device="cpu"), steps)
    full = model.rendering.encode_pairs(QUERIES[:1], RESPONSES[:1], truncate=True)[0]
    limit = full.positions[1]  # the first step's tag fits, the second's does not
    entry = {
        "name": "prm",
        "model": str(prm_path),
        "kind": "process",
        "step_tag": tiny_models.STEP_TAG,
        "step_aggregate": "prod",
        "max_length": limit,
        "truncation_side": "right",
    }
    with serve(tmp_path, [entry]) as client:
        r = client.post("/score", json=PAIRS)
        too_long = client.post("/score", json={**PAIRS, "truncate": False})
    assert r.status_code == 200, r.text
    body = r.json()
    expected = in_process(prm_path, steps, max_length=limit, truncation_side="right")
    assert_steps(body, expected)
    assert body["step_ends"][0] == STEP_ENDS[0][:1] and body["steps_dropped"][0] == 2
    assert body["truncated"][0] is True
    assert body["scores"] == pytest.approx([math.prod(s) for s in body["step_scores"]])
    assert_error(too_long, 413, "text_too_long")


def test_a_process_model_beside_a_sequence_model(
    tmp_path: Path, prm_path: Path, gpt2_rm: Path
) -> None:
    entries = [
        {"name": "prm", "model": str(prm_path), "kind": "process", "weight": 0.5},
        {"name": "rm", "model": str(gpt2_rm), "weight": 2.0},
    ]
    with TestClient(create_app(ServerSettings(model=str(gpt2_rm), max_wait_ms=1.0))) as one:
        alone = one.post("/score", json=PAIRS).json()["scores"]
    with serve(tmp_path, entries) as client:
        body = client.post("/score", json=PAIRS).json()
        prm_only = client.post("/score", json={**PAIRS, "model": "prm"}).json()
        rm_only = client.post("/score", json={**PAIRS, "model": "rm"}).json()
        texts = client.post("/score", json={"texts": ["a"]})
        rm_texts = client.post("/score", json={"texts": ["a"], "model": "rm"})
    expected = in_process(prm_path)
    assert body["model"] == "prm+rm"
    assert body["components"]["rm"] == pytest.approx(alone, abs=ATOL)
    assert body["components"]["prm"] == pytest.approx([r.score for r in expected], abs=ATOL)
    assert_steps(body, expected)
    # outcome: the sequence models alone, combined; scores: every model.
    assert body["outcome_scores"] == pytest.approx([2.0 * s for s in alone], abs=ATOL)
    combined = [0.5 * p + 2.0 * s for p, s in zip(body["components"]["prm"], alone, strict=True)]
    assert body["scores"] == pytest.approx(combined, abs=ATOL)
    # One model named: its own score; steps only from the process model.
    assert prm_only["scores"] == pytest.approx(body["components"]["prm"], abs=1e-12)
    assert prm_only["step_ends"] == STEP_ENDS and "outcome_scores" not in prm_only
    assert rm_only["scores"] == pytest.approx(alone, abs=ATOL) and "step_scores" not in rm_only
    assert "texts cannot be split" in assert_error(texts, 422, "response_not_found")["error"]
    assert rm_texts.status_code == 200


def test_conversations_through_the_chat_template(tmp_path: Path, chat_prm_path: Path) -> None:
    entry = {"name": "prm", "model": str(chat_prm_path), "kind": "process"}
    conversations = [
        [{"role": "user", "content": q}, {"role": "assistant", "content": r}]
        for q, r in zip(QUERIES, RESPONSES, strict=True)
    ]
    with serve(tmp_path, [entry]) as client:
        convs = client.post("/score", json={"conversations": conversations}).json()
        pairs = client.post("/score", json=PAIRS).json()
        user_last = client.post(
            "/score", json={"conversations": [[{"role": "user", "content": "hi"}]]}
        )
    assert convs["step_ends"] == STEP_ENDS
    assert_steps(convs, in_process(chat_prm_path))
    assert convs == pairs
    assert "must be the assistant's" in assert_error(user_last, 422, "response_not_found")["error"]
