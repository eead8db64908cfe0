"""vLLM's pooling server (protocol ``vllm``): ``POST /classify`` bodies and answers.

Texts go as ``input``; pairs and conversations as ``messages``, one conversation per
request (vLLM renders its own chat template), with ``add_special_tokens`` as
:class:`VllmSpecials` says, found once from the server's ``/tokenize``
(:data:`VLLM_PROBES`, :func:`vllm_specials`). Raw logits always: ``use_activation: false``
and its old name ``activation: false``. vLLM reports no truncation, and tokens only for a
one-item request.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from reward_client.results import ScoreResult
from reward_client.wire.base import WireRequest, chunked, number

__all__ = ["VLLM_PROBES", "VllmSpecials", "parse", "requests", "vllm_specials"]


@dataclass(frozen=True, slots=True)
class VllmSpecials:
    """How to ask vLLM to tokenize as this project's server does.

    This server adds the tokenizer's special tokens to every text and rendered conversation
    unless it starts with the BOS token; vLLM adds them to every text (even one that starts
    with BOS: a second BOS) and to no conversation (even where the template writes no BOS,
    e.g. Zephyr-style templates on Llama/Mistral tokenizers: no BOS at all). ``bos``: the
    first token the tokenizer adds (texts starting with it go with ``add_special_tokens``
    false); ``chat``: ``add_special_tokens`` for conversations. The default is vLLM's own.
    """

    bos: str | None = None
    chat: bool = False


#: Two ``/tokenize`` requests whose answers :func:`vllm_specials` reads: what the tokenizer
#: adds to an empty text, and a short conversation rendered without specials.
VLLM_PROBES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("/tokenize", {"prompt": "", "add_special_tokens": True, "return_token_strs": True}),
    (
        "/tokenize",
        {
            "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
            "add_generation_prompt": False,
            "add_special_tokens": False,
        },
    ),
)


def vllm_specials(empty: object, chat: object) -> VllmSpecials:
    """:class:`VllmSpecials` from the answers to :data:`VLLM_PROBES` (None where refused)."""
    added = empty.get("tokens") if isinstance(empty, dict) else None
    names = empty.get("token_strs") if isinstance(empty, dict) else None
    if not isinstance(added, list) or not added or not isinstance(names, list) or not names:
        return VllmSpecials()  # no specials to add (or no /tokenize): vLLM's defaults agree
    rendered = chat.get("tokens") if isinstance(chat, dict) else None
    # The template wrote the BOS itself iff the rendering starts with the first special token.
    chat_has_bos = isinstance(rendered, list) and rendered[:1] == added[:1]
    bos = names[0] if isinstance(names[0], str) and names[0] else None
    return VllmSpecials(bos=bos, chat=isinstance(rendered, list) and not chat_has_bos)


def _conversations(columns: dict[str, list[Any]]) -> list[list[dict[str, Any]]] | None:
    """Pairs as user/assistant conversations, or the conversations given (None for texts)."""
    if "conversations" in columns:
        # A {"messages", "tools"} object without tools (check() refuses tools): its messages.
        return [c["messages"] if isinstance(c, Mapping) else c for c in columns["conversations"]]
    if "queries" in columns:
        return [
            [{"role": "user", "content": q}, {"role": "assistant", "content": r}]
            for q, r in zip(columns["queries"], columns["responses"], strict=True)
        ]
    return None


def requests(
    columns: dict[str, list[Any]], size: int, truncate: bool | None, specials: VllmSpecials
) -> list[WireRequest]:
    """``/classify`` requests: texts ``size`` at a time, one per conversation or pair."""
    flags: dict[str, Any] = {"use_activation": False, "activation": False}
    if truncate:
        flags["truncate_prompt_tokens"] = -1
    conversations = _conversations(columns)
    if conversations is not None:
        if specials.chat:
            flags["add_special_tokens"] = True
        return [WireRequest("/classify", {"messages": c, **flags}, 1) for c in conversations]
    texts: list[str] = columns["texts"]
    bos = specials.bos or ""
    out: list[WireRequest] = []
    # The texts in order, in runs alike in starting with BOS: those that do get no second one.
    for has_bos, run in itertools.groupby(texts, key=lambda t: bool(bos) and t.startswith(bos)):
        body = {**flags, "add_special_tokens": False} if has_bos else flags
        out += chunked("/classify", list(run), size, _inputs_with(body))
    return out


def _inputs_with(flags: dict[str, Any]) -> Callable[[list[Any]], dict[str, Any]]:
    """The body of a ``/classify`` request of some texts, with ``flags``."""
    return lambda chunk: {"input": chunk, **flags}


def parse(payload: object, items: int) -> ScoreResult:
    """Scores of a ``/classify`` answer (the first label's raw logit); ValueError if wrong."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list) or len(data) != items:
        raise ValueError(f"'data' missing or not {items} items")
    ordered = sorted(data, key=lambda d: d.get("index", 0) if isinstance(d, dict) else 0)
    scores: list[float | None] = []
    for i, item in enumerate(ordered):
        probs = item.get("probs") if isinstance(item, dict) else None
        if not isinstance(probs, list) or not probs:
            raise ValueError(f"data[{i}].probs missing")
        scores.append(number(probs[0], f"data[{i}].probs[0]"))
    usage = payload.get("usage") if isinstance(payload, dict) else None
    tokens = [0] * items
    if items == 1 and isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
        tokens = [int(usage["prompt_tokens"])]
    return ScoreResult(scores, tokens, [False] * items)
