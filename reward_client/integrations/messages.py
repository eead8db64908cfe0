"""Chat messages as the frameworks hand them over, made into OpenAI chat messages for the wire.

TRL, verl and OpenAI-style datasets carry messages with tool calls, tool results, thinking
and content parts. Everything that carries meaning goes to the server, which renders it
with the reward model's own chat template: ``role``, ``content``, an assistant's
``tool_calls``, a tool result's ``tool_call_id`` and ``name``, ``reasoning_content`` and
any other key, as given (numpy values, as verl's parquet columns hold them, made plain).
Content given as parts has its text parts joined (as the server joins them); a part of
another kind (an image, audio) is an error that says so, since the reward server scores
text; ``content`` None (an assistant turn that only calls tools) stays None.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from reward_client.inputs import plain_value

__all__ = [
    "completion_text",
    "content_text",
    "messages",
    "prompt_completion_inputs",
]


def content_text(content: object, where: str = "content") -> str | None:
    """Message content as text: a string as it is, None as None, the text parts of a list
    joined; ValueError naming ``where`` for a part that is not text."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, Sequence) and not hasattr(content, "tolist"):
        raise TypeError(f"{where} is a {type(content).__name__}, not text or content parts")
    parts = []
    for i, part in enumerate(plain_value(content)):
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
            parts.append(part["text"])
        else:
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise ValueError(
                f"{where}[{i}] is a content part of type {kind!r}: the reward server scores "
                "text only (text parts are joined; no other part can be scored)"
            )
    return "".join(parts)


def _message(message: object, where: str) -> dict[str, Any]:
    """One message as a plain dict, every key kept, its content as text."""
    if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
        raise TypeError(f"expected chat messages with a 'role', got {message!r} at {where}")
    out = {str(key): plain_value(value) for key, value in message.items()}
    if "content" in out:
        out["content"] = content_text(message["content"], f"{where}.content")
    return out


def messages(value: object, default_role: str) -> list[dict[str, Any]]:
    """Chat messages as plain OpenAI chat messages (module docstring); a string is one
    message of ``default_role``, a single message a list of one."""
    if isinstance(value, str):
        return [{"role": default_role, "content": value}]
    if hasattr(value, "tolist"):  # verl reads parquet columns into numpy object arrays
        value = value.tolist()
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, Sequence):
        raise TypeError(f"expected a string or a list of chat messages, got {type(value).__name__}")
    return [_message(message, f"message {i}") for i, message in enumerate(value)]


def prompt_completion_inputs(
    prompts: Sequence[object], completions: Sequence[object]
) -> dict[str, Any]:
    """The client's input form for TRL-style prompts and completions ({} for none): text
    prompts as queries and responses, message-list prompts as conversations (the prompt's
    messages, then the completion's)."""
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    if not prompts:
        return {}
    # TRL decides per batch from the first prompt whether data is conversational.
    if isinstance(prompts[0], str):
        return {
            "queries": [str(p) for p in prompts],
            "responses": [completion_text(c) for c in completions],
        }
    conversations = [
        messages(p, "user") + messages(c, "assistant")
        for p, c in zip(prompts, completions, strict=True)
    ]
    return {"conversations": conversations}


def completion_text(completion: object) -> str:
    """A plain completion, or the concatenated text contents of a message-list completion."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in messages(completion, "assistant"))
