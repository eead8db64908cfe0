"""Deprecated: the verl adapter moved to :mod:`reward_client.integrations.verl`
(``custom_reward_function.path=pkg://reward_client.integrations.verl``); this module goes
in the next release."""

from __future__ import annotations

import warnings

from reward_client.integrations.verl import (
    aclose_clients,
    close_clients,
    compute_score,
    compute_score_async,
    compute_score_batch,
)

__all__ = [
    "aclose_clients",
    "close_clients",
    "compute_score",
    "compute_score_async",
    "compute_score_batch",
]

warnings.warn(
    "ppo_client.verl is deprecated: use reward_client.integrations.verl "
    "(custom_reward_function.path=pkg://reward_client.integrations.verl)",
    DeprecationWarning,
    stacklevel=2,
)
