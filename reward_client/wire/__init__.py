"""The reward protocols the client speaks, as request bodies and answer parsers (no I/O).

=============  ===============  ==========================================================
protocol       endpoint         texts / pairs / conversations
=============  ===============  ==========================================================
remote-reward  ``POST /score``  as they are (this server; :mod:`.remote_reward`)
openrlhf       ``/get_reward``  texts; pairs joined as query + response; no conversations
                                (:mod:`.openrlhf`)
vllm           ``/classify``    texts as ``input``; pairs and conversations as ``messages``,
                                one conversation per request (vLLM renders its template),
                                with ``add_special_tokens`` as :class:`VllmSpecials` says
                                (:mod:`.vllm`); no tools
tei            ``/predict``     texts as ``[text]``, pairs as ``[text, text_pair]``; no
                                conversations (:mod:`.tei`)
=============  ===============  ==========================================================

Labels (one reference per item) go as ``labels`` to remote-reward and openrlhf; vLLM and
TEI have no field for them, so a call with labels is refused there (:func:`check`). Tools
(a call's ``tools``, a conversation's own) go to remote-reward only; messages go to vLLM as
they are (tool calls included: its chat template renders them).
Raw logits always: ``use_activation: false`` (and ``activation: false``) for vLLM,
``raw_scores: true`` for TEI. Where a protocol does not report tokens or truncation per
item, the result says 0 tokens and not truncated; only remote-reward has a breakdown.
``auto`` finds out from the server (:mod:`.detect`).

Masked items (a reward the server could not compute) come back as None scores. This
server's ``/score`` says so with ``null`` and a reason per item (``masked``); its
``/get_reward`` with a fill value and ``extra_logs["masked"]`` (1.0 for a masked item);
its vLLM- and TEI-shaped routes with a fill value and the ``X-Reward-Masked`` header
listing the masked positions. The client reads all three (the reason is
:data:`~reward_client.results.UNKNOWN_REASON` where the answer gives none). Other servers
send none of these: their scores are taken as they are. Every request carries the
caller's remaining time budget in ``X-Request-Timeout-Ms``
(:data:`~reward_client.wire.base.DEADLINE_HEADER`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reward_client.results import ScoreResult
from reward_client.wire import openrlhf, remote_reward, tei, vllm
from reward_client.wire.base import (
    MASKED_HEADER,
    WireRequest,
    masked_at,
    parse_masked_header,
)
from reward_client.wire.detect import chunk_size, detect
from reward_client.wire.vllm import VLLM_PROBES, VllmSpecials, vllm_specials

# The header names live in .base, not in __all__.
__all__ = [
    "LABELLED",
    "PROTOCOLS",
    "VLLM_PROBES",
    "VllmSpecials",
    "WireRequest",
    "check",
    "chunk_size",
    "detect",
    "parse",
    "requests",
    "vllm_specials",
]

#: The protocols a client can be told to speak (``auto`` finds out from the server).
PROTOCOLS = ("auto", "remote-reward", "vllm", "tei", "openrlhf")


#: The protocols whose requests carry labels.
LABELLED = ("remote-reward", "openrlhf")


def check(
    protocol: str,
    columns: Mapping[str, list[Any]],
    fields: Mapping[str, Any],
    grouped: bool = False,
) -> None:
    """ValueError unless ``protocol`` can carry ``fields`` (``model``, ``components``: this
    server's own), the columns' labels and (``grouped``) groups of items."""
    own = sorted(fields) + (["groups"] if grouped else [])
    if own and protocol != "remote-reward":
        raise ValueError(
            f"protocol {protocol!r} cannot take {', '.join(own)}= "
            "(only this project's server, protocol remote-reward)"
        )
    if protocol != "remote-reward" and any(
        isinstance(c, Mapping) and "tools" in c for c in columns.get("conversations", ())
    ):
        raise ValueError(
            f"protocol {protocol!r} cannot take a conversation's tools (only this project's "
            "server, protocol remote-reward)"
        )
    if "labels" in columns and protocol not in LABELLED:
        raise ValueError(
            f"protocol {protocol!r} cannot take labels= (it has no field for them; "
            f"protocols {' and '.join(LABELLED)} do)"
        )


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
    check(protocol, columns, fields or {})
    if protocol == "remote-reward":
        return remote_reward.requests(columns, size, truncate, fields or {})
    if protocol == "vllm":
        return vllm.requests(columns, size, truncate, specials or VllmSpecials())
    if "conversations" in columns:
        raise ValueError(f"protocol {protocol!r} takes no chat messages; send texts or pairs")
    if protocol == "tei":
        return tei.requests(columns, size, truncate)
    if protocol == "openrlhf":
        return openrlhf.requests(columns, size)
    raise ValueError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOLS)}")


def parse(
    protocol: str, payload: object, items: int, headers: Mapping[str, str] | None = None
) -> ScoreResult:
    """The result of one answer in ``protocol`` (``headers``: the answer's, for the vLLM
    and TEI protocols' ``X-Reward-Masked``); ValueError naming what is wrong with it."""
    parsers = {
        "remote-reward": remote_reward.parse,
        "vllm": vllm.parse,
        "tei": tei.parse,
        "openrlhf": openrlhf.parse,
    }
    parser = parsers.get(protocol)
    if parser is None:
        raise ValueError(f"no parser for protocol {protocol!r}")
    result = parser(payload, items)
    if protocol in ("vllm", "tei") and headers is not None:
        result = masked_at(result, parse_masked_header(headers.get(MASKED_HEADER), items))
    return result
