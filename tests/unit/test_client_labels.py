"""The clients send labels (one reference per item) with the items: chunked with them, in
order, on both faces; OpenRLHF's ``/get_reward`` carries them too; vLLM and TEI, which
have no field for them, refuse a call with labels before sending anything."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from starlette.testclient import TestClient

from reward_client import AsyncRewardClient, RewardClient
from reward_server.config import ServerSettings
from reward_server.http.app import create_app

URL = "http://rm"
TEXTS = ["a", "bb", "ccc", "dddd", "eeeee"]
LABELS: list[Any] = ["1", 2, {"tests": ["x"]}, None, [3.5, "y"]]
CHAT = [[{"role": "user", "content": t}, {"role": "assistant", "content": t}] for t in TEXTS]


class Recorder:
    """Mock transport: records each POST's path and body, answers as the protocol would."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.posts.append((request.url.path, body))
        if request.url.path == "/get_reward":
            n = len(body["query"])
            return httpx.Response(200, json={"rewards": [1.0] * n, "scores": [1.0] * n})
        n = len(next(iter(body.values())))
        return httpx.Response(
            200, json={"scores": [1.0] * n, "tokens": [1] * n, "truncated": [False] * n}
        )

    def labels(self) -> list[Any]:
        return [label for _, body in self.posts for label in body["labels"]]


def sync_client(recorder: Recorder, protocol: str = "remote-reward") -> RewardClient:
    http = httpx.Client(transport=httpx.MockTransport(recorder))
    return RewardClient(URL, http_client=http, max_client_batch=2, protocol=protocol)


def async_client(recorder: Recorder, protocol: str = "remote-reward") -> AsyncRewardClient:
    http = httpx.AsyncClient(transport=httpx.MockTransport(recorder))
    return AsyncRewardClient(URL, http_client=http, max_client_batch=2, protocol=protocol)


CALLS = {
    "score texts": lambda c: c.score(texts=TEXTS, labels=LABELS),
    "score pairs": lambda c: c.score(queries=TEXTS, responses=TEXTS, labels=LABELS),
    "score_detailed conversations": lambda c: c.score_detailed(conversations=CHAT, labels=LABELS),
    "score_pairs_detailed": lambda c: c.score_pairs_detailed(TEXTS, TEXTS, labels=LABELS),
    "reward callable": lambda c: c(TEXTS, TEXTS, labels=LABELS),
}


@pytest.mark.parametrize("call", list(CALLS))
@pytest.mark.parametrize("face", ["sync", "async"])
def test_labels_are_chunked_with_their_items(call: str, face: str) -> None:
    recorder = Recorder()
    if face == "sync":
        CALLS[call](sync_client(recorder))
    else:
        asyncio.run(CALLS[call](async_client(recorder)))
    assert [path for path, _ in recorder.posts] == ["/score"] * 3
    assert recorder.labels() == LABELS  # every chunk's labels, in input order
    for _, body in recorder.posts:
        (column, *_) = body  # the input column first, its labels beside it
        assert len(body["labels"]) == len(body[column])
        if column == "texts":
            assert [TEXTS.index(t) for t in body["texts"]] == [
                LABELS.index(x) for x in body["labels"]
            ]


def test_no_labels_no_field() -> None:
    recorder = Recorder()
    sync_client(recorder).score(texts=TEXTS)
    assert all("labels" not in body for _, body in recorder.posts)


def test_openrlhf_sends_labels_with_each_shard() -> None:
    recorder = Recorder()
    sync_client(recorder, "openrlhf").score(queries=TEXTS, responses=TEXTS, labels=LABELS)
    assert {path for path, _ in recorder.posts} == {"/get_reward"}
    assert [q for _, b in recorder.posts for q in b["query"]] == [t + t for t in TEXTS]
    assert recorder.labels() == LABELS


@pytest.mark.parametrize("protocol", ["vllm", "tei"])
@pytest.mark.parametrize("face", ["sync", "async"])
def test_protocols_without_labels_refuse_them_before_sending(protocol: str, face: str) -> None:
    recorder = Recorder()
    with pytest.raises(ValueError, match=rf"protocol '{protocol}' cannot take labels="):
        if face == "sync":
            sync_client(recorder, protocol).score(texts=TEXTS, labels=LABELS)
        else:
            asyncio.run(async_client(recorder, protocol).score(texts=TEXTS, labels=LABELS))
    assert recorder.posts == []  # not even vLLM's /tokenize probes


def test_labels_that_do_not_fit_fail_before_sending() -> None:
    recorder = Recorder()
    client = sync_client(recorder)
    with pytest.raises(ValueError, match="4 labels for 5 items"):
        client.score(texts=TEXTS, labels=LABELS[:4])
    with pytest.raises(TypeError, match="labels must be a sequence"):
        client.score(texts=TEXTS, labels="12345")
    with pytest.raises(ValueError, match="2 labels for 1 items"):
        client(["q"], ["r"], labels=["a", "b"])
    assert recorder.posts == []


def test_array_labels_go_as_json() -> None:
    recorder = Recorder()
    nested = {"inputs": np.array(["1", "2"], dtype=object), "n": (np.int32(2),)}
    labels = [np.int64(3), np.array([1.5, 2.0]), nested, np.str_("y"), None]
    sync_client(recorder).score(texts=TEXTS, labels=labels)
    assert recorder.labels() == [3, [1.5, 2.0], {"inputs": ["1", "2"], "n": [2]}, "y", None]


# ------------------------------------------------------------------------ a real server


@pytest.fixture(scope="module")
def app_client(llama_rm: Path) -> Iterator[TestClient]:
    with TestClient(create_app(ServerSettings(model=str(llama_rm))), base_url=URL) as c:
        yield c


@pytest.mark.parametrize("protocol", ["remote-reward", "openrlhf"])
def test_the_server_takes_the_labels_and_scores_alike(
    app_client: TestClient, protocol: str
) -> None:
    client = RewardClient(URL, http_client=app_client, protocol=protocol, max_client_batch=2)
    plain = client.score(queries=TEXTS, responses=TEXTS)
    assert client.score(queries=TEXTS, responses=TEXTS, labels=LABELS) == pytest.approx(plain)
    result = client.score_pairs_detailed(TEXTS, TEXTS, labels=LABELS)
    assert result.scores == pytest.approx(plain)
