"""Pure tensor maths of RLHF PPO: masks, whitening, KL penalty, GAE and the clipped losses.

Conventions: ``B`` is the batch, ``T`` the response length. A response ``mask`` is ``True`` on
the real response tokens, i.e. positions ``0..sequence_length`` (the stop token included), and
``False`` on the padding after it. ``values[:, t]`` is the critic's estimate of the state just
before response token ``t`` is emitted, ``logprobs[:, t]`` the log-probability of that token.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

import torch

KLEstimator = Literal["k1", "k3"]

logger = logging.getLogger(__name__)

__all__ = [
    "AdvantageParams",
    "Advantages",
    "KLEstimator",
    "PolicyLoss",
    "ScoredRollout",
    "UpdateStats",
    "ValueLoss",
    "compute_advantages",
    "compute_gae",
    "contains_token",
    "entropy_from_logits",
    "first_true_indices",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_mean_or_zero",
    "masked_var",
    "masked_whiten",
    "micro_batch_scales",
    "per_token_rewards",
    "policy_loss",
    "response_mask",
    "sequence_lengths",
    "truncate_response",
    "value_loss",
]


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is true (over ``dim`` if given)."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum()
    return (values * mask).sum(dim) / mask.sum(dim)


def masked_mean_or_zero(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """:func:`masked_mean`, but 0 (with a zero gradient, not NaN) where ``mask`` is all false:
    a micro-batch whose rows the reward all masked adds nothing to the update. Where some
    position is unmasked it is exactly :func:`masked_mean` (``clamp`` leaves a count >= 1
    as it is)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over the masked positions, Bessel-corrected when ``unbiased``."""
    count = mask.sum()
    if count < 2:
        raise ValueError(
            f"masked_var needs at least 2 unmasked values, got {int(count)}; "
            "use a larger batch (per_device_train_batch_size * gradient_accumulation_steps)"
        )
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        var = var * count / (count - 1)
    return var


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise to unit variance over the masked positions; zero mean unless not ``shift_mean``."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        # Scale only: keep the original mean (used for rewards, whose sign carries meaning).
        whitened = whitened + mean
    return whitened


def first_true_indices(bools: torch.Tensor) -> torch.Tensor:
    """Index of the first true entry of each row of ``bools`` (B, T), or ``T`` when there is none."""
    length = bools.size(-1)
    positions = torch.arange(length, device=bools.device).expand_as(bools)
    # Where false, push the index past the end so that the row minimum is the first true one.
    return torch.where(bools, positions, torch.full_like(positions, length)).min(-1).values


def truncate_response(
    responses: torch.Tensor, stop_token_id: int, pad_token_id: int
) -> torch.Tensor:
    """Replace every token after the first ``stop_token_id`` (kept) with ``pad_token_id``."""
    stop_at = first_true_indices(responses == stop_token_id).unsqueeze(-1)  # (B, 1)
    positions = torch.arange(responses.size(-1), device=responses.device)
    return responses.masked_fill(positions > stop_at, pad_token_id)


def sequence_lengths(responses: torch.Tensor, stop_token_id: int | None) -> torch.Tensor:
    """Index of each response's last real token (B,): its first stop token, else ``T - 1``."""
    last = responses.size(-1) - 1
    if stop_token_id is None:
        return torch.full(responses.shape[:1], last, dtype=torch.long, device=responses.device)
    return first_true_indices(responses == stop_token_id).clamp(max=last)


def response_mask(seq_lengths: torch.Tensor, length: int) -> torch.Tensor:
    """Mask (B, T) that is true on positions ``0..seq_lengths`` of each row."""
    positions = torch.arange(length, device=seq_lengths.device)
    return positions.unsqueeze(0) <= seq_lengths.unsqueeze(-1)


def contains_token(
    responses: torch.Tensor, token_id: int | None, mask: torch.Tensor
) -> torch.Tensor:
    """Whether each response (B,) holds ``token_id`` among its real tokens (false if None)."""
    if token_id is None:
        return torch.zeros(responses.size(0), dtype=torch.bool, device=responses.device)
    return ((responses == token_id) & mask).any(-1)


def logprobs_from_logits(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Log-probability (B, T) of ``tokens`` (B, T) under ``logits`` (B, T, V)."""
    logits = logits.float()
    picked = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    # log softmax at one index = logit - logsumexp, without materialising the (B, T, V) result.
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (B, T) of the categorical distributions given by ``logits`` (B, T, V)."""
    logits = logits.float()
    probs = torch.softmax(logits, dim=-1)
    # H = logsumexp(z) - sum_i p_i z_i
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)


def kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    estimator: KLEstimator = "k1",
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled-token log-probs (B, T)."""
    # log r = log p_ref(x) - log p(x), with x sampled from the policy (joschu.net/blog/kl-approx).
    log_ratio = ref_logprobs - logprobs
    if estimator == "k1":
        kl = -log_ratio
    elif estimator == "k3":
        kl = torch.expm1(log_ratio) - log_ratio  # (r - 1) - log r >= 0
    else:
        raise ValueError(f"kl_estimator must be 'k1' or 'k3', got {estimator!r}")
    if mask is not None:
        kl = kl * mask.to(kl.dtype)
    return kl


def per_token_rewards(
    kl: torch.Tensor, scores: torch.Tensor, seq_lengths: torch.Tensor, kl_coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """KL-penalised rewards (B, T) with each score added at its last response token; also the
    penalty alone (the ``non_score_reward``)."""
    non_score_reward = -kl_coef * kl  # (B, T)
    rewards = non_score_reward.clone()
    rows = torch.arange(rewards.size(0), device=rewards.device)
    # The reward model judges the finished response: the score is the reward of its last action.
    rewards[rows, seq_lengths] += scores.to(rewards.dtype)
    return rewards, non_score_reward


def compute_gae(
    values: torch.Tensor,
    rewards: torch.Tensor,
    gamma: float,
    lam: float,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates and returns (both B, T) by the backward recursion."""
    if mask is not None:
        # Positions after the last token are beyond the terminal state: value and reward 0.
        values = values * mask.to(values.dtype)
        rewards = rewards * mask.to(rewards.dtype)
    length = rewards.size(1)
    last_gae = torch.zeros_like(rewards[:, 0])
    advantages_reversed = []
    for t in reversed(range(length)):
        next_values = values[:, t + 1] if t < length - 1 else torch.zeros_like(values[:, t])
        # delta_t = r_t + gamma * V(s_{t+1}) - V(s_t);  A_t = delta_t + gamma * lam * A_{t+1}
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        last_gae = delta + gamma * lam * last_gae
        advantages_reversed.append(last_gae)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)
    returns = advantages + values
    return advantages, returns


class PolicyLoss(NamedTuple):
    """Clipped surrogate loss and its diagnostics (scalars)."""

    loss: torch.Tensor
    clipfrac: torch.Tensor
    approxkl: torch.Tensor
    ratio: torch.Tensor


class ValueLoss(NamedTuple):
    """Clipped value loss (already scaled by 0.5) and the fraction of clipped positions."""

    loss: torch.Tensor
    clipfrac: torch.Tensor


def policy_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cliprange: float,
    weights: torch.Tensor | None = None,
) -> PolicyLoss:
    """PPO clipped surrogate: masked mean of max(-A * r, -A * clip(r, 1 - eps, 1 + eps)),
    each token's term times its ``weights`` (a constant, e.g. :func:`truncated_is_weights`)
    when given."""
    log_ratio = new_logprobs - old_logprobs  # (B, T)
    ratio = torch.exp(log_ratio)
    pg_losses = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    per_token = torch.max(pg_losses, pg_losses2)
    if weights is not None:
        per_token = per_token * weights.detach()
    # Masked rows (no reward) and padding have no term; a micro-batch with no unmasked
    # token at all gives a zero loss (and zero diagnostics, which the statistics leave out).
    loss = masked_mean_or_zero(per_token, mask)
    with torch.no_grad():
        clipfrac = masked_mean_or_zero((pg_losses2 > pg_losses).float(), mask)
        approxkl = 0.5 * masked_mean_or_zero(log_ratio**2, mask)
        mean_ratio = masked_mean_or_zero(ratio, mask)
    return PolicyLoss(loss, clipfrac, approxkl, mean_ratio)


def truncated_is_weights(
    trainer_logprobs: torch.Tensor, engine_logprobs: torch.Tensor, cap: float
) -> torch.Tensor:
    """Truncated importance weights for tokens sampled by another engine (vLLM) whose
    probabilities differ a little from the trainer's: ``min(pi_trainer / pi_engine, cap)``
    per token, ``exp(trainer - engine)`` in log space, as a constant of the loss."""
    return torch.exp(trainer_logprobs - engine_logprobs).clamp(max=cap).detach()


def value_loss(
    vpred: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float,
) -> ValueLoss:
    """Clipped value loss: 0.5 * masked mean of max((V - R)^2, (clip(V, V_old +- eps) - R)^2)."""
    vpred_clipped = torch.clamp(vpred, old_values - cliprange_value, old_values + cliprange_value)
    vf_losses1 = torch.square(vpred - returns)
    vf_losses2 = torch.square(vpred_clipped - returns)
    loss = 0.5 * masked_mean_or_zero(torch.max(vf_losses1, vf_losses2), mask)
    with torch.no_grad():
        clipfrac = masked_mean_or_zero((vf_losses2 > vf_losses1).float(), mask)
    return ValueLoss(loss, clipfrac)


# ================================================================================= one update


class ScoredRollout(Protocol):
    """What advantages are computed from: a batch of scored rollouts (B rows, T tokens)."""

    responses: torch.Tensor  # (B, T), padding after the stop token
    seq_lengths: torch.Tensor  # (B,), index of each response's last token
    logprobs: torch.Tensor  # (B, T), policy at rollout time
    ref_logprobs: torch.Tensor  # (B, T)
    values: torch.Tensor  # (B, T)
    raw_scores: torch.Tensor  # (B,), as the reward returned them


@dataclass(frozen=True)
class AdvantageParams:
    """How scores become per-token rewards and advantages (the PPOConfig options of the same
    names; ``eos_token_id`` is the token whose absence costs ``missing_eos_penalty``)."""

    reward_baseline: float
    reward_scale: float
    missing_eos_penalty: float | None
    eos_token_id: int | None
    kl_estimator: KLEstimator
    kl_coef: float
    whiten_rewards: bool
    gamma: float
    lam: float


class Advantages(NamedTuple):
    """Per-token rewards, advantages and returns of a batch of rollouts, with their parts.

    Rows the reward masked (``valid`` false: no score could be computed) are out of the
    update: ``mask`` is false on all their tokens, and their scores, KL, values,
    advantages and returns are 0.
    """

    mask: torch.Tensor  # (B, T) response mask, false on every token of a masked row
    scores: torch.Tensor  # (B,) transformed scores (0 on masked rows)
    has_eos: torch.Tensor  # (B,) whether the response holds the EOS (stop) token
    kl: torch.Tensor  # (B, T) per-token KL estimate, masked
    non_score_reward: torch.Tensor  # (B, T) the KL penalty alone
    values: torch.Tensor  # (B, T) masked rollout values
    advantages: torch.Tensor  # (B, T) whitened, masked
    returns: torch.Tensor  # (B, T)
    valid: torch.Tensor  # (B,) bool: false where the reward masked the row


def _whiten(
    values: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool, rows_masked: bool
) -> torch.Tensor:
    """:func:`masked_whiten` times ``mask``. When the reward masked rows, the positions left
    may be too few to whiten (a rank of a multi-process run whose rows were all masked):
    then the values are 0, the rows contribute nothing. Without masked rows too few
    positions are the batch-size error of :func:`masked_var`, as before."""
    if rows_masked and int(mask.sum()) < 2:
        logger.debug("fewer than 2 unmasked tokens on this rank: nothing to whiten")
        return torch.zeros_like(values)
    return masked_whiten(values, mask, shift_mean=shift_mean) * mask


@torch.no_grad()
def compute_advantages(
    r: ScoredRollout,
    p: AdvantageParams,
    *,
    scores: torch.Tensor | None = None,
    step_rewards: torch.Tensor | None = None,
    valid: torch.Tensor | None = None,
) -> Advantages:
    """Scores -> per-token rewards -> GAE advantages and returns (all masked).

    ``scores`` (B,) replaces ``r.raw_scores`` (the running-normalised scores);
    ``step_rewards`` (B, T), a process reward model's step scores on their tokens, are
    added to the per-token rewards times ``reward_scale`` (no baseline: it is per response).
    ``valid`` (B,) bool, false on the rows whose reward was masked: those rows get no
    reward, no advantage, no return, and the reward and advantage whitening are computed
    over the other rows' tokens only. Without masked rows the result is bit for bit the
    one without ``valid``.
    """
    mask = response_mask(r.seq_lengths, r.responses.size(1))  # (B, T)
    has_eos = contains_token(r.responses, p.eos_token_id, mask)  # (B,)
    if valid is None:
        valid = torch.ones_like(r.seq_lengths, dtype=torch.bool)
    valid = valid.to(device=mask.device, dtype=torch.bool)
    rows_masked = not bool(valid.all())
    # A masked row has no token in the update: every masked mean, the whitening, GAE (which
    # zeroes rewards and values off the mask) and the losses then leave it out.
    mask = mask & valid.unsqueeze(-1)
    raw = r.raw_scores if scores is None else scores
    # score' = (score - baseline) * scale, minus the penalty where the response never ended
    scores = (raw - p.reward_baseline) * p.reward_scale  # (B,)
    if p.missing_eos_penalty is not None:
        scores = torch.where(has_eos, scores, scores - p.missing_eos_penalty)
    # A masked row's score is a placeholder (any value, NaN too): 0, so that nothing of it
    # reaches the rewards (NaN * 0 would still be NaN).
    scores = torch.where(valid, scores, torch.zeros_like(scores))
    kl = kl_penalty(r.logprobs, r.ref_logprobs, p.kl_estimator, mask)  # (B, T)
    rewards, non_score_reward = per_token_rewards(kl, scores, r.seq_lengths, p.kl_coef)
    if step_rewards is not None:
        # Dense rewards: r_t += scale * (sum of the scores of the steps ending at token t).
        rewards = rewards + step_rewards.to(rewards.dtype) * p.reward_scale * mask
    if p.whiten_rewards:
        rewards = _whiten(rewards, mask, shift_mean=False, rows_masked=rows_masked)
    values = r.values * mask
    advantages, returns = compute_gae(values, rewards, p.gamma, p.lam, mask)
    advantages = _whiten(advantages, mask, shift_mean=True, rows_masked=rows_masked)
    return Advantages(
        mask, scores, has_eos, kl, non_score_reward, values, advantages, returns, valid
    )


def micro_batch_scales(tokens: torch.Tensor) -> torch.Tensor:
    """How much each micro-batch's loss counts when the reward masked rows.

    ``tokens`` (ranks, epochs, mini-batches, micro-batches) holds each micro-batch's number
    of tokens in the update on every rank. An optimiser step averages the gradients of its
    ``ranks * micro-batches`` micro-batches (accelerate divides each loss by the
    accumulation steps, DDP averages over ranks); one whose rows are all masked has a zero
    loss, which would shrink that average. So the others' losses are multiplied by
    ``ranks * micro-batches / (those with tokens)``: the step is the mean over the
    micro-batches that have rows. Returns (epochs, mini-batches); 1 where none is empty,
    0 where all are (that mini-batch takes no step: Adam would still move the weights
    with its momentum).
    """
    total = tokens.size(0) * tokens.size(3)
    with_rows = (tokens > 0).sum(dim=(0, 3))  # (epochs, mini-batches)
    scales = total / with_rows.clamp(min=1).to(torch.float64)
    return torch.where(with_rows > 0, scales, torch.zeros_like(scales))


@dataclass
class UpdateStats:
    """Statistics of every micro-batch of one update, each (epochs, mini-batches, micro-batches).

    ``tokens`` counts each micro-batch's tokens in the update: 0 where the reward masked all
    of its rows, and then its other statistics are 0 placeholders that :meth:`mean` leaves
    out.
    """

    approxkl: torch.Tensor
    pg_clipfrac: torch.Tensor
    pg_loss: torch.Tensor
    vf_loss: torch.Tensor
    vf_clipfrac: torch.Tensor
    entropy: torch.Tensor
    ratio: torch.Tensor
    tokens: torch.Tensor

    @classmethod
    def zeros(cls, shape: tuple[int, int, int], device: torch.device) -> UpdateStats:
        """All statistics zero."""
        return cls(*(torch.zeros(shape, device=device) for _ in dataclasses.fields(cls)))

    @torch.no_grad()
    def record(
        self,
        at: tuple[int, int, int],
        pg: PolicyLoss,
        vf: ValueLoss,
        entropy: torch.Tensor,
        tokens: torch.Tensor | None = None,
    ) -> None:
        """Store one micro-batch's losses, their diagnostics, its mean entropy and (when
        given; else 1) its number of tokens in the update at ``at``."""
        self.approxkl[at] = pg.approxkl
        self.pg_clipfrac[at] = pg.clipfrac
        self.pg_loss[at] = pg.loss.detach()
        self.vf_loss[at] = vf.loss.detach()
        self.vf_clipfrac[at] = vf.clipfrac
        self.entropy[at] = entropy
        self.ratio[at] = pg.ratio
        self.tokens[at] = 1.0 if tokens is None else tokens

    def counted(self) -> torch.Tensor:
        """Which micro-batches took part in the update (bool, the statistics' shape)."""
        return self.tokens > 0

    def mean(self, stat: torch.Tensor) -> torch.Tensor:
        """Mean of ``stat`` over the micro-batches that took part (NaN if none did); the
        plain mean when all did."""
        counted = self.counted()
        if bool(counted.all()):
            return stat.mean()
        return stat[counted].mean()
