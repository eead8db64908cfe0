"""JSON Schema of the Responses-API items and tools that NeMo Gym's ``/verify`` reads
(:mod:`.nemo_gym`), for the OpenAPI document: exactly the rules of its ``chat_of``, so that a
rollout the schema allows has a chat form and one it refuses is a 422."""

from __future__ import annotations

from typing import Any

__all__ = ["INPUT", "ITEM", "TOOL"]

_NAME = {"type": "string", "minLength": 1}
_ARGUMENTS = {
    "type": ["string", "object"],
    "description": "The call's arguments: a JSON string (as the Responses API sends them) or an "
    "object.",
}

#: A text part of a message's content (parts of other types, images and files, are refused:
#: this server scores text).
_TEXT_PART = {
    "type": "object",
    "anyOf": [
        {
            "required": ["type", "text"],
            "properties": {
                "type": {"enum": ["input_text", "output_text", "text"]},
                "text": {"type": "string"},
            },
        },
        {
            "required": ["type", "refusal"],
            "properties": {"type": {"const": "refusal"}, "refusal": {"type": "string"}},
        },
    ],
}
_CONTENT = {
    "anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}],
    "description": "A text, or text parts (joined).",
}

_CALL = {
    "type": "object",
    "required": ["id", "function"],
    "properties": {
        "id": _NAME,
        "function": {
            "type": "object",
            "required": ["name", "arguments"],
            "properties": {"name": _NAME, "arguments": _ARGUMENTS},
        },
    },
}


def _role(roles: list[str], then: dict[str, Any]) -> dict[str, Any]:
    return {"if": {"properties": {"role": {"enum": roles}}}, "then": then}


#: A message item (``type`` message, or no type and a role): a tool result answers a call;
#: only an assistant message may leave out its content or call tools.
_MESSAGE = {
    "required": ["role"],
    "properties": {
        "type": {"const": "message"},
        "role": {"enum": ["user", "system", "developer", "assistant", "tool"]},
    },
    "allOf": [
        _role(["user", "system", "developer"], {"required": ["content"]}),
        _role(
            ["tool"],
            {"required": ["tool_call_id", "content"], "properties": {"tool_call_id": _NAME}},
        ),
        _role(
            ["user", "system", "developer", "tool"],
            {"properties": {"content": _CONTENT}},
        ),
        _role(
            ["assistant"],
            {
                "properties": {
                    "content": {"anyOf": [_CONTENT, {"type": "null"}]},
                    "tool_calls": {"anyOf": [{"type": "array", "items": _CALL}, {"type": "null"}]},
                }
            },
        ),
    ],
}

_REASONING_PARTS = {
    "anyOf": [
        {
            "type": "array",
            "items": {"type": "object", "properties": {"text": {"type": "string"}}},
        },
        {"type": "null"},
    ]
}

#: One input or output item: a message, a function call, a function call's output, or
#: reasoning (its reasoning_text content, else its summary, becomes the turn's
#: reasoning_content). Other item types (web search, computer use, MCP, ...) have no chat
#: form and are refused.
ITEM: dict[str, Any] = {
    "type": "object",
    "anyOf": [
        _MESSAGE,
        {
            "required": ["type", "name", "call_id", "arguments"],
            "properties": {
                "type": {"const": "function_call"},
                "name": _NAME,
                "call_id": _NAME,
                "arguments": _ARGUMENTS,
            },
        },
        {
            "required": ["type", "call_id", "output"],
            "properties": {
                "type": {"const": "function_call_output"},
                "call_id": _NAME,
                "output": _CONTENT,
            },
        },
        {
            "required": ["type"],
            "properties": {
                "type": {"const": "reasoning"},
                "content": _REASONING_PARTS,
                "summary": _REASONING_PARTS,
            },
        },
    ],
}

#: ``input``: a text (one user message) or items.
INPUT: dict[str, Any] = {"anyOf": [{"type": "string"}, {"type": "array", "items": ITEM}]}

#: A function tool, in the Responses API's flat form or chat's ``{type, function}``; other
#: tool types (web search, file search, MCP, ...) have no chat-template form.
TOOL: dict[str, Any] = {
    "type": "object",
    "properties": {"type": {"const": "function"}},
    "if": {"required": ["function"], "properties": {"function": {"type": "object"}}},
    "then": {"properties": {"function": {"required": ["name"], "properties": {"name": _NAME}}}},
    "else": {"required": ["name"], "properties": {"name": _NAME}},
}
