"""Batch sizes of a PPO run, as TRL's PPO names them, derived once and then fixed.

One optimiser step uses ``per_device_train_batch_size * gradient_accumulation_steps``
rollouts per rank (a mini-batch); a PPO epoch goes over ``num_mini_batches`` of them; an
update samples ``batch_size`` prompts over all ranks.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ppo_client.config import ConfigError

if TYPE_CHECKING:
    from ppo_client.config import PPOConfig

__all__ = ["BatchSizes", "run_config"]


def _exact_div(a: int, b: int, what: str) -> int:
    """``a // b``, raising a :class:`ConfigError` that explains ``what`` when it has a remainder."""
    if b <= 0 or a % b != 0:
        raise ConfigError(f"{what} ({a} is not a multiple of {b})")
    return a // b


@dataclass(frozen=True)
class BatchSizes:
    """The sizes derived from the config, the world size and the dataset (TRL's names)."""

    world_size: int
    local_batch_size: int
    """Rollouts per rank and update: ``local_mini_batch_size * num_mini_batches``."""
    micro_batch_size: int
    """``per_device_train_batch_size * world_size``."""
    local_mini_batch_size: int
    """Rollouts per rank and optimiser step: ``per_device_train_batch_size *
    gradient_accumulation_steps``."""
    mini_batch_size: int
    """``batch_size / num_mini_batches``."""
    batch_size: int
    """Prompts per update over all ranks: ``local_batch_size * world_size``."""
    total_episodes: int
    """Prompts to train on (``config.total_episodes``, else ``num_train_epochs * dataset``)."""
    num_total_batches: int
    """Updates in the run: ``ceil(total_episodes / batch_size)``."""

    @classmethod
    def from_config(cls, config: PPOConfig, world_size: int, dataset_size: int) -> BatchSizes:
        """Derive the sizes and check that they divide evenly and fit the dataset."""
        local_mini_batch_size = config.per_device_train_batch_size * (
            config.gradient_accumulation_steps
        )
        local_batch_size = local_mini_batch_size * config.num_mini_batches
        batch_size = local_batch_size * world_size
        mini_batch_size = _exact_div(
            batch_size,
            config.num_mini_batches,
            "batch_size (per_device_train_batch_size * gradient_accumulation_steps * "
            "num_mini_batches * world_size) must be a multiple of num_mini_batches",
        )
        if config.whiten_rewards and local_mini_batch_size < 8:
            raise ConfigError(
                f"whiten_rewards needs at least 8 rollouts per rank and mini-batch, got "
                f"{local_mini_batch_size} (per_device_train_batch_size x "
                "gradient_accumulation_steps)"
            )
        if dataset_size < batch_size:
            raise ConfigError(
                f"the dataset has {dataset_size} prompts, fewer than one batch of "
                f"{batch_size} (per_device_train_batch_size {config.per_device_train_batch_size}"
                f" x gradient_accumulation_steps {config.gradient_accumulation_steps} x "
                f"num_mini_batches {config.num_mini_batches} x world_size {world_size})"
            )
        total_episodes = config.total_episodes
        if total_episodes is None:
            total_episodes = int(config.num_train_epochs * dataset_size)
        if total_episodes < 1:
            raise ConfigError("total_episodes (or num_train_epochs * dataset size) must be >= 1")
        return cls(
            world_size=world_size,
            local_batch_size=local_batch_size,
            micro_batch_size=config.per_device_train_batch_size * world_size,
            local_mini_batch_size=local_mini_batch_size,
            mini_batch_size=mini_batch_size,
            batch_size=batch_size,
            total_episodes=total_episodes,
            # We may train on a few more episodes than asked, as TRL does.
            num_total_batches=math.ceil(total_episodes / batch_size),
        )

    def save_every(self, save_steps: float) -> int:
        """``save_steps`` as a number of updates (a value below 1 is a fraction of the run)."""
        if save_steps < 1:
            return max(1, math.ceil(self.num_total_batches * save_steps))
        return int(save_steps)

    def to_dict(self) -> dict[str, int]:
        """The sizes by name."""
        return dataclasses.asdict(self)


def run_config(config: PPOConfig, sizes: BatchSizes) -> dict[str, Any]:
    """The options as the run uses them: ``config.to_dict()`` with the derived sizes filled in
    (written to checkpoints and sent to trackers)."""
    out = config.to_dict()
    out.update(sizes.to_dict())
    return out
