"""Agent trajectories and their independent scoring, shared by the tests of both engines
(``tests/integration/test_agents_server.py``: transformers; ``tests/e2e/test_vllm_agents.py``:
vLLM).

The trajectories hold tool calls (arguments as JSON strings and as objects, parallel calls),
tool results, tools and thinking (``<think>`` blocks and ``reasoning_content``). The
reference renders each one with the chat template itself (:func:`by_hand` writes out what
the template should get: content null as "", arguments as objects, the thinking removed) and
runs one unpadded float32 forward pass per text (:func:`reference`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def call(name: str, arguments: Any, id_: str = "call00001") -> dict[str, Any]:
    """An OpenAI tool call (``arguments`` a JSON string or an object, as sent)."""
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


def trajectory(city: str, *, as_string: bool = True, answer: str = "It is 18C.") -> list[dict]:
    """user -> assistant calling get_weather (content null) -> tool result -> answer."""
    arguments: Any = {"city": city}
    return [
        {"role": "system", "content": "You are a weather bot."},
        {"role": "user", "content": f"What is the weather in {city}?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [call("get_weather", json.dumps(arguments) if as_string else arguments)],
        },
        {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "18C"},
        {"role": "assistant", "content": answer},
    ]


def thinking(city: str) -> list[dict]:
    """:func:`trajectory` with thinking: reasoning_content on the call's turn, a <think>
    block before the answer (one call per turn, as every template here renders)."""
    out = trajectory(city, answer="<think>\nthe tool said 18C\n</think>\n\nIt is 18C.")
    out[2]["reasoning_content"] = "I should call the tool."
    return out


def parallel() -> list[dict]:
    """Two calls in one assistant turn, two results, an answer with its thinking as a block
    and as reasoning_content."""
    return [
        {"role": "user", "content": "Weather and time in Rome?"},
        {
            "role": "assistant",
            "content": "<think>two tools</think>Checking.",
            "tool_calls": [
                call("get_weather", '{"city": "Rome", "unit": "C"}', "call00001"),
                call("get_time", {"city": "Rome"}, "call00002"),
            ],
        },
        {"role": "tool", "tool_call_id": "call00001", "content": "21C"},
        {"role": "tool", "tool_call_id": "call00002", "content": "14:05"},
        {
            "role": "assistant",
            "content": "<think>\nsum it up\n</think>\n\n21C at 14:05.",
            "reasoning_content": "also this",
        },
    ]


def trajectories(family: str) -> list[list[dict]]:
    """The trajectories scored against :func:`reference` for a tool-use template: Paris and
    London differ in one argument only (sent as a string and as an object); parallel calls
    where the template takes them (Llama 3.1's refuses more than one call in a turn)."""
    out = [trajectory("Paris"), trajectory("London", as_string=False), thinking("Berlin")]
    if family != "llama31":
        out.append(parallel())
    return out


def variants() -> list[dict[str, Any]]:
    """Items that each differ from the first in one thing: a tool result, one argument, one
    more tool offered, no tools."""
    base = trajectory("Paris")
    other_result = copy.deepcopy(base)
    other_result[3]["content"] = "19C"
    other_unit = copy.deepcopy(base)
    other_unit[2]["tool_calls"][0]["function"]["arguments"] = '{"city": "Paris", "unit": "F"}'
    return [
        {"messages": base, "tools": [WEATHER]},
        {"messages": other_result, "tools": [WEATHER]},
        {"messages": other_unit, "tools": [WEATHER]},
        {"messages": base, "tools": [WEATHER, TIME]},
        {"messages": base},
    ]


def by_hand(conversation: list[dict]) -> list[dict]:
    """The conversation as the template should get it, written out independently: content
    null as "", arguments as objects, the thinking (blocks and reasoning_content) removed."""
    out = copy.deepcopy(conversation)
    for message in out:
        message.pop("reasoning_content", None)
        content = message.get("content") or ""
        if message["role"] == "assistant" and "</think>" in content:
            content = content.split("</think>", 1)[1].lstrip()
        message["content"] = content
        for c in message.get("tool_calls", []):
            if isinstance(c["function"]["arguments"], str):
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
    return out


@torch.inference_mode()
def reference(folder: Path, texts: Sequence[str]) -> list[float]:
    """Float32, one unpadded text at a time, the head at the last token (BOS rule as the
    server's: no special tokens added to a text that starts with BOS)."""
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    out = []
    for text in texts:
        add = not text.startswith(tok.bos_token)
        ids = torch.tensor([tok(text, add_special_tokens=add)["input_ids"]])
        hidden = model.model(input_ids=ids).last_hidden_state  # (1, T, H)
        out.append(float(model.score(hidden[0, -1])[0]))
    return out


def rendered(
    folder: Path,
    conversations: Sequence[list[dict]],
    tools: Any = None,
    chat_template: str | None = None,
) -> list[str]:
    """Each conversation rendered by transformers' ``apply_chat_template`` with the folder's
    tokenizer and its template (or ``chat_template``)."""
    tok = AutoTokenizer.from_pretrained(folder)
    return [
        tok.apply_chat_template(c, tools=tools, chat_template=chat_template, tokenize=False)
        for c in conversations
    ]


def longer(folder: Path, limit: int = 2048) -> Path:
    """The saved model's position and tokenizer limits raised to ``limit`` (tools written
    out as JSON make long texts for a tokenizer this small; Llama's rotary positions have no
    table to outgrow)."""
    for name, key in (
        ("config.json", "max_position_embeddings"),
        ("tokenizer_config.json", "model_max_length"),
    ):
        path = folder / name
        data = json.loads(path.read_text())
        data[key] = limit
        path.write_text(json.dumps(data))
    return folder
