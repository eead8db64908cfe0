"""PPO trainer for a reward model behind HTTP; the reward client is :mod:`reward_client`.

Imports are lazy, so ``import ppo_client`` stays light (no torch until a trainer is used).
The reward client's names here (``ppo_client.RewardClient`` and the others of
``_MOVED``) still work for one release, with a DeprecationWarning naming their new home.
"""

from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ppo_client.config import PPOConfig
    from ppo_client.trainer import PPOTrainer

__all__ = ["PPOConfig", "PPOTrainer"]

_WHERE = {
    "PPOConfig": "ppo_client.config",
    "PPOTrainer": "ppo_client.trainer",
}

#: Names that moved to ``reward_client`` (deprecated here, removed in the next release).
_MOVED = frozenset(
    {
        "AsyncRewardClient",
        "RewardClient",
        "RewardClientError",
        "RewardServerError",
        "ScoreResult",
    }
)


def __getattr__(name: str) -> Any:
    """Import the public names on first use; warn for the reward client's old names."""
    if name in _MOVED:
        warnings.warn(
            f"ppo_client.{name} is deprecated: use reward_client.{name} "
            f"(from reward_client import {name})",
            DeprecationWarning,
            stacklevel=2,
        )
        # Kept, so that `from ppo_client import X` (two look-ups) warns once.
        value = globals()[name] = getattr(importlib.import_module("reward_client"), name)
        return value
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'ppo_client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
