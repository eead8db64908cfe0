"""BatchSizes: TRL's derived batch sizes, checked once and frozen; the config is not changed."""

from __future__ import annotations

import dataclasses
import math

import pytest

from ppo_client.config import ConfigError, PPOConfig
from ppo_client.sizes import BatchSizes, run_config


def test_derived_batch_sizes() -> None:
    cfg = PPOConfig(
        per_device_train_batch_size=2,
        gradient_accumulation_steps=3,
        num_mini_batches=2,
        total_episodes=100,
    )
    sizes = BatchSizes.from_config(cfg, world_size=2, dataset_size=50)
    # one optimiser step = 2 x 3 rollouts per rank; 2 of them per PPO epoch
    assert (sizes.local_mini_batch_size, sizes.local_batch_size) == (6, 12)
    assert (sizes.batch_size, sizes.mini_batch_size, sizes.micro_batch_size) == (24, 12, 4)
    assert sizes.num_total_batches == math.ceil(100 / 24)
    with pytest.raises(ConfigError, match="fewer than one batch"):
        BatchSizes.from_config(cfg, world_size=2, dataset_size=10)
    cfg.whiten_rewards = True
    with pytest.raises(ConfigError, match="whiten_rewards needs at least 8"):
        BatchSizes.from_config(cfg, world_size=2, dataset_size=50)


def test_sizes_are_frozen_and_leave_the_config_alone() -> None:
    cfg = PPOConfig(per_device_train_batch_size=4, num_train_epochs=1.5)
    before = cfg.to_dict()
    sizes = BatchSizes.from_config(cfg, world_size=1, dataset_size=20)
    assert cfg.to_dict() == before and cfg.total_episodes is None
    assert (sizes.total_episodes, sizes.num_total_batches) == (30, 8)  # ceil(30 / 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        sizes.batch_size = 8  # type: ignore[misc]
    # checkpoints and trackers see the options with the derived sizes filled in
    options = run_config(cfg, sizes)
    assert (options["total_episodes"], options["batch_size"], options["world_size"]) == (30, 4, 1)


def test_total_episodes_must_be_positive() -> None:
    cfg = PPOConfig(per_device_train_batch_size=4, num_train_epochs=0.01)
    with pytest.raises(ConfigError, match=r"total_episodes \(or num_train_epochs"):
        BatchSizes.from_config(cfg, world_size=1, dataset_size=20)


def test_save_every_reads_a_fraction_of_the_run() -> None:
    cfg = PPOConfig(per_device_train_batch_size=4, total_episodes=40)
    sizes = BatchSizes.from_config(cfg, world_size=1, dataset_size=20)  # 10 updates
    assert sizes.save_every(3) == 3
    assert sizes.save_every(0.25) == 3  # ceil(10 * 0.25)
    assert sizes.save_every(0.01) == 1
