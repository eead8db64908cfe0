"""PPO trainer and reward client for a reward model behind HTTP.

Imports are lazy, so ``import ppo_client`` stays light (no torch until a trainer is used).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ppo_client.client import (
        AsyncRewardClient,
        RewardClient,
        RewardClientError,
        RewardServerError,
        ScoreResult,
    )
    from ppo_client.config import PPOConfig
    from ppo_client.trainer import PPOTrainer

__all__ = [
    "AsyncRewardClient",
    "PPOConfig",
    "PPOTrainer",
    "RewardClient",
    "RewardClientError",
    "RewardServerError",
    "ScoreResult",
]

_WHERE = {
    "AsyncRewardClient": "ppo_client.client",
    "RewardClient": "ppo_client.client",
    "RewardClientError": "ppo_client.client",
    "RewardServerError": "ppo_client.client",
    "ScoreResult": "ppo_client.client",
    "PPOConfig": "ppo_client.config",
    "PPOTrainer": "ppo_client.trainer",
}


def __getattr__(name: str) -> Any:
    """Import the public names on first use."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ppo_client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
