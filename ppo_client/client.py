"""Deprecated: the reward client moved to :mod:`reward_client`; this module goes in the
next release."""

from __future__ import annotations

import warnings

from reward_client import (
    AsyncRewardClient,
    ClientOptions,
    RetryEvent,
    RetryPolicy,
    RewardClient,
    RewardClientError,
    RewardServerError,
    ScoreInputs,
    ScoreResult,
)

__all__ = [
    "AsyncRewardClient",
    "ClientOptions",
    "RetryEvent",
    "RetryPolicy",
    "RewardClient",
    "RewardClientError",
    "RewardServerError",
    "ScoreInputs",
    "ScoreResult",
]

warnings.warn(
    "ppo_client.client is deprecated: import from reward_client instead",
    DeprecationWarning,
    stacklevel=2,
)
