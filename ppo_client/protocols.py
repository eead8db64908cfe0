"""Deprecated: the wire formats moved to :mod:`reward_client.wire`; this module goes in the
next release."""

from __future__ import annotations

import warnings

from reward_client.results import ScoreResult
from reward_client.wire import (
    LABELLED,
    PROTOCOLS,
    VLLM_PROBES,
    VllmSpecials,
    WireRequest,
    check,
    chunk_size,
    detect,
    parse,
    requests,
    vllm_specials,
)

#: ``parse`` now gives a :class:`~reward_client.ScoreResult` (the same three fields first).
Parsed = ScoreResult

__all__ = [
    "LABELLED",
    "PROTOCOLS",
    "VLLM_PROBES",
    "Parsed",
    "VllmSpecials",
    "WireRequest",
    "check",
    "chunk_size",
    "detect",
    "parse",
    "requests",
    "vllm_specials",
]

warnings.warn(
    "ppo_client.protocols is deprecated: import from reward_client.wire instead",
    DeprecationWarning,
    stacklevel=2,
)
