"""vLLM's and TEI's shapes on this server: same numbers as /score, activation rules, errors in
each protocol's shape, verl's request (vLLM's bodies checked field for field against the
installed vLLM's own response models: test_protocols_server_vllm.py)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from helpers.posting import post
from helpers.protocols import TEXTS

import tiny_models
from reward_server.config import ServerSettings
from reward_server.http.app import create_app

ATOL = 1e-6

#: The keys of vLLM's ErrorResponse.error (checked against vLLM's own model below).
VLLM_ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def three_labels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    path = tiny_models.save_llama_reward_model(tmp_path_factory.mktemp("rm3"), num_labels=3)
    with TestClient(create_app(ServerSettings(model=str(path), label_index=1))) as c:
        yield c


def raw_numbers(gpt2_app: TestClient) -> dict[str, list[list[float]]]:
    """Every label's raw logit per text through each endpoint."""
    out = {
        f"{path} {flag}": [
            d["probs"] for d in post(gpt2_app, path, {"input": TEXTS, flag: False})["data"]
        ]
        for path in ("/classify", "/v1/classify")
        for flag in ("use_activation", "activation")
    }
    pooled = post(gpt2_app, "/pooling", {"input": TEXTS, "use_activation": False})["data"]
    out["/pooling"] = [d["data"] for d in pooled]
    predicted = post(gpt2_app, "/predict", {"inputs": [[t] for t in TEXTS], "raw_scores": True})
    out["/predict"] = [
        [p["score"] for p in sorted(ps, key=lambda p: p["label"])] for ps in predicted
    ]
    return out


def test_every_protocol_gives_the_score_of_score(gpt2_app: TestClient) -> None:
    scores = post(gpt2_app, "/score", {"texts": TEXTS})["scores"]
    for name, rows in raw_numbers(gpt2_app).items():
        assert [len(r) for r in rows] == [1] * len(TEXTS), name
        assert [r[0] for r in rows] == pytest.approx(scores, abs=ATOL), name


def test_several_labels_raw_match_score_and_activation_is_softmax(three_labels: TestClient) -> None:
    scores = post(three_labels, "/score", {"texts": TEXTS})["scores"]  # label_index 1
    for name, rows in raw_numbers(three_labels).items():
        assert [len(r) for r in rows] == [3] * len(TEXTS), name
        assert [r[1] for r in rows] == pytest.approx(scores, abs=ATOL), name
    raw = raw_numbers(three_labels)["/classify use_activation"]
    answer = post(three_labels, "/classify", {"input": TEXTS})
    for row, item in zip(raw, answer["data"], strict=True):
        exps = [math.exp(v) for v in row]
        assert item["probs"] == pytest.approx([e / sum(exps) for e in exps], abs=ATOL)
        assert item["num_classes"] == 3
        assert item["label"] == f"LABEL_{max(range(3), key=row.__getitem__)}"
    tei = post(three_labels, "/predict", {"inputs": TEXTS[0]})
    assert [p["score"] for p in tei] == sorted((p["score"] for p in tei), reverse=True)
    assert sum(p["score"] for p in tei) == pytest.approx(1.0)


def test_one_label_activation_is_sigmoid(gpt2_app: TestClient) -> None:
    scores = post(gpt2_app, "/score", {"texts": TEXTS})["scores"]
    sigmoid = [1 / (1 + math.exp(-s)) for s in scores]
    for path in ("/classify", "/pooling"):
        data = post(gpt2_app, path, {"input": TEXTS})["data"]
        got = [d["probs"][0] if "probs" in d else d["data"][0] for d in data]
        assert got == pytest.approx(sigmoid, abs=ATOL), path
    tei = post(gpt2_app, "/predict", {"inputs": [[t] for t in TEXTS]})
    assert [ps[0]["score"] for ps in tei] == pytest.approx(sigmoid, abs=ATOL)


def test_verl_request_reads_the_raw_logit(gpt2_app: TestClient) -> None:
    # verl's reward loop: {"model", "input", "activation": false}, reads data[-1].probs[-1].
    model = gpt2_app.get("/v1/models").json()["data"][0]["id"]
    answer = post(gpt2_app, "/classify", {"model": model, "input": TEXTS[0], "activation": False})
    score = post(gpt2_app, "/score", {"texts": [TEXTS[0]]})["scores"][0]
    assert answer["data"][-1]["probs"][-1] == pytest.approx(score, abs=ATOL)


def test_messages_are_one_conversation_rendered_like_score(llama_rm: Path) -> None:
    conversation = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello!"}]
    with TestClient(create_app(ServerSettings(model=str(llama_rm)))) as c:
        score = post(c, "/score", {"conversations": [conversation]})["scores"][0]
        answer = post(c, "/classify", {"messages": conversation, "use_activation": False})
        assert [d["probs"][0] for d in answer["data"]] == pytest.approx([score], abs=ATOL)
        pair = post(c, "/score", {"queries": ["Hi?"], "responses": ["Hello!"]})["scores"][0]
        tei = post(c, "/predict", {"inputs": ["Hi?", "Hello!"], "raw_scores": True})
        assert tei[0]["score"] == pytest.approx(pair, abs=ATOL)  # one pair: a flat list


def test_tei_single_and_batch_shapes(gpt2_app: TestClient) -> None:
    single = post(gpt2_app, "/predict", {"inputs": TEXTS[0], "raw_scores": True})
    assert isinstance(single, list) and set(single[0]) == {"score", "label"}
    batch = post(gpt2_app, "/predict", {"inputs": [[TEXTS[0]], [TEXTS[1]]], "raw_scores": True})
    assert len(batch) == 2 and all(isinstance(b, list) for b in batch)
    assert batch[0][0]["label"] == single[0]["label"] == "LABEL_0"
    assert batch[0][0]["score"] == pytest.approx(single[0]["score"], abs=1e-5)


def test_truncation_is_reported_and_truncate_prompt_tokens_cuts(gpt2_app: TestClient) -> None:
    long = "word " * 2000
    r = gpt2_app.post("/classify", json={"input": [long, "short"], "use_activation": False})
    assert r.status_code == 200 and r.headers["x-reward-truncated"] == "1,0"
    r = gpt2_app.post("/classify", json={"input": [long], "truncate_prompt_tokens": 5})
    assert r.json()["usage"]["prompt_tokens"] == 5
    r = gpt2_app.post("/predict", json={"inputs": long, "truncate": False})
    assert r.status_code == 413 and set(r.json()) == {"error", "error_type"}


@pytest.mark.parametrize(
    ("path", "body", "status"),
    [
        ("/classify", {"input": [1, 2, 3]}, 422),
        ("/classify", {}, 422),
        ("/classify", {"input": "a", "messages": [{"role": "user", "content": "b"}]}, 422),
        ("/pooling", {"input": [], "use_activation": False}, 422),
        ("/v1/classify", {"input": ["a"], "truncate_prompt_tokens": -2}, 422),
        ("/predict", {"inputs": ["a", "b", "c"]}, 422),
        ("/predict", {"inputs": []}, 422),
        ("/predict", {"inputs": [["a"], "b"]}, 422),
    ],
)
def test_malformed_requests_answer_in_the_protocols_shape(
    gpt2_app: TestClient, path: str, body: dict[str, Any], status: int
) -> None:
    r = gpt2_app.post(path, json=body)
    assert r.status_code == status, r.text
    answer = r.json()
    if path == "/predict":
        assert set(answer) == {"error", "error_type"} and answer["error_type"] == "Validation"
    else:
        assert set(answer) == {"error"} and set(answer["error"]) == VLLM_ERROR_KEYS
        assert answer["error"]["code"] == status and answer["error"]["message"]
        assert answer["error"]["type"] == "UnprocessableEntityError"


def test_metrics_count_each_endpoint(gpt2_app: TestClient) -> None:
    post(gpt2_app, "/v1/classify", {"input": ["a"]})
    post(gpt2_app, "/predict", {"inputs": "a"})
    text = gpt2_app.get("/metrics").text
    for endpoint in ("/classify", "/v1/classify", "/pooling", "/predict"):
        assert f'reward_server_items_total{{endpoint="{endpoint}"}}' in text, endpoint
