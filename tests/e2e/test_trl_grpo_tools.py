"""TRL's ``GRPOTrainer(tools=...)`` rewarded by ``RemoteReward(tools=...)`` against a real
server whose reward model's chat template renders tools, tool calls and tool results: the
completions that reach the reward function are agent trajectories (a tool call, its result,
an answer), they reach the server whole with the tools' JSON schemas, and the reward TRL
logs for each step equals the server's score of those trajectories (issue 48, acceptance 5).

The policy is a tiny GPT-2 whose tokenizer carries Qwen2.5's chat template, one of those
TRL's ``add_response_schema`` knows, so TRL parses tool calls from what it generates
(:mod:`agent_models`). An
untrained policy never writes a valid tool call by chance, so the run's generation config
biases its logits (``sequence_bias``, applied by transformers' own ``generate`` inside the
trainer): after the prompt it writes a call of ``get_weather`` for the prompt's city, and
after the tool's result an answer. Each of those is one token of the tokenizer (added as a
whole, as the cities and the tool's results are), so the bias needs no more context than the
token before it. Everything else is TRL's own: parsing the call, running the tool,
appending its result, generating again, and calling the reward function.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agent_models import (
    QWEN25_TEMPLATE,
    WEATHER,
    answer_text,
    call_text,
    get_weather,
    save_policy,
)
from datasets import Dataset
from helpers.training import ScoreCapture, grpo_config, grpo_trainer
from server_proc import ServerProcess
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.chat_template_utils import qwen2_5_chat_template

from reward_client import RewardClient
from reward_client.integrations.trl import RemoteReward

PROMPTS = ["What is the weather in Paris", "Is it cold in London", "Weather in London"]
PROMPTS.append("Do I need a coat in Paris")
REWARD_KEY = "rewards/remote_reward/mean"


def agent_bias(path: Path) -> list[list[Any]]:
    """``sequence_bias`` for generate: a call after a prompt naming a city, an answer after
    the tool's result, the end of the turn after either."""
    tokenizer = AutoTokenizer.from_pretrained(path)

    def ids(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    turn = "<|im_end|>\n<|im_start|>assistant\n"
    bias: list[list[Any]] = []
    for city, result in WEATHER.items():
        call, answer = ids(call_text(city)) + ids(answer_text(city))
        bias.append([[*ids(city + turn), call], 30.0])
        bias.append([[*ids(f"{result}\n</tool_response>{turn}"), answer], 30.0])
        bias += [[[call, tokenizer.eos_token_id], 30.0], [[answer, tokenizer.eos_token_id], 30.0]]
    return bias


# tool_server: tests/conftest.py's shared server of a tiny Llama reward model whose template
# renders tool use.


@pytest.mark.timeout(600)
def test_grpo_with_tools_rewards_equal_server_scores_of_the_trajectories(
    tool_server: ServerProcess, tmp_path: Path, one_torch_thread: None
) -> None:
    assert qwen2_5_chat_template == QWEN25_TEMPLATE  # one add_response_schema recognises
    policy = save_policy(tmp_path / "policy")
    capture = ScoreCapture(strict=True)
    reward = RemoteReward(tool_server.url, http_client=capture.client(), tools=[get_weather])
    config = grpo_config(
        tmp_path / "out",
        max_completion_length=64,
        max_tool_calling_iterations=2,
        generation_kwargs={"sequence_bias": agent_bias(policy)},
    )
    trainer = grpo_trainer(
        model=AutoModelForCausalLM.from_pretrained(policy),
        reward_funcs=[reward],
        args=config,
        train_dataset=Dataset.from_dict(
            {"prompt": [[{"role": "user", "content": p}] for p in PROMPTS]}
        ),
        processing_class=AutoTokenizer.from_pretrained(policy),
        tools=[get_weather],
    )
    trainer.train()

    # One request per step, each with the tools' schemas and four whole trajectories.
    steps = [h for h in trainer.state.log_history if REWARD_KEY in h]
    assert [h["step"] for h in steps] == [1, 2] and len(capture.exchanges) == 2
    for logged, (body, answer) in zip(steps, capture.exchanges, strict=True):
        assert sorted(body) == ["conversations", "groups", "tools"]
        # The rollouts of a prompt are a group (its prompt: the messages up to the user's).
        assert body["groups"] == [[0, 1], [2, 3]]
        assert body["tools"] == reward.tools
        assert body["tools"][0]["function"]["name"] == "get_weather"
        for conversation in body["conversations"]:
            check_trajectory(conversation)
        assert answer["truncated"] == [False] * 4
        assert logged[REWARD_KEY] == pytest.approx(sum(answer["scores"]) / 4, abs=1e-5)
        assert logged["tools/call_frequency"] == 1.0
        assert logged["tools/failure_frequency"] == 0.0

    # The last step's trajectories, scored afresh through the client, give TRL's rewards.
    last = capture.exchanges[-1][0]["conversations"]
    expected = [
        [*prompt, *completion]
        for prompt, completion in zip(
            trainer._logs["prompt"], trainer._logs["completion"], strict=True
        )
    ]
    assert last == expected
    with RewardClient(tool_server.url) as client:
        rescored = client.score_conversations(expected, tools=reward.tools)
        # The call's argument reaches the reward model: another city scores differently.
        other = [swap_city(c) for c in expected]
        assert all(
            a != pytest.approx(b, abs=1e-6)
            for a, b in zip(
                rescored, client.score_conversations(other, tools=reward.tools), strict=True
            )
        )
    assert list(trainer._logs["rewards"]["remote_reward"]) == pytest.approx(rescored, abs=1e-5)


def check_trajectory(conversation: list[dict[str, Any]]) -> None:
    """A prompt naming a city, a call of get_weather for it, the tool's result, an answer."""
    user, call, result, answer = conversation
    city = next(c for c in WEATHER if c in user["content"])
    assert user["role"] == "user"
    assert call["role"] == "assistant"
    assert call["tool_calls"] == [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
    ]
    assert result == {"role": "tool", "name": "get_weather", "content": WEATHER[city]}
    assert answer == {"role": "assistant", "content": answer_text(city)}


def swap_city(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trajectory with the call's argument (only) naming the other city."""
    out = json.loads(json.dumps(conversation))
    arguments = out[1]["tool_calls"][0]["function"]["arguments"]
    arguments["city"] = next(c for c in WEATHER if c != arguments["city"])
    return out
