"""Labels (one reference per item) on the server: ``/score``'s ``labels``, OpenRLHF's
``labels`` on ``/get_reward`` and slime's remote reward route ``/slime/reward``.

A real server process answers the wire shapes (slime's request is sent as slime's
``remote_rm`` sends it: aiohttp, ``json=payload``, ``raise_for_status``, the JSON answer as
the reward; slime is not on PyPI, so its function is replicated, not imported). An app in
process, its service's ``score`` wrapped to record what it is handed, shows that the labels
reach the plain-data items in order (no verifier reads them yet).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest
from fastapi.testclient import TestClient
from helpers.models_files import write_models
from server_proc import ServerProcess, metric

from reward_server.config import ServerSettings
from reward_server.http.app import create_app
from reward_server.scoring.items import Conversations, Items, Pairs, PolicyTexts, Texts

ATOL = 1e-5
QUERIES = ["What is 3 + 4?", "Name a prime.", "Say hi."]
RESPONSES = ["7", "The answer is 9.", "hello"]
#: One label of each JSON kind a verifier may need.
LABELS: list[Any] = ["7", {"tests": [{"input": "x", "output": 2}]}, None]


@pytest.fixture(scope="module")
def server(llama_server: ServerProcess) -> ServerProcess:
    """A real reward server whose model has a chat template (shared: its counts are compared
    before and after)."""
    return llama_server


def post(server: ServerProcess, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=30)


def scores(server: ServerProcess, body: dict[str, Any]) -> list[float]:
    response = post(server, "/score", body)
    assert response.status_code == 200, response.text
    return response.json()["scores"]


def slime_remote_rm(url: str, prompt: Any, response: str, label: Any) -> Any:
    """slime's ``remote_rm`` (slime/rollout/rm_hub): one sample's payload posted with
    aiohttp as JSON; a non-2xx status raises; the decoded JSON answer is the reward."""
    payload = {"prompt": prompt, "response": response, "label": label}

    async def call() -> Any:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
            session.post(url, json=payload) as resp,
        ):
            resp.raise_for_status()
            return await resp.json()

    return asyncio.run(call())


# ---------------------------------------------------------------------------- /score


def test_score_takes_labels_of_any_json_kind_and_scores_alike(server: ServerProcess) -> None:
    plain = scores(server, {"queries": QUERIES, "responses": RESPONSES})
    labelled = scores(server, {"queries": QUERIES, "responses": RESPONSES, "labels": LABELS})
    assert labelled == pytest.approx(plain, abs=ATOL)  # reward models ignore labels
    texts = [q + r for q, r in zip(QUERIES, RESPONSES, strict=True)]
    assert len(scores(server, {"texts": texts, "labels": [1, 2.5, [True]]})) == 3
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    assert len(scores(server, {"conversations": [conversation], "labels": ["yo"]})) == 1


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"queries": QUERIES, "responses": RESPONSES, "labels": LABELS[:2]}, "2 labels for 3"),
        ({"texts": ["a"], "labels": ["x", "y"]}, "2 labels for 1"),
        ({"texts": ["a"], "labels": []}, "0 labels for 1"),
        ({"texts": ["a"], "labels": "x"}, "labels"),
        ({"texts": ["a"], "labels": {"0": "x"}}, "labels"),
    ],
)
def test_labels_that_do_not_fit_are_422(
    server: ServerProcess, body: dict[str, Any], expected: str
) -> None:
    response = post(server, "/score", body)
    assert response.status_code == 422, response.text
    assert response.json()["type"] == "invalid_request"
    assert expected in response.json()["error"]


def test_labels_keep_the_strict_json_rules(server: ServerProcess) -> None:
    body = b'{"texts": ["a"], "labels": [NaN]}'
    response = httpx.post(
        f"{server.url}/score",
        content=body,
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 422, response.text
    assert "labels[0]" in response.json()["error"]


def test_get_reward_takes_openrlhfs_labels(server: ServerProcess) -> None:
    texts = [q + r for q, r in zip(QUERIES, RESPONSES, strict=True)]
    answer = post(server, "/get_reward", {"query": texts, "prompts": QUERIES, "labels": LABELS})
    assert answer.status_code == 200, answer.text
    assert answer.json()["rewards"] == pytest.approx(scores(server, {"texts": texts}), abs=ATOL)
    wrong = post(server, "/get_reward", {"query": texts, "labels": LABELS[:1]})
    assert wrong.status_code == 422
    assert "1 labels for 3 queries" in wrong.json()["error"]


# ---------------------------------------------------------------------------- slime


def test_slime_string_prompt_is_scored_as_the_pair(server: ServerProcess) -> None:
    url = f"{server.url}/slime/reward"
    ok = {"endpoint": "/slime/reward", "status": "200"}
    answered = metric(server.url, "reward_server_requests_total", **ok)
    expected = scores(server, {"queries": QUERIES, "responses": RESPONSES})
    for i, (query, response) in enumerate(zip(QUERIES, RESPONSES, strict=True)):
        reward = slime_remote_rm(url, query, response, LABELS[i])
        assert isinstance(reward, float)  # a bare JSON number: slime's reward as it reads it
        assert reward == pytest.approx(expected[i], abs=ATOL)
    counted = metric(server.url, "reward_server_requests_total", endpoint="/slime/reward")
    assert counted == 0  # counted with its status
    assert metric(server.url, "reward_server_requests_total", **ok) - answered == len(QUERIES)


def test_slime_message_prompt_is_scored_as_the_conversation(server: ServerProcess) -> None:
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": QUERIES[0]},
    ]
    conversation = [*messages, {"role": "assistant", "content": RESPONSES[0]}]
    (expected,) = scores(server, {"conversations": [conversation]})
    reward = slime_remote_rm(f"{server.url}/slime/reward", messages, RESPONSES[0], "7")
    assert reward == pytest.approx(expected, abs=ATOL)


def test_slime_body_without_label_and_with_extra_keys(server: ServerProcess) -> None:
    (expected,) = scores(server, {"queries": QUERIES[:1], "responses": RESPONSES[:1]})
    body = {"prompt": QUERIES[0], "response": RESPONSES[0], "metadata": {"rm_type": "x"}}
    answer = post(server, "/slime/reward", body)
    assert answer.status_code == 200, answer.text
    assert json.loads(answer.text) == pytest.approx(expected, abs=ATOL)
    assert answer.headers["X-Reward-Truncated"] == "0"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": "q"}, "response"),
        ({"response": "r"}, "prompt"),
        ({"prompt": 3, "response": "r"}, "prompt"),
        ({"prompt": "q", "response": ["r"]}, "response"),
        ({"prompt": [], "response": "r"}, "prompt"),
        ({"prompt": [{"role": "user"}], "response": "r"}, "content"),
        (["q", "r"], ""),
    ],
)
def test_slime_malformed_bodies_are_422(server: ServerProcess, body: Any, field: str) -> None:
    answer = post(server, "/slime/reward", body)
    assert answer.status_code == 422, answer.text
    assert answer.json()["type"] == "invalid_request"
    assert field in answer.json()["error"]


def test_slime_raises_on_a_refused_sample(server: ServerProcess) -> None:
    with pytest.raises(aiohttp.ClientResponseError) as raised:  # slime raises on non-2xx
        slime_remote_rm(f"{server.url}/slime/reward", 3, "r", None)
    assert raised.value.status == 422


def test_slime_gets_the_combined_score_and_needs_the_key(
    tmp_path: Path, bert_rm: Path, gpt2_rm: Path
) -> None:
    entries = [
        {"name": "bert", "model": str(bert_rm), "weight": 0.5},
        {"name": "gpt2", "model": str(gpt2_rm), "weight": 2.0},
    ]
    models = write_models(tmp_path, entries)
    key = {"Authorization": "Bearer k3y"}
    with TestClient(create_app(ServerSettings(models=str(models), api_key="k3y"))) as client:
        body = {"prompt": QUERIES[0], "response": RESPONSES[0], "label": "7"}
        refused = client.post("/slime/reward", json=body)
        assert refused.status_code == 401 and refused.json()["type"] == "unauthorized"
        reward = client.post("/slime/reward", json=body, headers=key)
        assert reward.status_code == 200, reward.text
        pair = {"queries": QUERIES[:1], "responses": RESPONSES[:1], "labels": ["7"]}
        (combined,) = client.post("/score", json=pair, headers=key).json()["scores"]
        assert reward.json() == pytest.approx(combined, abs=ATOL)


# ------------------------------------------------------------------- labels reach the items


@pytest.fixture(scope="module")
def recorded(llama_rm: Path) -> Iterator[tuple[TestClient, list[Items]]]:
    """An app in process whose scoring pipeline records the items each request hands it."""
    seen: list[Items] = []
    app = create_app(ServerSettings(model=str(llama_rm)))
    pipeline = app.state.pipeline
    score = pipeline.score

    async def recording(items: Items, *args: Any) -> Any:
        seen.append(items)
        return await score(items, *args)

    pipeline.score = recording
    with TestClient(app) as client:
        yield client, seen


def handed(recorded: tuple[TestClient, list[Items]], path: str, body: dict[str, Any]) -> Items:
    client, seen = recorded
    seen.clear()
    answer = client.post(path, json=body)
    assert answer.status_code == 200, answer.text
    (items,) = seen
    return items


def test_labels_reach_the_items_in_order(recorded: tuple[TestClient, list[Items]]) -> None:
    pairs = handed(
        recorded, "/score", {"queries": QUERIES, "responses": RESPONSES, "labels": LABELS}
    )
    assert isinstance(pairs, Pairs) and pairs.labels == tuple(LABELS)
    texts = handed(recorded, "/score", {"texts": QUERIES, "labels": [3, 2, 1]})
    assert isinstance(texts, Texts) and texts.labels == (3, 2, 1)
    chat = [[{"role": "user", "content": q}] for q in QUERIES]
    convs = handed(recorded, "/score", {"conversations": chat, "labels": LABELS})
    assert isinstance(convs, Conversations) and convs.labels == tuple(LABELS)
    assert handed(recorded, "/score", {"texts": QUERIES}).labels is None  # none sent
    policy = handed(recorded, "/get_reward", {"query": QUERIES, "labels": ["a", "b", "c"]})
    assert isinstance(policy, PolicyTexts) and policy.labels == ("a", "b", "c")


def test_slime_label_reaches_the_item(recorded: tuple[TestClient, list[Items]]) -> None:
    body = {"prompt": QUERIES[0], "response": RESPONSES[0], "label": LABELS[1]}
    pair = handed(recorded, "/slime/reward", body)
    assert pair == Pairs((QUERIES[0],), (RESPONSES[0],), (LABELS[1],))
    messages = [{"role": "user", "content": QUERIES[0]}]
    conv = handed(recorded, "/slime/reward", {"prompt": messages, "response": "7", "label": None})
    expected = [*messages, {"role": "assistant", "content": "7"}]
    assert conv == Conversations((expected,), (None,))  # slime's null label is a label
    unlabelled = handed(recorded, "/slime/reward", {"prompt": "q", "response": "r"})
    assert unlabelled.labels is None
