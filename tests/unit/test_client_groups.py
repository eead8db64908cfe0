"""The clients send groups (lists of item indices) and never split one across requests:
whole groups are packed into chunks of ``max_client_batch`` items, re-indexed per request,
and the answers come back in input order, on both faces; a group larger than a request,
groups of texts, bad groups and groups for another protocol fail before anything is sent."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from reward_client import AsyncRewardClient, RewardClient
from reward_client.groups import groups_by, runs

URL = "http://rm"


class Recorder:
    """Mock ``/score``: records each body; an item scores the length of its response, and
    its component ``len`` says the same (so the breakdown's order can be checked)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        if "responses" in body:
            responses = body["responses"]
        else:
            responses = [conv[-1]["content"] for conv in body["conversations"]]
        scores = [float(len(r)) for r in responses]
        n = len(scores)
        return httpx.Response(
            200,
            json={
                "scores": scores,
                "tokens": [len(r) for r in responses],
                "truncated": [False] * n,
                "components": {"len": scores},
            },
        )

    def sent(self) -> list[tuple[list[str], list[list[int]] | None]]:
        """Each request's responses and groups."""
        return [(b["responses"], b.get("groups")) for b in self.bodies]


def make(face: str, recorder: Recorder, size: int = 4, protocol: str = "remote-reward") -> Any:
    transport = httpx.MockTransport(recorder)
    if face == "sync":
        http = httpx.Client(transport=transport)
        return RewardClient(URL, http_client=http, max_client_batch=size, protocol=protocol)
    ahttp = httpx.AsyncClient(transport=transport)
    return AsyncRewardClient(URL, http_client=ahttp, max_client_batch=size, protocol=protocol)


def call(client: Any, method: str = "score_detailed", **kwargs: Any) -> Any:
    out = getattr(client, method)(**kwargs)
    return asyncio.run(out) if asyncio.iscoroutine(out) else out


FACES = ["sync", "async"]
# Responses whose lengths are their positions + 1, so a score names its item.
RESPONSES = ["x" * (i + 1) for i in range(8)]


@pytest.mark.parametrize("face", FACES)
def test_groups_go_whole_into_requests_reindexed(face: str) -> None:
    recorder = Recorder()
    queries = ["p"] * 3 + ["q"] * 3 + ["r", "s"]
    groups = [[0, 1, 2], [3, 4, 5]]
    result = call(make(face, recorder), queries=queries, responses=RESPONSES, groups=groups)
    # 3 + 3 > 4: each group in its own request; item 6 (in no group) fits beside the
    # second, item 7 goes alone, with empty groups (the call has groups: a model that
    # scores within groups must not refuse it).
    assert recorder.sent() == [
        (RESPONSES[0:3], [[0, 1, 2]]),
        (RESPONSES[3:7], [[0, 1, 2]]),
        (RESPONSES[7:8], []),
    ]
    assert result.scores == [float(i + 1) for i in range(8)]


@pytest.mark.parametrize("face", FACES)
def test_interleaved_groups_come_back_in_input_order(face: str) -> None:
    recorder = Recorder()
    queries = ["p", "q"] * 4
    groups = [[0, 2, 4, 6], [1, 3, 5, 7]]
    result = call(make(face, recorder), queries=queries, responses=RESPONSES, groups=groups)
    assert recorder.sent() == [
        ([RESPONSES[i] for i in (0, 2, 4, 6)], [[0, 1, 2, 3]]),
        ([RESPONSES[i] for i in (1, 3, 5, 7)], [[0, 1, 2, 3]]),
    ]
    expected = [float(i + 1) for i in range(8)]
    assert result.scores == expected
    assert result.tokens == [i + 1 for i in range(8)]
    assert result.components == {"len": expected}


@pytest.mark.parametrize("face", FACES)
def test_small_groups_share_a_request(face: str) -> None:
    recorder = Recorder()
    queries = ["p", "p", "q", "q", "r", "r", "s", "s"]
    groups = [[0, 1], [2, 3], [4, 5], [6, 7]]
    call(make(face, recorder), queries=queries, responses=RESPONSES, groups=groups)
    assert [g for _, g in recorder.sent()] == [[[0, 1], [2, 3]], [[0, 1], [2, 3]]]


@pytest.mark.parametrize("face", FACES)
def test_conversations_and_the_reward_callable_carry_groups(face: str) -> None:
    recorder = Recorder()
    prompt = [{"role": "user", "content": "hi"}]
    call(
        make(face, recorder),
        "__call__",
        prompts=[prompt] * 4,
        responses=RESPONSES[:4],
        groups=[[0, 1, 2, 3]],
    )
    (body,) = recorder.bodies
    assert body["groups"] == [[0, 1, 2, 3]] and len(body["conversations"]) == 4


@pytest.mark.parametrize("face", FACES)
def test_a_group_larger_than_a_request_is_a_value_error(face: str) -> None:
    recorder = Recorder()
    with pytest.raises(ValueError, match=r"groups\[1\] has 5 items .* at most 4"):
        call(
            make(face, recorder),
            queries=["p"] * 2 + ["q"] * 5,
            responses=RESPONSES[:7],
            groups=[[0, 1], [2, 3, 4, 5, 6]],
        )
    assert recorder.bodies == []


@pytest.mark.parametrize(
    ("groups", "error", "match"),
    [
        ([[0, 1], [1, 2]], ValueError, r"item 1 is in groups\[0\] and \[1\]"),
        ([[0, 0]], ValueError, "item 0 is twice"),
        ([[0, 9]], ValueError, "names item 9; there are 4 items"),
        ([[]], ValueError, r"groups\[0\] is empty"),
        ([[0, "1"]], TypeError, "not an item index"),
        ([[True]], TypeError, "not an item index"),
        ("0,1", TypeError, "lists of item indices"),
        ([0, 1], TypeError, r"groups\[0\] must be a list"),
    ],
)
def test_bad_groups_fail_before_sending(groups: Any, error: type, match: str) -> None:
    recorder = Recorder()
    client = make("sync", recorder)
    with pytest.raises(error, match=match):
        client.score(queries=["p"] * 4, responses=RESPONSES[:4], groups=groups)
    assert recorder.bodies == []


def test_texts_have_no_prompt_to_group_by() -> None:
    recorder = Recorder()
    with pytest.raises(ValueError, match="groups need prompts"):
        make("sync", recorder).score(texts=["a", "b"], groups=[[0, 1]])
    assert recorder.bodies == []


@pytest.mark.parametrize("protocol", ["vllm", "tei", "openrlhf"])
def test_only_remote_reward_takes_groups(protocol: str) -> None:
    recorder = Recorder()
    client = make("sync", recorder, protocol=protocol)
    with pytest.raises(ValueError, match=f"protocol '{protocol}' cannot take groups="):
        client.score(queries=["p", "p"], responses=["a", "b"], groups=[[0, 1]])
    assert recorder.bodies == []


def test_without_groups_nothing_changes() -> None:
    recorder = Recorder()
    make("sync", recorder).score(queries=["p"] * 5, responses=RESPONSES[:5])
    assert [len(r) for r, _ in recorder.sent()] == [4, 1]
    assert all(g is None for _, g in recorder.sent())


def test_groups_by_keys_and_runs() -> None:
    assert groups_by(["a", "b", "a", None, "b", "c", None]) == [[0, 2], [1, 4]]
    assert runs(["p", "p", "q", "p", "p", "p", "r"]) == [[0, 1], [3, 4, 5]]
    assert runs([]) == [] and groups_by([]) == []


@pytest.mark.parametrize("face", FACES)
def test_request_items_is_the_server_s_max_client_batch(face: str) -> None:
    asked: list[str] = []

    def info(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        return httpx.Response(200, json={"max_client_batch": 6})

    transport = httpx.MockTransport(info)
    if face == "sync":
        client: Any = RewardClient(URL, http_client=httpx.Client(transport=transport))
    else:
        client = AsyncRewardClient(URL, http_client=httpx.AsyncClient(transport=transport))
    assert [call(client, "request_items") for _ in range(2)] == [6, 6]
    assert asked == ["/info"]  # asked once
