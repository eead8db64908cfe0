"""Deprecated: the TRL adapter moved to :mod:`reward_client.integrations.trl`; this module
goes in the next release."""

from __future__ import annotations

import warnings

from reward_client.integrations.trl import RemoteReward, RewardComponent

__all__ = ["RemoteReward", "RewardComponent"]

warnings.warn(
    "ppo_client.trl is deprecated: import from reward_client.integrations.trl instead",
    DeprecationWarning,
    stacklevel=2,
)
