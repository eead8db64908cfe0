"""The verl reward functions score an agent's trajectory when ``extra_info`` holds one (what
``reward_client.integrations.verl_agent``'s agent loop records), against a mock transport; a
real verl agent loop and server: tests/integration/test_verl_agent.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from reward_client.integrations import verl as adapter
from reward_client.integrations import verl_agent

URL = "http://rm.test"
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
PROMPT = [{"role": "user", "content": "Weather in Paris?"}]
CALL = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
TURNS = [
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "content": "18C"},
    {"role": "assistant", "content": "18C in Paris."},
]


class Recorder:
    """Mock transport: records /score bodies, answers one score per item."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        n = len(next(iter(body.values())))
        return httpx.Response(
            200, json={"scores": [0.5] * n, "tokens": [1] * n, "truncated": [False] * n}
        )


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    yield Recorder()
    adapter.close_clients()


def options(recorder: Recorder) -> dict[str, Any]:
    http = httpx.Client(transport=httpx.MockTransport(recorder))
    return {
        "reward_url": URL,
        "reward_client_options": {"http_client": http, "max_client_batch": 8},
    }


def as_parquet(value: Any) -> Any:
    """``value`` with its lists as numpy object arrays, as verl's columns hold them."""
    if isinstance(value, list):
        out = np.empty(len(value), dtype=object)
        out[:] = [as_parquet(v) for v in value]
        return out
    if isinstance(value, dict):
        return {k: as_parquet(v) for k, v in value.items()}
    return value


def test_a_recorded_trajectory_is_scored_instead_of_the_prompt_and_response(
    recorder: Recorder,
) -> None:
    trajectory = {"messages": PROMPT + TURNS, "tools": [TOOL]}
    extra_info = {"prompt": PROMPT, "reward_trajectory": as_parquet(trajectory), "index": 0}
    score = adapter.compute_score("weather", "flat text", None, extra_info, **options(recorder))
    assert score == 0.5
    assert recorder.bodies == [{"conversations": [trajectory], "labels": [None]}]


def test_a_trajectory_of_messages_alone_and_another_key(
    recorder: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra_info = {"messages": PROMPT + TURNS}
    adapter.compute_score("w", "x", "7", extra_info, trajectory_key="messages", **options(recorder))
    monkeypatch.setenv("REWARD_TRAJECTORY_KEY", "messages")
    adapter.compute_score("w", "x", "7", extra_info, **options(recorder))
    assert [b["conversations"] for b in recorder.bodies] == [[{"messages": PROMPT + TURNS}]] * 2


def test_trajectories_group_by_their_task(recorder: Recorder) -> None:
    # Two rollouts of one prompt (index 0), whose turns differ, are a group: the server groups
    # a conversation by its messages up to the last user message, as this adapter does.
    other = [*TURNS[:-1], {"role": "assistant", "content": "another answer"}]
    first = {"reward_trajectory": {"messages": PROMPT + TURNS}, "index": 0}
    second = {"reward_trajectory": {"messages": PROMPT + other}, "index": 0}
    plain = {"prompt": PROMPT, "index": 1}
    adapter.compute_score_batch(
        ["w"] * 4,
        ["a", "b", "c", "d"],
        [None] * 4,
        [first, second, plain, plain],
        **options(recorder),
    )
    (body,) = recorder.bodies
    assert body["groups"] == [[0, 1], [2, 3]]
    assert body["conversations"][:2] == [{"messages": PROMPT + TURNS}, {"messages": PROMPT + other}]


def test_the_agent_loop_module_needs_verl_only_for_its_class() -> None:
    assert verl_agent.TRAJECTORY_KEY == "reward_trajectory"
    with pytest.raises(ModuleNotFoundError, match="verl"):
        verl_agent.TrajectoryToolAgentLoop  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'Other'"):
        verl_agent.Other  # noqa: B018


def test_the_recorded_turns_lose_special_tokens_only() -> None:
    clean = verl_agent._clean
    specials = ["<|im_end|>", "<|endoftext|>"]
    assert clean({"role": "assistant", "content": "\nHi.<|im_end|>"}, specials) == {
        "role": "assistant",
        "content": "Hi.",
    }
    call = {"role": "assistant", "content": "<|im_end|>", "tool_calls": [CALL]}
    assert clean(call, specials) == {**call, "content": ""}
    tool = {"role": "tool", "content": " 18C <|im_end|>"}
    assert clean(tool, specials) is tool
