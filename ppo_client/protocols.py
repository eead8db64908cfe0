"""The reward protocols the client speaks, as request bodies and answer parsers (no I/O).

=============  ===============  ==========================================================
protocol       endpoint         texts / pairs / conversations
=============  ===============  ==========================================================
remote-reward  ``POST /score``  as they are (this server)
openrlhf       ``/get_reward``  texts; pairs joined as query + response; no conversations
vllm           ``/classify``    texts as ``input``; pairs and conversations as ``messages``,
                                one conversation per request (vLLM renders its template),
                                with ``add_special_tokens`` as :class:`VllmSpecials` says
tei            ``/predict``     texts as ``[text]``, pairs as ``[text, text_pair]``; no
                                conversations
=============  ===============  ==========================================================

Raw logits always: ``use_activation: false`` (and ``activation: false``) for vLLM,
``raw_scores: true`` for TEI. Where a protocol does not report tokens or truncation per
item, the result says 0 tokens and not truncated.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "PROTOCOLS",
    "VLLM_PROBES",
    "Parsed",
    "VllmSpecials",
    "WireRequest",
    "chunk_size",
    "detect",
    "parse",
    "requests",
    "vllm_specials",
]

#: The protocols a client can be told to speak (``auto`` finds out from the server).
PROTOCOLS = ("auto", "remote-reward", "vllm", "tei", "openrlhf")


@dataclass(frozen=True, slots=True)
class WireRequest:
    """One POST: its path, JSON body and how many items it scores."""

    path: str
    body: dict[str, Any]
    items: int


@dataclass(frozen=True, slots=True)
class Parsed:
    """Per-item scores, token counts and truncation flags of one answer."""

    scores: list[float]
    tokens: list[int]
    truncated: list[bool]


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


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{what} is {value!r}, not a finite number")
    return float(value)


def _split(columns: dict[str, list[Any]], size: int) -> list[dict[str, list[Any]]]:
    n = len(next(iter(columns.values())))
    return [{k: v[i : i + size] for k, v in columns.items()} for i in range(0, n, size)]


def _pair_conversations(columns: dict[str, list[Any]]) -> list[list[dict[str, Any]]] | None:
    """Pairs as user/assistant conversations, or the conversations given (None for texts)."""
    if "conversations" in columns:
        return list(columns["conversations"])
    if "queries" in columns:
        return [
            [{"role": "user", "content": q}, {"role": "assistant", "content": r}]
            for q, r in zip(columns["queries"], columns["responses"], strict=True)
        ]
    return None


def requests(
    protocol: str,
    columns: dict[str, list[Any]],
    size: int,
    truncate: bool | None,
    fields: Mapping[str, Any] | None = None,
    specials: VllmSpecials | None = None,
) -> list[WireRequest]:
    """The requests that score ``columns`` (one input form) in ``protocol``; ``fields``
    (``model``, ``components``) are this server's own and go into every remote-reward body;
    ``specials``: what the vLLM server's tokenizer adds (vLLM's defaults when not given)."""
    if protocol == "remote-reward":
        bodies = _split(columns, size)
        for body in bodies:
            if truncate is not None:
                body["truncate"] = truncate
            body.update(fields or {})
        # The first key of a body is its input column (then truncate and fields).
        return [WireRequest("/score", b, len(next(iter(b.values())))) for b in bodies]
    if fields:
        raise ValueError(
            f"protocol {protocol!r} cannot take {', '.join(sorted(fields))}= "
            "(only this project's server, protocol remote-reward)"
        )
    if protocol == "vllm":
        return _vllm_requests(columns, size, truncate, specials or VllmSpecials())
    if "conversations" in columns:
        raise ValueError(f"protocol {protocol!r} takes no chat messages; send texts or pairs")
    if protocol == "tei":
        if "texts" in columns:
            sequences = [[t] for t in columns["texts"]]
        else:
            sequences = [
                list(p) for p in zip(columns["queries"], columns["responses"], strict=True)
            ]
        extra = {} if truncate is None else {"truncate": truncate}
        return _chunked(
            "/predict", sequences, size, lambda c: {"inputs": c, "raw_scores": True, **extra}
        )
    if protocol == "openrlhf":
        texts = columns.get("texts") or [
            q + r for q, r in zip(columns["queries"], columns["responses"], strict=True)
        ]
        return _chunked("/get_reward", texts, size, lambda c: {"query": c})
    raise ValueError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")


def _chunked(
    path: str, values: list[Any], size: int, body: Callable[[list[Any]], dict[str, Any]]
) -> list[WireRequest]:
    """One request per ``size`` values, its body made by ``body``."""
    chunks = [values[i : i + size] for i in range(0, len(values), size)]
    return [WireRequest(path, body(chunk), len(chunk)) for chunk in chunks]


def _vllm_requests(
    columns: dict[str, list[Any]], size: int, truncate: bool | None, specials: VllmSpecials
) -> list[WireRequest]:
    flags: dict[str, Any] = {"use_activation": False, "activation": False}
    if truncate:
        flags["truncate_prompt_tokens"] = -1
    conversations = _pair_conversations(columns)
    if conversations is not None:
        if specials.chat:
            flags["add_special_tokens"] = True
        return [WireRequest("/classify", {"messages": c, **flags}, 1) for c in conversations]
    texts: list[str] = columns["texts"]
    bos = specials.bos
    out: list[WireRequest] = []
    # The texts in order, in runs alike in starting with BOS: those that do get no second one.
    for has_bos, run in itertools.groupby(texts, key=lambda t: bool(bos) and t.startswith(bos)):
        body = {**flags, "add_special_tokens": False} if has_bos else flags
        out += _chunked("/classify", list(run), size, lambda c, b=body: {"input": c, **b})
    return out


def parse(protocol: str, payload: object, items: int) -> Parsed:
    """Scores of one answer in ``protocol``; ValueError naming what is wrong with it."""
    if protocol == "vllm":
        return _parse_vllm(payload, items)
    if protocol == "tei":
        return _parse_tei(payload, items)
    if not isinstance(payload, dict):
        raise ValueError(f"expected a JSON object, got {type(payload).__name__}")
    if protocol == "openrlhf":
        rewards = payload.get("rewards")
        if not isinstance(rewards, list) or len(rewards) != items:
            raise ValueError(f"'rewards' missing or not {items} values")
        return Parsed(
            [_number(r, f"reward {i}") for i, r in enumerate(rewards)], [0] * items, [False] * items
        )
    raise ValueError(f"no parser for protocol {protocol!r}")


def _parse_vllm(payload: object, items: int) -> Parsed:
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list) or len(data) != items:
        raise ValueError(f"'data' missing or not {items} items")
    ordered = sorted(data, key=lambda d: d.get("index", 0) if isinstance(d, dict) else 0)
    scores = []
    for i, item in enumerate(ordered):
        probs = item.get("probs") if isinstance(item, dict) else None
        if not isinstance(probs, list) or not probs:
            raise ValueError(f"data[{i}].probs missing")
        scores.append(_number(probs[0], f"data[{i}].probs[0]"))
    usage = payload.get("usage") if isinstance(payload, dict) else None
    tokens = [0] * items
    if items == 1 and isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
        tokens = [int(usage["prompt_tokens"])]
    return Parsed(scores, tokens, [False] * items)


def _parse_tei(payload: object, items: int) -> Parsed:
    if not isinstance(payload, list) or len(payload) != items:
        raise ValueError(f"expected a list of {items} predictions")
    scores = []
    for i, predictions in enumerate(payload):
        if not isinstance(predictions, list) or len(predictions) != 1:
            raise ValueError(
                f"item {i}: expected one label's prediction (a one-label reward model)"
            )
        entry = predictions[0]
        scores.append(
            _number(entry.get("score") if isinstance(entry, dict) else None, f"item {i} score")
        )
    return Parsed(scores, [0] * items, [False] * items)


def detect(info: object, models: object) -> str | None:
    """The protocol a server speaks from its ``GET /info`` and ``GET /v1/models`` answers
    (None where it did not answer), or None if neither tells."""
    if isinstance(info, dict):
        if "max_client_batch" in info:
            return "remote-reward"
        if "model_type" in info and "model_id" in info:
            return "tei"
    if isinstance(models, dict) and isinstance(models.get("data"), list):
        return "vllm"
    return None


def chunk_size(info: object) -> int | None:
    """Items per request a server's ``/info`` allows (this server's or TEI's), if it says."""
    if not isinstance(info, dict):
        return None
    for key in ("max_client_batch", "max_client_batch_size"):
        value = info.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
