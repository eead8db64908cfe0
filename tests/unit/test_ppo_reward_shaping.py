"""Running reward normalisation and process-mode step rewards in the PPO maths and config."""

from __future__ import annotations

import statistics
from types import SimpleNamespace

import pytest
import torch

from ppo_client import ppo
from ppo_client.config import ConfigError, PPOConfig
from ppo_client.normalization import RunningNormalizer


def t(*rows: object) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


# ---------------------------------------------------------------------------- normaliser


def test_running_normalizer_whitens_with_the_last_window_scores() -> None:
    norm = RunningNormalizer(window=4)
    first = t(1.0, 3.0)
    # Window [1, 3]: mean 2, unbiased std sqrt(2)
    torch.testing.assert_close(norm(first), (first - 2.0) / 2.0**0.5)
    second = t(5.0, 7.0, 9.0)
    # Window holds the last 4 scores: [3, 5, 7, 9] (1 dropped out): mean 6, std sqrt(20/3)
    expected = (second - 6.0) / (20.0 / 3.0) ** 0.5
    torch.testing.assert_close(norm(second), expected)
    assert norm.state() == [3.0, 5.0, 7.0, 9.0]
    window = torch.tensor(norm.state())
    assert norm.stats() == pytest.approx((window.mean().item(), window.std().item()))


def test_running_normalizer_edge_cases() -> None:
    norm = RunningNormalizer(window=3)
    assert norm.stats() == (0.0, 1.0)
    # One score: no spread yet, centred only.
    torch.testing.assert_close(norm(t(4.0)), t(0.0))
    # Equal scores: the std is clamped to eps, the scores map to 0 (not NaN).
    torch.testing.assert_close(norm(t(4.0, 4.0)), t(0.0, 0.0))
    with pytest.raises(ValueError, match="non-finite"):
        norm(t(float("nan")))
    with pytest.raises(ValueError, match="at least 2"):
        RunningNormalizer(window=1)


def test_running_normalizer_takes_every_rank_scores_and_restores() -> None:
    norm = RunningNormalizer(window=8)
    local = t(1.0, 2.0)
    everyone = t(1.0, 2.0, 10.0, 20.0)  # what accelerate's gather gives on two ranks
    out = norm(local, everyone)
    torch.testing.assert_close(out, (local - everyone.mean()) / everyone.std())
    again = RunningNormalizer(window=8)
    again.load(norm.state())
    assert again.stats() == norm.stats() and len(again) == 4


# --------------------------------------------------------------------------- config


def test_config_takes_the_reward_shaping_options() -> None:
    cfg = PPOConfig.from_args(
        ["--reward_normalization", "running", "--reward_normalization_window", "64"]
    )
    assert cfg.reward_normalization == "running" and cfg.reward_normalization_window == 64
    assert PPOConfig().reward_normalization == "none" and PPOConfig().reward_mode == "outcome"
    assert PPOConfig(reward_mode="process").reward_mode == "process"
    with pytest.raises(ConfigError, match="reward_normalization_window must be >= 2"):
        PPOConfig(reward_normalization_window=1)
    with pytest.raises(ConfigError, match="reward_normalization"):
        PPOConfig(reward_normalization="batch")
    with pytest.raises(ConfigError, match="reward_protocol tei has none"):
        PPOConfig(reward_mode="process", reward_protocol="tei")


# ------------------------------------------------------------------ advantages with steps


def rollout() -> SimpleNamespace:
    """Two responses of 4 tokens, the first ending at index 2, policy == reference."""
    return SimpleNamespace(
        responses=torch.tensor([[5, 6, 2, 0], [5, 6, 7, 8]]),
        seq_lengths=torch.tensor([2, 3]),
        logprobs=t([-1.0] * 4, [-1.0] * 4),
        ref_logprobs=t([-1.0] * 4, [-1.0] * 4),
        values=t([0.0] * 4, [0.0] * 4),
        raw_scores=t(1.0, 2.0),
    )


def params(**overrides: object) -> ppo.AdvantageParams:
    values: dict[str, object] = {
        "reward_baseline": 0.0,
        "reward_scale": 1.0,
        "missing_eos_penalty": None,
        "eos_token_id": 2,
        "kl_estimator": "k1",
        "kl_coef": 0.05,
        "whiten_rewards": False,
        "gamma": 1.0,
        "lam": 1.0,
    }
    values.update(overrides)
    return ppo.AdvantageParams(**values)  # type: ignore[arg-type]


def rewards_from_returns(returns: torch.Tensor) -> torch.Tensor:
    """With gamma = lam = 1 and values 0, returns are rewards to go: r_t = R_t - R_{t+1}."""
    following = torch.cat([returns[:, 1:], torch.zeros_like(returns[:, :1])], 1)
    return returns - following


def test_outcome_mode_without_steps_or_normalisation_is_whitened_gae_by_hand() -> None:
    """Classic PPO (TRL's): the raw score on the last real token, rewards whitened keeping
    their mean, returns the rewards to go (gamma = lam = 1, values 0), advantages whitened.
    The expected values are computed here with plain floats, token by token."""
    a = ppo.compute_advantages(rollout(), params(whiten_rewards=True))  # type: ignore[arg-type]
    lengths = [3, 4]  # real tokens of each response (last indices 2 and 3)
    # policy == reference: no KL, so the per-token rewards are the scores 1 and 2 alone.
    raw = [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 2.0]]
    flat = [x for row in raw for x in row]
    mean, std = statistics.mean(flat), statistics.stdev(flat)  # Bessel-corrected
    rewards = [[(x - mean) / std + mean for x in row] for row in raw]
    returns = [[sum(row[i:]) for i in range(len(row))] for row in rewards]
    flat = [x for row in returns for x in row]
    mean, std = statistics.mean(flat), statistics.stdev(flat)
    advantages = [[(x - mean) / std for x in row] for row in returns]

    def padded(rows: list[list[float]]) -> torch.Tensor:
        return t(*(row + [0.0] * (4 - len(row)) for row in rows))

    assert a.scores.tolist() == [1.0, 2.0] and a.has_eos.tolist() == [True, False]
    assert a.mask.tolist() == [[n > i for i in range(4)] for n in lengths]
    assert not a.kl.any() and not a.non_score_reward.any()
    torch.testing.assert_close(rewards_from_returns(a.returns), padded(rewards))
    torch.testing.assert_close(a.returns, padded(returns))
    torch.testing.assert_close(a.advantages, padded(advantages))


def test_step_rewards_land_on_their_tokens_scaled_and_the_outcome_stays_last() -> None:
    steps = t([0.5, 0.0, 0.25, 0.0], [0.0, -1.0, 0.0, 3.0])
    a = ppo.compute_advantages(
        rollout(),  # type: ignore[arg-type]
        params(reward_scale=2.0, reward_baseline=1.0, kl_coef=0.0),
        step_rewards=steps,
    )
    # Outcome: (score - 1) * 2 on the last token; steps: * 2 where they ended (no baseline).
    expected = t([1.0, 0.0, 0.5 + 0.0, 0.0], [0.0, -2.0, 0.0, 6.0 + 2.0])
    torch.testing.assert_close(rewards_from_returns(a.returns), expected)
    assert a.scores.tolist() == [0.0, 2.0]


def test_normalised_scores_replace_the_raw_ones() -> None:
    r = rollout()
    a = ppo.compute_advantages(r, params(kl_coef=0.0), scores=t(-1.0, 1.0))  # type: ignore[arg-type]
    assert a.scores.tolist() == [-1.0, 1.0]
    torch.testing.assert_close(
        rewards_from_returns(a.returns), t([0.0, 0.0, -1.0, 0.0], [0.0, 0.0, 0.0, 1.0])
    )
