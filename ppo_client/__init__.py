"""PPO trainer for a reward model behind HTTP; the reward client is :mod:`reward_client`.

Imports are lazy, so ``import ppo_client`` stays light (no torch until a trainer is used).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ppo_client.config import PPOConfig
    from ppo_client.trainer import PPOTrainer

__all__ = ["PPOConfig", "PPOTrainer"]

_WHERE = {
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
