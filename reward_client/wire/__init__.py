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
                                (:mod:`.vllm`)
tei            ``/predict``     texts as ``[text]``, pairs as ``[text, text_pair]``; no
                                conversations (:mod:`.tei`)
=============  ===============  ==========================================================

Labels (one reference per item) go as ``labels`` to remote-reward and openrlhf; vLLM and
TEI have no field for them, so a call with labels is refused there (:func:`check`).
Raw logits always: ``use_activation: false`` (and ``activation: false``) for vLLM,
``raw_scores: true`` for TEI. Where a protocol does not report tokens or truncation per
item, the result says 0 tokens and not truncated; only remote-reward has a breakdown.
``auto`` finds out from the server (:mod:`.detect`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reward_client.results import ScoreResult
from reward_client.wire import openrlhf, remote_reward, tei, vllm
from reward_client.wire.base import WireRequest
from reward_client.wire.detect import chunk_size, detect
from reward_client.wire.vllm import VLLM_PROBES, VllmSpecials, vllm_specials

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


def check(protocol: str, columns: Mapping[str, list[Any]], fields: Mapping[str, Any]) -> None:
    """ValueError unless ``protocol`` can carry ``fields`` (``model``, ``components``: this
    server's own) and the columns' labels."""
    if fields and protocol != "remote-reward":
        raise ValueError(
            f"protocol {protocol!r} cannot take {', '.join(sorted(fields))}= "
            "(only this project's server, protocol remote-reward)"
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


def parse(protocol: str, payload: object, items: int) -> ScoreResult:
    """The result of one answer in ``protocol``; ValueError naming what is wrong with it."""
    parsers = {
        "remote-reward": remote_reward.parse,
        "vllm": vllm.parse,
        "tei": tei.parse,
        "openrlhf": openrlhf.parse,
    }
    parser = parsers.get(protocol)
    if parser is None:
        raise ValueError(f"no parser for protocol {protocol!r}")
    return parser(payload, items)
