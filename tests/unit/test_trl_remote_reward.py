"""RemoteReward (TRL reward function) against a mock transport (a stdlib HTTP server:
test_trl_remote_reward_server.py)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from helpers.mock_answers import item_score, score_answer

from reward_client import RewardServerError
from reward_client.integrations.trl import RemoteReward

URL = "http://rm:8000"
#: An OpenAI function spec, as RemoteReward(tools=...) sends it.
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city."}},
            "required": ["city"],
        },
    },
}


class Recorder:
    """Mock transport handler recording /score bodies."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        return httpx.Response(200, json=score_answer(body))


def make_reward(recorder: Recorder, **kwargs: Any) -> RemoteReward:
    http = httpx.AsyncClient(transport=httpx.MockTransport(recorder))
    return RemoteReward(URL, http_client=http, max_client_batch=3, **kwargs)


def test_plain_prompts_are_sent_as_queries_and_responses() -> None:
    recorder = Recorder()
    reward = make_reward(recorder)
    prompts = ["The movie was", "I think", "A B", "x"]
    completions = [" great", " not bad", " C", " yz"]
    logged: list[tuple[str, float]] = []
    scores = asyncio.run(
        reward(
            prompts=prompts,
            completions=completions,
            completion_ids=[[1], [2], [3], [4]],
            trainer_state=None,
            log_metric=lambda name, value: logged.append((name, value)),
            log_extra=lambda column, values: None,
            label=["a", "b", "c", "d"],
        )
    )
    assert scores == [item_score([p, c]) for p, c in zip(prompts, completions, strict=True)]
    assert all(isinstance(s, float) for s in scores)
    assert recorder.bodies == [
        {"queries": prompts[:3], "responses": completions[:3]},
        {"queries": prompts[3:], "responses": completions[3:]},
    ]
    # The fake server truncates the second item of each request: 1 of 4 here.
    assert logged == [
        ("rewards/remote_reward/truncated_frac", 0.25),
        ("rewards/remote_reward/masked_frac", 0.0),
    ]


def test_conversational_prompts_are_sent_as_conversations() -> None:
    recorder = Recorder()
    reward = make_reward(recorder)
    prompts = [
        [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "Tell me a joke"}],
    ]
    completions = [
        [{"role": "assistant", "content": "Hello!"}],
        [{"role": "assistant", "content": "No."}],
    ]
    scores = asyncio.run(reward(prompts=prompts, completions=completions))
    expected = [p + c for p, c in zip(prompts, completions, strict=True)]
    assert recorder.bodies == [{"conversations": expected}]
    assert scores == [item_score(c) for c in expected]


def test_messages_keep_tool_calls_results_and_thinking() -> None:
    """An agent's completion (GRPOTrainer(tools=...)) goes whole: tool calls, tool results,
    thinking and any other key; text parts are joined; the trainer's tools go as specs."""
    recorder = Recorder()
    reward = make_reward(recorder, truncate=False, tools=[WEATHER])
    prompts = [[{"role": "user", "content": [{"type": "text", "text": "Hi"}, "!"]}]]
    call = {"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}
    completions = [
        [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "name": "weather", "tool_call_id": "c1", "content": "18C"},
            {"role": "assistant", "content": "It is 18C.", "reasoning_content": "hmm", "x": 1},
        ]
    ]
    asyncio.run(reward(prompts=prompts, completions=completions))
    assert recorder.bodies == [
        {
            "conversations": [[{"role": "user", "content": "Hi!"}, *completions[0]]],
            "truncate": False,
            "tools": [WEATHER],
        }
    ]


def test_a_content_part_that_is_not_text_is_an_error_that_says_so() -> None:
    reward = make_reward(Recorder())
    prompts = [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Hi"}]}]]
    completions = [[{"role": "assistant", "content": "Hello"}]]
    with pytest.raises(ValueError, match=r"content\[0\] is a content part of type 'image'"):
        asyncio.run(reward(prompts=prompts, completions=completions))


def test_name_is_readable_for_trl() -> None:
    from trl.trainer.utils import get_callable_name, is_async_callable

    reward = RemoteReward(URL)
    assert reward.__name__ == "remote_reward"
    assert get_callable_name(reward) == "remote_reward"
    assert is_async_callable(reward)
    named = RemoteReward([URL, "http://rm2:8000"], name="helpfulness_rm")
    assert get_callable_name(named) == "helpfulness_rm"
    assert "helpfulness_rm" in repr(named)


def answering(code: int, error: str, **kwargs: Any) -> RemoteReward:
    """A RemoteReward whose server answers every request with ``code`` and ``error``."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(code, json={"error": error})

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return RemoteReward(URL, http_client=http, max_client_batch=2, **kwargs)


def test_server_error_propagates() -> None:
    reward = answering(422, "conversations[0]: empty")
    with pytest.raises(RewardServerError, match="HTTP 422: conversations"):
        asyncio.run(reward(prompts=["a"], completions=["b"]))


def test_empty_batch_and_length_mismatch() -> None:
    recorder = Recorder()
    reward = make_reward(recorder)
    assert asyncio.run(reward(prompts=[], completions=[])) == []
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        asyncio.run(reward(prompts=["a", "b"], completions=["c"]))
    assert recorder.bodies == []


def test_retry_timeout_is_a_budget_in_seconds() -> None:
    now = [0.0]

    async def sleep(delay: float) -> None:
        now[0] += delay

    reward = answering(503, "loading", retry_timeout=45, sleep=sleep, clock=lambda: now[0])
    assert reward.client.retry_policy.timeout == 45
    with pytest.raises(RewardServerError, match=r"gave up after 45.0 s \(retry_timeout 45 s\)"):
        asyncio.run(reward(prompts=["a"], completions=["b"]))
    assert now[0] == pytest.approx(45)
    assert RemoteReward(URL, http_client=httpx.AsyncClient()).client.retry_policy.timeout == 600


# --- labels from a dataset column -----------------------------------------------------------

#: What TRL passes besides prompts and completions: its own arguments and dataset columns.
TRL_KWARGS = {"completion_ids": [[1]] * 4, "trainer_state": None, "log_extra": None}


def test_label_key_sends_that_column_as_labels() -> None:
    recorder = Recorder()
    reward = make_reward(recorder, label_key="answer")
    prompts = ["1+1?", "2+2?", "3+3?", "4+4?"]
    completions = ["2", "4", "6", "8"]
    answers = ["2", {"value": 4}, None, ["8"]]
    scores = asyncio.run(
        reward(prompts, completions, answer=answers, source=["a"] * 4, **TRL_KWARGS)
    )
    assert len(scores) == 4
    assert (
        recorder.bodies
        == [  # chunked with their items (max_client_batch=3)
            {"queries": prompts[:3], "responses": completions[:3], "labels": answers[:3]},
            {"queries": prompts[3:], "responses": completions[3:], "labels": answers[3:]},
        ]
    )


def test_label_key_missing_from_the_columns_names_them() -> None:
    reward = make_reward(Recorder(), label_key="answer", name="math")
    with pytest.raises(ValueError, match=r"math: label_key 'answer'.*columns here: solution"):
        asyncio.run(reward(["q"], ["a"], solution=["x"], **TRL_KWARGS))


def test_components_share_the_labels_of_their_request() -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        n = len(body["queries"])
        components = {"helpful": [1.0] * n, "exact": [0.0] * n}
        return httpx.Response(
            200,
            json={**score_answer(body), "scores": [1.0] * n, "components": components},
        )

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    reward = RemoteReward(URL, http_client=http, max_client_batch=8, label_key="answer")
    funcs = reward.components(names=["helpful", "exact"])

    async def both() -> list[list[float]]:
        kwargs = {"answer": ["4", "6"], **TRL_KWARGS}
        return await asyncio.gather(*(f(["2+2", "3+3"], ["4", "5"], **kwargs) for f in funcs))

    assert asyncio.run(both()) == [[1.0, 1.0], [0.0, 0.0]]
    assert len(bodies) == 1 and bodies[0]["labels"] == ["4", "6"]
    assert bodies[0]["components"] is True


def test_completions_of_one_prompt_go_as_a_group() -> None:
    # GRPO's order: num_generations (here 2) consecutive completions per prompt; the
    # process's slice may start inside a group ("a" here).
    recorder = Recorder()
    reward = make_reward(recorder)
    prompts = ["a", "b", "b", "c", "c", "d"]
    completions = [f" {i}" for i in range(6)]
    asyncio.run(reward(prompts=prompts, completions=completions))
    assert [(b["queries"], b.get("groups")) for b in recorder.bodies] == [
        (["a", "b", "b"], [[1, 2]]),
        (["c", "c", "d"], [[0, 1]]),
    ]


def test_groups_of_conversations_and_turning_groups_off() -> None:
    prompt = [{"role": "user", "content": "Hi"}]
    completions = [[{"role": "assistant", "content": t}] for t in ("x", "y", "z")]
    recorder = Recorder()
    asyncio.run(make_reward(recorder)(prompts=[prompt] * 3, completions=completions))
    assert recorder.bodies[0]["groups"] == [[0, 1, 2]]
    off = Recorder()
    asyncio.run(make_reward(off, groups=False)(prompts=[prompt] * 3, completions=completions))
    assert "groups" not in off.bodies[0]


def test_groups_are_off_for_protocols_without_them() -> None:
    assert not make_reward(Recorder(), protocol="vllm").groups
    assert make_reward(Recorder()).groups
    with pytest.raises(ValueError, match="groups=True needs protocol remote-reward"):
        make_reward(Recorder(), protocol="tei", groups=True)


def test_a_run_longer_than_a_request_is_cut_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = Recorder()
    with caplog.at_level("WARNING", logger="reward_client.integrations.trl"):
        asyncio.run(make_reward(recorder)(prompts=["p"] * 5, completions=list("abcde")))
    assert [b["groups"] for b in recorder.bodies] == [[[0, 1, 2]], [[0, 1]]]
    assert caplog.messages == [
        "remote_reward: 5 completions of one prompt in a row, more than a request holds (3, "
        "max_client_batch): scored as groups of at most 3"
    ]


def weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: The city.
    """
    return f"18C in {city}"


def test_tools_given_as_functions_go_as_their_json_schemas() -> None:
    # TRL's tools are Python functions; the reward model sees the schemas the policy saw.
    from transformers.utils import get_json_schema

    schema = get_json_schema(weather)  # what apply_chat_template(tools=[weather]) renders
    assert schema["function"]["parameters"] == WEATHER["function"]["parameters"]
    assert make_reward(Recorder(), tools=[weather]).tools == [schema]
    assert make_reward(Recorder(), tools=[WEATHER, weather]).tools == [WEATHER, schema]
    assert make_reward(Recorder()).tools is None
    with pytest.raises(ValueError, match="tools= needs protocol remote-reward"):
        make_reward(Recorder(), protocol="vllm", tools=[weather])
    with pytest.raises(TypeError, match=r"tools\[0\] is a int"):
        make_reward(Recorder(), tools=[3])


def test_agent_turns_group_by_their_prompt() -> None:
    # The server's group shares the messages up to the last user message: an agent's own
    # turns may differ within a group.
    prompt = [{"role": "user", "content": "Weather in Oslo?"}]
    call = {"type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}}
    turns = [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "weather", "content": "18C"},
        {"role": "assistant", "content": "18C."},
    ]
    completions = [turns, [{"role": "assistant", "content": "No idea."}]]
    recorder = Recorder()
    reward = make_reward(recorder, tools=[weather])
    asyncio.run(reward(prompts=[prompt] * 2, completions=completions))
    (body,) = recorder.bodies
    assert sorted(body) == ["conversations", "groups", "tools"]
    assert body["conversations"] == [prompt + turns, prompt + completions[1]]
    assert body["groups"] == [[0, 1]]
