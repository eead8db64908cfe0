"""Chat messages as the frameworks hand them over, reduced to ``role`` and text ``content``.

TRL, verl and OpenAI-style datasets carry messages with multimodal content parts, tool
calls and other keys; the reward server renders ``{"role", "content"}`` pairs with the
reward model's chat template, so only those go over the wire.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["completion_text", "content_text", "messages"]


def content_text(content: object) -> str:
    """Message content as text; the text parts of multimodal content joined, others dropped."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return str(content)


def messages(value: object, default_role: str) -> list[dict[str, str]]:
    """Chat messages reduced to ``role`` and text ``content`` (tool calls etc. are dropped);
    a string is one message of ``default_role``."""
    if isinstance(value, str):
        return [{"role": default_role, "content": value}]
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, Sequence):
        raise TypeError(f"expected a string or a list of chat messages, got {type(value).__name__}")
    out = []
    for message in value:
        if not isinstance(message, Mapping) or "role" not in message:
            raise TypeError(f"expected chat messages with a 'role', got {message!r}")
        content = content_text(message.get("content"))
        out.append({"role": str(message["role"]), "content": content})
    return out


def completion_text(completion: object) -> str:
    """A plain completion, or the concatenated contents of a message-list completion."""
    if isinstance(completion, str):
        return completion
    return "".join(m["content"] for m in messages(completion, "assistant"))
