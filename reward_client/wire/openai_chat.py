"""An OpenAI-compatible chat endpoint as a judge (``POST /v1/chat/completions``): the
request body for one prompt and the score read from the reply (no I/O).

The prompt goes as the one user message; the reply's first choice's ``message.content`` is
searched with a regular expression whose first group is the score (a float). The reward
server's own judges in ``mode: generate`` read their answers with the same
:func:`parse_score`.
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["CHAT_PATH", "chat_body", "parse_score", "reply_text"]

#: Where an OpenAI-compatible server answers chat completions.
CHAT_PATH = "/v1/chat/completions"


def chat_body(
    model: str, prompt: str, *, max_tokens: int = 16, temperature: float = 0.0
) -> dict[str, Any]:
    """The body of one chat completion: ``prompt`` as the one user message."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": temperature,
    }


def reply_text(payload: object) -> str:
    """The first choice's message content; ValueError when the answer has none."""
    try:
        content = payload["choices"][0]["message"]["content"]  # type: ignore[index]
    except (KeyError, IndexError, TypeError):
        raise ValueError("expected choices[0].message.content in the answer") from None
    if content is None:
        return ""
    if not isinstance(content, str):
        raise ValueError("choices[0].message.content is not a string")
    return content


def parse_score(text: str, pattern: str | re.Pattern[str]) -> float | None:
    """The first group of the first match of ``pattern`` in ``text`` as a finite float, or
    None where nothing matches or the group is not a number."""
    match = re.search(pattern, text)
    if match is None or match.group(1) is None:
        return None
    try:
        value = float(match.group(1))
    except ValueError:
        return None
    return value if math.isfinite(value) else None
