"""The verl and OpenRLHF adapters send groups: verl's batch function groups items by the group
key in their ``extra_info`` (``uid``, else ``index``) and prompt; OpenRLHF's ``reward_func``
groups consecutive samples of one prompt (sent as pairs then); each can be turned off."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from reward_client.integrations import openrlhf
from reward_client.integrations import verl as adapter

URL = "http://rm.test"
CHAT = [{"role": "user", "content": "2+2?"}]


class Recorder:
    """Mock ``/score``: records each body, every item scores 1."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        n = len(next(iter(body.values())))
        return httpx.Response(
            200, json={"scores": [1.0] * n, "tokens": [1] * n, "truncated": [False] * n}
        )


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("REWARD_URL", "REWARD_GROUPS", "REWARD_GROUP_KEY", "REWARD_PROMPT_KEY"):
        monkeypatch.delenv(name, raising=False)
    yield
    adapter.close_clients()
    openrlhf.close_clients()


def options(recorder: Recorder, **more: Any) -> dict[str, Any]:
    http = httpx.Client(transport=httpx.MockTransport(recorder))
    return {"http_client": http, "max_client_batch": 16, **more}


def verl_batch(recorder: Recorder, extra_infos: list[Any], **kwargs: Any) -> None:
    n = len(extra_infos)
    adapter.compute_score_batch(
        ["hh"] * n,
        [f"r{i}" for i in range(n)],
        [None] * n,
        np.array(extra_infos, dtype=object),
        reward_url=URL,
        reward_client_options=options(recorder),
        **kwargs,
    )


def test_verl_groups_by_uid_then_index_and_prompt() -> None:
    recorder = Recorder()
    infos = [
        {"prompt": CHAT, "uid": "u1", "index": 9},
        {"prompt": "q", "index": np.int64(4)},
        {"prompt": CHAT, "uid": "u1", "index": 9},
        {"prompt": "q", "index": np.int64(4)},
        {"prompt": "other", "index": np.int64(4)},  # same key, another prompt: no group
        {"prompt": CHAT, "uid": "u2"},
        {"index": 4},  # no prompt: a text, never grouped
    ]
    verl_batch(recorder, infos)
    groups = {next(iter(b)): b.get("groups") for b in recorder.bodies}
    # Per input form: conversations are items 0, 2, 5; queries 1, 3, 4; the text alone.
    assert groups == {"conversations": [[0, 1]], "queries": [[0, 1]], "texts": None}


def test_verl_group_key_and_turning_groups_off() -> None:
    infos = [{"prompt": "q", "run": 1, "index": 1}, {"prompt": "q", "run": 1, "index": 2}]
    recorder = Recorder()
    verl_batch(recorder, infos, group_key="run")
    assert recorder.bodies[0]["groups"] == [[0, 1]]
    off = Recorder()
    verl_batch(off, infos, group_key="run", reward_groups=False)
    assert "groups" not in off.bodies[0]
    flagged = Recorder()  # the setting as a string, as from the environment
    same = [{"prompt": "q", "index": 1}, {"prompt": "q", "index": 1}]
    verl_batch(flagged, same, reward_groups="0")
    assert "groups" not in flagged.bodies[0]


def test_openrlhf_groups_consecutive_samples_of_one_prompt() -> None:
    recorder = Recorder()
    prompts = ["<p1>", "<p1>", "<p2>", "<p1>"]
    queries = ["<s><p1> a", "<s><p1> b", "<s><p2> c", "<s><p1> d"]
    openrlhf.reward_func(
        queries, prompts, None, reward_url=URL, reward_client_options=options(recorder)
    )
    (body,) = recorder.bodies
    assert body == {"queries": prompts, "responses": [" a", " b", " c", " d"], "groups": [[0, 1]]}


def test_openrlhf_without_groups_sends_texts() -> None:
    recorder = Recorder()
    opts = options(recorder)
    openrlhf.reward_func(["<p1> a"], ["<p1>"], None, reward_url=URL, reward_client_options=opts)
    openrlhf.reward_func(
        ["<p1> a", "<p1> b"],
        ["<p1>"] * 2,
        None,
        reward_url=URL,
        reward_client_options=opts,
        reward_groups=False,
    )
    openrlhf.reward_func(
        ["x a", "x b"], ["<p1>"] * 2, None, reward_url=URL, reward_client_options=opts
    )
    assert [list(b) for b in recorder.bodies] == [["texts"]] * 3
