"""PPO maths against hand-computed cases (the numbers in the comments are worked by hand)."""

from __future__ import annotations

import math

import pytest
import torch

from ppo_client import ppo


def t(*rows: object) -> torch.Tensor:
    """A float tensor from nested lists."""
    return torch.tensor(rows, dtype=torch.float64)


def assert_close(actual: torch.Tensor, expected: object, tol: float = 1e-6) -> None:
    torch.testing.assert_close(
        actual.double(), torch.as_tensor(expected, dtype=torch.float64), atol=tol, rtol=0
    )


# ----------------------------------------------------------------------------- masked stats


def test_masked_mean_ignores_masked_values() -> None:
    values = t([1.0, 2.0, 3.0, 100.0], [4.0, 5.0, -7.0, -7.0])
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    # (1 + 2 + 3 + 4 + 5) / 5
    assert_close(ppo.masked_mean(values, mask), 3.0)
    # per row: (1 + 2 + 3) / 3, (4 + 5) / 2
    assert_close(ppo.masked_mean(values, mask, dim=1), [2.0, 4.5])


def test_masked_var_is_bessel_corrected() -> None:
    values = t([2.0, 4.0, 6.0, 1000.0])
    mask = torch.tensor([[True, True, True, False]])
    # mean 4, squared deviations 4 + 0 + 4 = 8, unbiased 8 / 2 = 4, biased 8 / 3
    assert_close(ppo.masked_var(values, mask), 4.0)
    assert_close(ppo.masked_var(values, mask, unbiased=False), 8.0 / 3.0)


def test_masked_var_needs_two_values() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        ppo.masked_var(t([1.0, 2.0]), torch.tensor([[True, False]]))


def test_masked_whiten_with_mean_shift() -> None:
    values = t([2.0, 4.0, 6.0, 1000.0])
    mask = torch.tensor([[True, True, True, False]])
    # mean 4, std 2: (x - 4) / 2 on the unmasked positions
    whitened = ppo.masked_whiten(values, mask)
    assert_close(whitened[:, :3], [[-1.0, 0.0, 1.0]], tol=1e-6)
    assert_close(ppo.masked_mean(whitened, mask), 0.0)
    assert_close(ppo.masked_var(whitened, mask), 1.0, tol=1e-6)


def test_masked_whiten_without_mean_shift_keeps_the_mean() -> None:
    values = t([2.0, 4.0, 6.0, 1000.0])
    mask = torch.tensor([[True, True, True, False]])
    # (x - 4) / 2 + 4 = [3, 4, 5]: scaled to unit variance, mean kept at 4
    whitened = ppo.masked_whiten(values, mask, shift_mean=False)
    assert_close(whitened[:, :3], [[3.0, 4.0, 5.0]], tol=1e-6)


# ----------------------------------------------------------------------------- responses


def test_first_true_indices() -> None:
    bools = torch.tensor([[False, True, True], [False, False, False], [True, False, False]])
    assert ppo.first_true_indices(bools).tolist() == [1, 3, 0]


def test_truncate_response_keeps_stop_token_and_pads_after() -> None:
    responses = torch.tensor([[5, 7, 2, 9, 2], [5, 6, 7, 8, 9], [2, 1, 1, 1, 1]])
    out = ppo.truncate_response(responses, stop_token_id=2, pad_token_id=0)
    assert out.tolist() == [[5, 7, 2, 0, 0], [5, 6, 7, 8, 9], [2, 0, 0, 0, 0]]
    assert responses[0].tolist() == [5, 7, 2, 9, 2], "input must not be modified"


def test_sequence_lengths_point_at_the_last_real_token() -> None:
    responses = torch.tensor([[5, 7, 2, 9, 2], [5, 6, 7, 8, 9], [2, 1, 1, 1, 1]])
    # the first stop token, or the last position when the response has none
    assert ppo.sequence_lengths(responses, stop_token_id=2).tolist() == [2, 4, 0]
    assert ppo.sequence_lengths(responses, stop_token_id=None).tolist() == [4, 4, 4]


def test_sequence_lengths_do_not_depend_on_the_pad_id() -> None:
    # pad id == a token the model may emit (0 here): lengths come from the stop token only
    responses = torch.tensor([[0, 0, 3, 0], [4, 0, 0, 0]])
    assert ppo.sequence_lengths(responses, stop_token_id=3).tolist() == [2, 3]


def test_response_mask() -> None:
    mask = ppo.response_mask(torch.tensor([2, 4, 0]), length=5)
    assert mask.int().tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]


# ----------------------------------------------------------------------------- log-probs


def test_logprobs_from_logits_matches_log_softmax() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 7, generator=gen)
    tokens = torch.randint(0, 7, (2, 3), generator=gen)
    expected = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    assert_close(ppo.logprobs_from_logits(logits, tokens), expected, tol=1e-5)


def test_entropy_from_logits() -> None:
    # uniform over 4: log 4;  p = (1/4, 3/4): -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.5623351
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0]], [[0.0, math.log(3.0), -1e9, -1e9]]])
    assert_close(ppo.entropy_from_logits(logits), [[math.log(4.0)], [0.5623351446]], tol=1e-6)


# ----------------------------------------------------------------------------- KL and rewards


def test_kl_k1_and_k3() -> None:
    logprobs = t([-1.0, -2.0])
    ref_logprobs = t([-1.5, -1.0])
    # log r = ref - logp = [-0.5, 1.0]
    # k1 = -log r = [0.5, -1.0]
    assert_close(ppo.kl_penalty(logprobs, ref_logprobs, "k1"), [[0.5, -1.0]])
    # k3 = (r - 1) - log r = [e^-0.5 - 1 + 0.5, e - 1 - 1] = [0.1065307, 0.7182818]
    assert_close(ppo.kl_penalty(logprobs, ref_logprobs, "k3"), [[0.1065306597, 0.7182818285]])


def test_kl_is_zero_where_masked_and_rejects_unknown_estimator() -> None:
    kl = ppo.kl_penalty(t([-1.0, -2.0]), t([-1.5, -9.0]), "k3", mask=torch.tensor([[True, False]]))
    assert kl[0, 1].item() == 0.0
    with pytest.raises(ValueError, match="k1"):
        ppo.kl_penalty(t([0.0]), t([0.0]), "k2")  # type: ignore[arg-type]


def test_score_is_placed_at_the_last_response_token() -> None:
    kl = t([0.1, 0.2, 0.3, 0.0], [0.1, 0.1, 0.0, 0.0])
    rewards, non_score = ppo.per_token_rewards(
        kl, scores=t(1.0, -1.0), seq_lengths=torch.tensor([2, 1]), kl_coef=0.5
    )
    # non-score reward = -0.5 * kl; the score lands on index 2 (row 0) and index 1 (row 1)
    assert_close(non_score, [[-0.05, -0.1, -0.15, 0.0], [-0.05, -0.05, 0.0, 0.0]])
    assert_close(rewards, [[-0.05, -0.1, 0.85, 0.0], [-0.05, -1.05, 0.0, 0.0]])


# ----------------------------------------------------------------------------- GAE


def test_gae_gamma_1_lam_1_is_reward_to_go_minus_value() -> None:
    values = t([0.5, 1.0, -0.5])
    rewards = t([0.0, 0.1, 1.0])
    advantages, returns = ppo.compute_gae(values, rewards, gamma=1.0, lam=1.0)
    # A_t = sum_{k>=t} r_k - V_t = [1.1 - 0.5, 1.1 - 1.0, 1.0 + 0.5]
    assert_close(advantages, [[0.6, 0.1, 1.5]])
    assert_close(returns, [[1.1, 1.1, 1.0]])


def test_gae_gamma_09_lam_05() -> None:
    values = t([0.5, 1.0, -0.5])
    rewards = t([0.0, 0.1, 1.0])
    advantages, returns = ppo.compute_gae(values, rewards, gamma=0.9, lam=0.5)
    # delta_2 = 1.0 + 0 + 0.5 = 1.5                      A_2 = 1.5
    # delta_1 = 0.1 + 0.9 * -0.5 - 1.0 = -1.35           A_1 = -1.35 + 0.45 * 1.5 = -0.675
    # delta_0 = 0.0 + 0.9 * 1.0 - 0.5 = 0.4              A_0 = 0.4 + 0.45 * -0.675 = 0.09625
    assert_close(advantages, [[0.09625, -0.675, 1.5]])
    assert_close(returns, [[0.59625, 0.325, 1.0]])


def test_gae_ignores_positions_after_the_last_token() -> None:
    values = t([0.5, 1.0, 9.0], [0.5, 1.0, -0.5])
    rewards = t([0.0, 1.0, 5.0], [0.0, 0.1, 1.0])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    advantages, returns = ppo.compute_gae(values, rewards, gamma=1.0, lam=1.0, mask=mask)
    # row 0 ends at index 1: its value 9 and reward 5 at index 2 lie beyond the terminal state
    # A_1 = 1 + 0 - 1 = 0,  A_0 = 0 + 1 - 0.5 + A_1 = 0.5
    assert_close(advantages, [[0.5, 0.0, 0.0], [0.6, 0.1, 1.5]])
    assert_close(returns, [[1.0, 1.0, 0.0], [1.1, 1.1, 1.0]])


# ----------------------------------------------------------------------------- losses


def _policy_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ratio = t([1.5, 0.5, 1.1])
    return ratio.log(), torch.zeros_like(ratio), t([1.0, -2.0, 3.0])


def test_clipped_policy_loss() -> None:
    new_logprobs, old_logprobs, advantages = _policy_case()
    mask = torch.ones(1, 3, dtype=torch.bool)
    out = ppo.policy_loss(new_logprobs, old_logprobs, advantages, mask, cliprange=0.2)
    # pos 0: A=1,  r=1.5: max(-1.5, -1.2) = -1.2 (clipped)
    # pos 1: A=-2, r=0.5: max(1.0, 1.6)   =  1.6 (clipped)
    # pos 2: A=3,  r=1.1: max(-3.3, -3.3) = -3.3 (inside the range)
    assert_close(out.loss, (-1.2 + 1.6 - 3.3) / 3)
    assert_close(out.clipfrac, 2 / 3)
    logs = [math.log(1.5), math.log(0.5), math.log(1.1)]
    assert_close(out.approxkl, 0.5 * sum(x * x for x in logs) / 3)
    assert_close(out.ratio, (1.5 + 0.5 + 1.1) / 3)


def test_clipped_policy_loss_is_masked() -> None:
    new_logprobs, old_logprobs, advantages = _policy_case()
    mask = torch.tensor([[True, False, True]])
    out = ppo.policy_loss(new_logprobs, old_logprobs, advantages, mask, cliprange=0.2)
    assert_close(out.loss, (-1.2 - 3.3) / 2)
    assert_close(out.clipfrac, 0.5)


def test_policy_loss_gradient_vanishes_where_clipped() -> None:
    new_logprobs, old_logprobs, advantages = _policy_case()
    new_logprobs.requires_grad_(True)
    mask = torch.ones(1, 3, dtype=torch.bool)
    ppo.policy_loss(new_logprobs, old_logprobs, advantages, mask, cliprange=0.2).loss.backward()
    grad = new_logprobs.grad
    assert grad is not None
    # d/dlogp of -A * r / 3 = -A * r / 3 where unclipped; 0 where the clipped branch is taken
    assert_close(grad, [[0.0, 0.0, -3.0 * 1.1 / 3]])


def test_truncated_is_weights_are_the_capped_probability_ratio() -> None:
    trainer = torch.log(torch.tensor([[0.5, 0.2, 0.9, 0.1]]))
    engine = torch.log(torch.tensor([[0.25, 0.4, 0.3, 0.1]]))
    weights = ppo.truncated_is_weights(trainer, engine, cap=2.5)
    # 0.5/0.25 = 2, 0.2/0.4 = 0.5, 0.9/0.3 = 3 -> capped at 2.5, 0.1/0.1 = 1
    assert_close(weights, [[2.0, 0.5, 2.5, 1.0]])
    assert not weights.requires_grad


def test_policy_loss_weighs_each_token_and_its_gradient() -> None:
    new_logprobs, old_logprobs, advantages = _policy_case()
    new_logprobs.requires_grad_(True)
    mask = torch.ones(1, 3, dtype=torch.bool)
    weights = torch.tensor([[2.0, 0.5, 0.25]])
    out = ppo.policy_loss(new_logprobs, old_logprobs, advantages, mask, 0.2, weights)
    # the per-token terms of test_clipped_policy_loss, times 2, 0.5, 0.25
    assert_close(out.loss, (-1.2 * 2.0 + 1.6 * 0.5 - 3.3 * 0.25) / 3)
    out.loss.backward()
    assert new_logprobs.grad is not None
    assert_close(new_logprobs.grad, [[0.0, 0.0, -3.0 * 1.1 * 0.25 / 3]])
    # the statistics do not change with the weights
    plain = ppo.policy_loss(new_logprobs.detach(), old_logprobs, advantages, mask, 0.2)
    assert_close(out.clipfrac, plain.clipfrac)
    assert_close(out.ratio, plain.ratio)


def test_clipped_value_loss() -> None:
    vpred = t([1.0, 0.0, 2.0])
    old_values = t([0.5, 0.5, 2.0])
    returns = t([2.0, 0.0, 1.0])
    mask = torch.ones(1, 3, dtype=torch.bool)
    out = ppo.value_loss(vpred, old_values, returns, mask, cliprange_value=0.2)
    # pos 0: clip(1.0, 0.3, 0.7) = 0.7: max((1-2)^2, (0.7-2)^2) = 1.69 (clipped)
    # pos 1: clip(0.0, 0.3, 0.7) = 0.3: max(0, 0.09) = 0.09           (clipped)
    # pos 2: clip(2.0, 1.8, 2.2) = 2.0: max(1, 1) = 1                 (not clipped)
    assert_close(out.loss, 0.5 * (1.69 + 0.09 + 1.0) / 3)
    assert_close(out.clipfrac, 2 / 3)
    masked = ppo.value_loss(vpred, old_values, returns, torch.tensor([[True, False, False]]), 0.2)
    assert_close(masked.loss, 0.5 * 1.69)


# ----------------------------------------------------------------------------- one update


def test_compute_advantages_transforms_scores_and_runs_gae() -> None:
    """Row 0 stops at its EOS (id 2) at index 1; row 1 never does and is penalised."""
    from types import SimpleNamespace

    rollout = SimpleNamespace(
        responses=torch.tensor([[5, 2, 0], [5, 6, 7]]),
        seq_lengths=torch.tensor([1, 2]),
        logprobs=t([-1.0, -2.0, 0.0], [-1.0, -1.0, -1.0]),
        ref_logprobs=t([-1.0, -2.0, 0.0], [-1.0, -1.0, -1.0]),  # policy == reference: KL 0
        values=t([0.5, 0.25, 9.0], [0.0, 0.0, 0.0]),
        raw_scores=t(3.0, 3.0),
    )
    params = ppo.AdvantageParams(
        reward_baseline=1.0,
        reward_scale=0.5,
        missing_eos_penalty=0.25,
        eos_token_id=2,
        kl_estimator="k1",
        kl_coef=0.1,
        whiten_rewards=False,
        gamma=1.0,
        lam=1.0,
    )
    a = ppo.compute_advantages(rollout, params)  # type: ignore[arg-type]
    assert a.has_eos.tolist() == [True, False]
    # (3 - 1) * 0.5 = 1; row 1 without EOS: 1 - 0.25
    assert_close(a.scores, [1.0, 0.75])
    assert a.mask.tolist() == [[True, True, False], [True, True, True]]
    assert_close(a.kl, [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    # the value after the last token is masked to 0 (9.0 is beyond the terminal state)
    assert_close(a.values, [[0.5, 0.25, 0.0], [0.0, 0.0, 0.0]])
    # gamma = lam = 1: returns are the reward to go, the score at the last token
    assert_close(a.returns, [[1.0, 1.0, 0.0], [0.75, 0.75, 0.75]])
    # advantages = returns - values = [0.5, 0.75, 0.75, 0.75, 0.75] on the mask, whitened
    raw = t([0.5, 0.75, 0.0], [0.75, 0.75, 0.75])
    assert_close(a.advantages, ppo.masked_whiten(raw, a.mask) * a.mask)
    assert float(ppo.masked_mean(a.advantages, a.mask)) == pytest.approx(0.0, abs=1e-7)
