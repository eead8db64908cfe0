"""The clients carry agent conversations unchanged: OpenAI chat messages with tool calls,
tool results and thinking, ``{"messages", "tools"}`` objects, a call's ``tools``, and
``score_conversations`` on both faces; shapes the server would refuse fail before any
request."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest

from reward_client import AsyncRewardClient, RewardClient
from reward_client.integrations.messages import messages

URL = "http://rm"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
#: An agent's trajectory: a call with null content, its result, thinking, content parts.
TRAJECTORY = [
    {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL], "reasoning_content": "Ask."},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "18C"},
    {"role": "assistant", "content": "18C.", "extra": {"kept": True}},
]


class Recorder:
    """Mock transport: records /score bodies, answers one score per item."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        n = len(next(iter(body.values())))
        scores = [float(i) for i in range(n)]
        return httpx.Response(
            200, json={"scores": scores, "tokens": [1] * n, "truncated": [False] * n}
        )


def run(
    face: str,
    handler: Callable[[httpx.Request], httpx.Response],
    call: Callable[[Any], Any],
    **options: Any,
) -> Any:
    """``call(client)`` on a client of ``face`` (sync or async) sending to ``handler``."""
    transport = httpx.MockTransport(handler)
    options = {"max_client_batch": 2, **options}
    if face == "sync":
        with RewardClient(URL, http_client=httpx.Client(transport=transport), **options) as c:
            return call(c)

    async def go() -> Any:
        http = httpx.AsyncClient(transport=transport)
        async with AsyncRewardClient(URL, http_client=http, **options) as client:
            return await call(client)

    return asyncio.run(go())


@pytest.fixture(params=["sync", "async"])
def face(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_trajectories_and_tools_reach_every_request_unchanged(face: str) -> None:
    recorder = Recorder()
    own = {"messages": TRAJECTORY, "tools": [WEATHER, WEATHER]}
    convs = [TRAJECTORY, own, TRAJECTORY]
    scores = run(face, recorder, lambda c: c.score_conversations(convs, tools=[WEATHER]))
    assert scores == [0.0, 1.0, 0.0]
    # Chunks of two items, each with the call's tools; messages and objects as given.
    assert recorder.bodies == [
        {"conversations": [TRAJECTORY, own], "tools": [WEATHER]},
        {"conversations": [TRAJECTORY], "tools": [WEATHER]},
    ]


def test_score_conversations_takes_the_call_options(face: str) -> None:
    recorder = Recorder()
    convs = [{"messages": TRAJECTORY}, TRAJECTORY]
    result = run(
        face,
        recorder,
        lambda c: c.score_conversations(
            convs, labels=["a", "b"], truncate=False, groups=[[0, 1]], model="rm"
        ),
    )
    assert result == [0.0, 1.0]
    assert recorder.bodies == [
        {
            "conversations": convs,
            "labels": ["a", "b"],
            "truncate": False,
            "model": "rm",
            "groups": [[0, 1]],
        }
    ]


def test_score_detailed_and_pairs_take_tools(face: str) -> None:
    recorder = Recorder()

    def calls(client: Any) -> Any:
        if face == "sync":
            return [
                client.score_detailed(conversations=[TRAJECTORY], tools=[WEATHER]).scores,
                client.score(queries=["q"], responses=["r"], tools=[WEATHER]),
            ]

        async def both() -> list[Any]:
            detailed = await client.score_detailed(conversations=[TRAJECTORY], tools=[WEATHER])
            return [detailed.scores, await client.score(queries=["q"], responses=["r"], tools=[])]

        return both()

    assert run(face, recorder, calls) == [[0.0], [0.0]]
    assert recorder.bodies[0] == {"conversations": [TRAJECTORY], "tools": [WEATHER]}
    assert recorder.bodies[1]["queries"] == ["q"]
    assert recorder.bodies[1]["tools"] == ([WEATHER] if face == "sync" else [])


def test_numpy_values_are_made_plain() -> None:
    # verl reads parquet columns into numpy object arrays, nested values too.
    recorder = Recorder()
    conv = np.array(
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": None, "tool_calls": np.array([CALL], dtype=object)},
        ],
        dtype=object,
    )
    run("sync", recorder, lambda c: c.score_conversations([conv], tools=np.array([WEATHER])))
    assert recorder.bodies == [
        {
            "conversations": [
                [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": None, "tool_calls": [CALL]},
                ]
            ],
            "tools": [WEATHER],
        }
    ]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"conversations": [{"turns": TRAJECTORY}]}, TypeError, r"conversations\[0\] must be"),
        (
            {"conversations": [{"messages": TRAJECTORY, "tool": []}]},
            TypeError,
            r"optional 'tools' \(got keys \['messages', 'tool'\]\)",
        ),
        ({"conversations": ["hi"]}, TypeError, r"conversations\[0\] must be a list of messages"),
        ({"conversations": [[{"content": "x"}]]}, TypeError, r"conversations\[0\]\[0\] has no"),
        (
            {"conversations": [{"messages": TRAJECTORY, "tools": [3]}]},
            TypeError,
            r"conversations\[0\]\.tools\[0\] is a int",
        ),
        ({"conversations": [TRAJECTORY], "tools": WEATHER}, TypeError, "tools must be a list"),
        ({"texts": ["x"], "tools": [WEATHER]}, ValueError, "tools= needs conversations"),
    ],
)
def test_bad_shapes_fail_before_any_request(
    kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    recorder = Recorder()
    with pytest.raises(error, match=match):
        run("sync", recorder, lambda c: c.score(**kwargs))
    assert recorder.bodies == []


def test_other_protocols_take_messages_but_no_tools() -> None:
    posts: list[dict[str, Any]] = []

    def vllm(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/tokenize":
            return httpx.Response(404)
        posts.append(json.loads(request.content))
        return httpx.Response(200, json={"data": [{"index": 0, "probs": [0.5]}]})

    def score(client: Any, **kwargs: Any) -> Any:
        return client.score_conversations([{"messages": TRAJECTORY}], **kwargs)

    assert run("sync", vllm, score, protocol="vllm") == [0.5]
    assert posts[0]["messages"] == TRAJECTORY  # vLLM's template renders the tool calls
    with pytest.raises(ValueError, match=r"protocol 'vllm' cannot take tools="):
        run("sync", vllm, lambda c: score(c, tools=[WEATHER]), protocol="vllm")
    own = [{"messages": TRAJECTORY, "tools": [WEATHER]}]
    with pytest.raises(ValueError, match="cannot take a conversation's tools"):
        run("sync", vllm, lambda c: c.score_conversations(own), protocol="vllm")
    assert len(posts) == 1


def test_adapter_messages_keep_what_carries_meaning() -> None:
    assert messages(TRAJECTORY, "user") == [
        {"role": "system", "content": "Be brief."},
        *TRAJECTORY[1:],
    ]
    assert messages("hi", "user") == [{"role": "user", "content": "hi"}]
    assert messages(
        {"role": "assistant", "content": ["a", {"type": "text", "text": "b"}]}, "x"
    ) == [{"role": "assistant", "content": "ab"}]
    with pytest.raises(ValueError, match=r"content\[1\] is a content part of type 'input_audio'"):
        messages([{"role": "user", "content": ["a", {"type": "input_audio"}]}], "user")
    with pytest.raises(TypeError, match="with a 'role'"):
        messages([{"content": "x"}], "user")
