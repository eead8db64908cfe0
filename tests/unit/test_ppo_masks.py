"""Masked rows in the PPO update (issue 35): a rollout whose reward could not be computed
(the reward answered None) gets no advantage and no loss, and no statistic counts it.

The expected numbers are computed here by hand, with plain floats over the rows that are
not masked; the masked row is given wild values (a NaN score, large log-probs and values)
that would show anywhere it leaked in.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

from ppo_client import ppo
from ppo_client.reporting import step_metrics
from ppo_client.reward import score_rollouts
from ppo_client.rollout import RolloutCollector
from ppo_client.streaming import NO_REASON, RewardInputs, Scores, join_scores, reorder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

EOS = 2
KL_COEF = 0.1
CLIP = 0.2
CLIP_VALUE = 0.2


def t(*rows: object) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def params(**overrides: object) -> ppo.AdvantageParams:
    values: dict[str, object] = {
        "reward_baseline": 0.0,
        "reward_scale": 1.0,
        "missing_eos_penalty": None,
        "eos_token_id": EOS,
        "kl_estimator": "k1",
        "kl_coef": KL_COEF,
        "whiten_rewards": False,
        "gamma": 1.0,
        "lam": 1.0,
    }
    values.update(overrides)
    return ppo.AdvantageParams(**values)  # type: ignore[arg-type]


# Four rollouts of up to 3 tokens; row 2 is masked (its reward could not be computed).
LENGTHS = [2, 3, 3, 1]  # real tokens per row (the stop token included)
LOGPROBS = [[-1.0, -2.0], [-0.5, -1.0, -1.5], [-9.0, -9.0, -9.0], [-0.25]]
REF_LOGPROBS = [[-1.5, -2.0], [-0.5, -0.5, -1.5], [-1.0, -1.0, -1.0], [-1.25]]
VALUES = [[0.5, 0.25], [0.0, -0.5, 0.25], [50.0, 50.0, 50.0], [1.0]]
SCORES = [1.0, -1.0, float("nan"), 2.0]
VALID = [True, True, False, True]
# The new policy's log-probs in the update (ratio exp(new - old) per token)
NEW_LOGPROBS = [[-0.7, -2.3], [-0.5, -0.9, -1.6], [0.0, 0.0, 0.0], [-0.05]]
VPRED = [[0.9, 0.0], [0.3, -0.2, 0.1], [-40.0, 7.0, 3.0], [1.5]]


def padded(rows: list[list[float]], fill: float = 0.0) -> torch.Tensor:
    return t(*(row + [fill] * (3 - len(row)) for row in rows))


def rollout(**overrides: Any) -> SimpleNamespace:
    values: dict[str, Any] = {
        "responses": torch.tensor([[5, EOS, 0], [5, 6, 7], [5, 6, EOS], [EOS, 0, 0]]),
        "seq_lengths": torch.tensor([n - 1 for n in LENGTHS]),
        "logprobs": padded(LOGPROBS),
        "ref_logprobs": padded(REF_LOGPROBS),
        "values": padded(VALUES),
        "raw_scores": t(*SCORES),
    }
    values.update(overrides)
    return SimpleNamespace(**values)


def hand_advantages() -> tuple[list[list[float]], list[list[float]]]:
    """Advantages and returns of the unmasked rows, worked token by token: k1 KL
    ``logp - ref``, per-token reward ``-kl_coef * kl`` plus the score on the last token,
    gamma = lam = 1 so that returns are rewards to go and advantages returns minus values,
    then whitened over the unmasked rows' tokens only (Bessel-corrected variance)."""
    returns, raw_advantages = [], []
    for i, ok in enumerate(VALID):
        if not ok:
            continue
        rewards = [
            -KL_COEF * (lp - ref) for lp, ref in zip(LOGPROBS[i], REF_LOGPROBS[i], strict=True)
        ]
        rewards[-1] += SCORES[i]
        to_go = [sum(rewards[k:]) for k in range(len(rewards))]
        returns.append(to_go)
        raw_advantages.append([g - v for g, v in zip(to_go, VALUES[i], strict=True)])
    flat = [x for row in raw_advantages for x in row]
    mean, var = statistics.mean(flat), statistics.variance(flat)
    whitened = [[(x - mean) / math.sqrt(var + 1e-8) for x in row] for row in raw_advantages]
    return whitened, returns


def with_masked_row(rows: list[list[float]]) -> torch.Tensor:
    """The unmasked rows' values at their places, 0 on the masked row and on padding."""
    it = iter(rows)
    return padded([next(it) if ok else [] for ok in VALID])


# ------------------------------------------------------------------------ advantages


def test_a_masked_row_has_no_advantage_and_the_others_are_whitened_without_it() -> None:
    a = ppo.compute_advantages(rollout(), params(), valid=torch.tensor(VALID))  # type: ignore[arg-type]
    advantages, returns = hand_advantages()
    assert a.valid.tolist() == VALID
    assert not a.mask[2].any(), "no token of the masked row is in the update"
    assert a.mask.sum(1).tolist() == [2, 3, 0, 1]
    for name in ("advantages", "returns", "values", "kl", "non_score_reward"):
        assert not getattr(a, name)[2].any(), name
    assert a.scores[2].item() == 0.0  # the NaN placeholder never reaches the rewards
    torch.testing.assert_close(a.advantages, with_masked_row(advantages))
    torch.testing.assert_close(a.returns, with_masked_row(returns))
    assert torch.isfinite(a.advantages).all() and torch.isfinite(a.returns).all()


def test_the_masked_row_changes_nothing_for_the_others() -> None:
    """The same batch without the masked row gives the other rows the same advantages."""
    a = ppo.compute_advantages(rollout(), params(), valid=torch.tensor(VALID))  # type: ignore[arg-type]
    keep = torch.tensor([0, 1, 3])
    r = rollout()
    three = rollout(**{k: getattr(r, k)[keep] for k in vars(r)})
    b = ppo.compute_advantages(three, params())  # type: ignore[arg-type]
    torch.testing.assert_close(a.advantages[keep], b.advantages)
    torch.testing.assert_close(a.returns[keep], b.returns)


def test_reward_whitening_is_over_the_unmasked_rows_only() -> None:
    a = ppo.compute_advantages(
        rollout(),  # type: ignore[arg-type]
        params(whiten_rewards=True, kl_coef=0.0),
        valid=torch.tensor(VALID),
    )
    # Rewards without KL: the score on each unmasked row's last token, 0 elsewhere; whitened
    # keeping their mean over the 6 unmasked tokens.
    raw = [[0.0, 1.0], [0.0, 0.0, -1.0], [0.0]]
    raw[2][-1] = 2.0
    flat = [x for row in raw for x in row]
    mean, var = statistics.mean(flat), statistics.variance(flat)
    rewards = [[(x - mean) / math.sqrt(var + 1e-8) + mean for x in row] for row in raw]
    returns = [[sum(row[k:]) for k in range(len(row))] for row in rewards]
    torch.testing.assert_close(a.returns, with_masked_row(returns))


def test_process_step_rewards_of_a_masked_row_are_left_out() -> None:
    steps = padded([[0.5, 0.0], [0.0, 1.0, 0.0], [7.0, 7.0, 7.0], [0.0]])
    a = ppo.compute_advantages(
        rollout(),  # type: ignore[arg-type]
        params(kl_coef=0.0),
        step_rewards=steps,
        valid=torch.tensor(VALID),
    )
    assert not a.returns[2].any() and not a.advantages[2].any()
    # row 0: steps 0.5 then the score 1 -> rewards to go [1.5, 1.0]
    torch.testing.assert_close(a.returns[0, :2], t(1.5, 1.0))


def test_a_rank_whose_rows_are_all_masked_has_zero_advantages() -> None:
    """Under accelerate one rank may get only masked rows while others have some: it still
    takes part (zero advantages, zero losses), it does not fail on whitening nothing."""
    valid = torch.zeros(4, dtype=torch.bool)
    a = ppo.compute_advantages(rollout(), params(whiten_rewards=True), valid=valid)  # type: ignore[arg-type]
    assert not a.mask.any() and not a.advantages.any() and not a.returns.any()
    # without masked rows, too few tokens is still the batch-size error it was
    one = rollout(**{k: v[3:] for k, v in vars(rollout()).items()})
    with pytest.raises(ValueError, match="at least 2"):
        ppo.compute_advantages(one, params())  # type: ignore[arg-type]


# ------------------------------------------------------------------------ losses


def test_the_losses_are_those_of_the_unmasked_rows_by_hand() -> None:
    a = ppo.compute_advantages(rollout(), params(), valid=torch.tensor(VALID))  # type: ignore[arg-type]
    advantages, returns = hand_advantages()
    kept = [i for i, ok in enumerate(VALID) if ok]
    # Policy: mean over the 6 unmasked tokens of max(-A r, -A clip(r, 0.8, 1.2)).
    terms = []
    for row, i in enumerate(kept):
        for k, adv in enumerate(advantages[row]):
            ratio = math.exp(NEW_LOGPROBS[i][k] - LOGPROBS[i][k])
            terms.append(max(-adv * ratio, -adv * min(max(ratio, 1 - CLIP), 1 + CLIP)))
    expected_pg = sum(terms) / len(terms)
    # Value: 0.5 * mean of max((V - R)^2, (clip(V, V_old +- 0.2) - R)^2).
    squares = []
    for row, i in enumerate(kept):
        for k, ret in enumerate(returns[row]):
            v, old = VPRED[i][k], VALUES[i][k]
            clipped = min(max(v, old - CLIP_VALUE), old + CLIP_VALUE)
            squares.append(max((v - ret) ** 2, (clipped - ret) ** 2))
    expected_vf = 0.5 * sum(squares) / len(squares)

    new_logprobs = padded(NEW_LOGPROBS).requires_grad_(True)
    vpred = padded(VPRED).requires_grad_(True)
    pg = ppo.policy_loss(new_logprobs, rollout().logprobs, a.advantages, a.mask, CLIP)
    vf = ppo.value_loss(vpred, a.values, a.returns, a.mask, CLIP_VALUE)
    assert pg.loss.item() == pytest.approx(expected_pg, abs=1e-9)
    assert vf.loss.item() == pytest.approx(expected_vf, abs=1e-9)
    (pg.loss + vf.loss).backward()
    assert new_logprobs.grad is not None and vpred.grad is not None
    assert not new_logprobs.grad[2].any() and not vpred.grad[2].any()
    assert new_logprobs.grad[[0, 1, 3]].any() and vpred.grad[[0, 1, 3]].any()


def test_a_micro_batch_of_masked_rows_only_has_a_zero_loss_not_nan() -> None:
    a = ppo.compute_advantages(rollout(), params(), valid=torch.tensor(VALID))  # type: ignore[arg-type]
    idx = torch.tensor([2])
    new_logprobs = padded(NEW_LOGPROBS)[idx].requires_grad_(True)
    vpred = padded(VPRED)[idx].requires_grad_(True)
    pg = ppo.policy_loss(
        new_logprobs, rollout().logprobs[idx], a.advantages[idx], a.mask[idx], CLIP
    )
    vf = ppo.value_loss(vpred, a.values[idx], a.returns[idx], a.mask[idx], CLIP_VALUE)
    (pg.loss + vf.loss).backward()
    assert pg.loss.item() == 0.0 and vf.loss.item() == 0.0
    assert new_logprobs.grad is not None and vpred.grad is not None
    assert not new_logprobs.grad.any() and not vpred.grad.any()
    for value in (pg.clipfrac, pg.approxkl, pg.ratio, vf.clipfrac):
        assert math.isfinite(value.item())


def test_without_masked_rows_everything_is_bit_for_bit_as_before() -> None:
    """valid all true gives exactly the tensors of the call without it, and the losses'
    zero-safe mean is exactly the masked mean wherever a token is unmasked."""
    gen = torch.Generator().manual_seed(0)
    r = rollout(
        raw_scores=torch.randn(4, generator=gen, dtype=torch.float64),
        values=torch.randn(4, 3, generator=gen, dtype=torch.float64),
    )
    for p in (params(), params(whiten_rewards=True, missing_eos_penalty=0.5)):
        before = ppo.compute_advantages(r, p)  # type: ignore[arg-type]
        after = ppo.compute_advantages(r, p, valid=torch.ones(4, dtype=torch.bool))  # type: ignore[arg-type]
        for name in ppo.Advantages._fields:
            assert torch.equal(getattr(before, name), getattr(after, name)), name
    values = torch.randn(5, 7, generator=gen)
    mask = torch.rand(5, 7, generator=gen) > 0.5
    assert torch.equal(ppo.masked_mean_or_zero(values, mask), ppo.masked_mean(values, mask))


def test_micro_batch_scales_average_over_the_micro_batches_with_rows() -> None:
    # 2 ranks, 1 epoch, 3 mini-batches of 2 micro-batches each: tokens per micro-batch
    tokens = torch.tensor(
        [
            [[[5, 3], [0, 4], [0, 0]]],  # rank 0
            [[[2, 2], [1, 0], [0, 0]]],  # rank 1
        ]
    )
    scales = ppo.micro_batch_scales(tokens)
    # mini-batch 0: all 4 have rows -> 1; mini-batch 1: 2 of 4 -> 4 / 2; mini-batch 2: none
    # (a step's gradient, sum(scale * grad) / (ranks * micro-batches), is then the mean
    # over the micro-batches with rows)
    assert scales.tolist() == [[1.0, 2.0, 0.0]]


# ------------------------------------------------------------------------ statistics


class OneRank:
    """What step_metrics needs of an Accelerator, for a single process."""

    device = torch.device("cpu")

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor


def test_statistics_leave_the_masked_row_and_its_micro_batches_out() -> None:
    r = rollout(
        truncated=[False, True, True, False],
        reward_wait_s=0.0,
        generate_s=0.0,
        reward_tail_s=0.0,
        engine_logprobs=None,
        step_scores=None,
    )
    a = ppo.compute_advantages(r, params(), valid=torch.tensor(VALID))  # type: ignore[arg-type]
    stats = ppo.UpdateStats.zeros((1, 1, 3), torch.device("cpu"))
    losses = [(0.25, 2.0), (99.0, 99.0), (0.75, 4.0)]  # the middle one: masked rows only
    for k, ((pg_loss, vf_loss), tokens) in enumerate(zip(losses, [3, 0, 3], strict=True)):
        one = torch.tensor(1.0)
        pg = ppo.PolicyLoss(torch.tensor(pg_loss), one * 0.1, one * 0.01, one)
        vf = ppo.ValueLoss(torch.tensor(vf_loss), one * 0.2)
        stats.record((0, 0, k), pg, vf, torch.tensor(1.5), tokens=torch.tensor(tokens))
    m = step_metrics(OneRank(), r, a, stats, lr=1e-3, episode=4)  # type: ignore[arg-type]
    assert m["objective/raw_scores"] == pytest.approx((1.0 - 1.0 + 2.0) / 3)
    assert m["objective/scores"] == pytest.approx((1.0 - 1.0 + 2.0) / 3)
    kl = [
        sum(lp - ref for lp, ref in zip(LOGPROBS[i], REF_LOGPROBS[i], strict=True))
        for i in (0, 1, 3)
    ]
    assert m["objective/kl"] == pytest.approx(sum(kl) / 3)
    assert m["objective/non_score_reward"] == pytest.approx(-KL_COEF * sum(kl) / 3)
    entropy = [-sum(LOGPROBS[i]) for i in (0, 1, 3)]
    assert m["objective/entropy"] == pytest.approx(sum(entropy) / 3)
    assert m["val/response_length"] == pytest.approx((2 + 3 + 1) / 3)
    assert m["val/num_eos_tokens"] == 2  # rows 0 and 3 (row 2's EOS is not counted)
    assert m["reward/truncated_frac"] == pytest.approx(1 / 3)
    assert m["loss/policy_avg"] == pytest.approx(0.5)
    assert m["loss/value_avg"] == pytest.approx(3.0)
    assert m["val/ratio_var"] == 0.0
    assert all(math.isfinite(v) for v in m.values()), m


class Recorder(OneRank):
    """One rank that keeps what it gave to each gather."""

    def __init__(self) -> None:
        self.given: list[torch.Tensor] = []

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        self.given.append(tensor)
        return tensor


class TwoRanks(OneRank):
    """Rank 0 of two: each gather returns this rank's tensor and the other's (recorded)."""

    def __init__(self, other: list[torch.Tensor]) -> None:
        self.other = iter(other)

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return torch.cat([tensor, next(self.other)])


def metrics_of(acc: Any, valid: list[bool], tokens: list[int]) -> dict[str, Any]:
    r = rollout(
        truncated=None,
        reward_wait_s=0.0,
        generate_s=0.0,
        reward_tail_s=0.0,
        engine_logprobs=None,
        step_scores=None,
    )
    a = ppo.compute_advantages(r, params(), valid=torch.tensor(valid))  # type: ignore[arg-type]
    stats = ppo.UpdateStats.zeros((1, 1, 2), torch.device("cpu"))
    for k, n in enumerate(tokens):
        one = torch.tensor(1.0 + k)
        pg = ppo.PolicyLoss(one, one * 0.1, one * 0.01, one)
        stats.record((0, 0, k), pg, ppo.ValueLoss(one, one), one, tokens=torch.tensor(n))
    return step_metrics(acc, r, a, stats, lr=1e-3, episode=8)


def test_a_rank_whose_rows_are_all_masked_is_left_out_of_the_average_over_ranks() -> None:
    other = Recorder()
    metrics_of(other, [False] * 4, [0, 0])  # rank 1: every row masked, no micro-batch counted
    both = metrics_of(TwoRanks(other.given), VALID, [3, 3])
    alone = metrics_of(OneRank(), VALID, [3, 3])
    assert both == pytest.approx(alone)
    assert all(math.isfinite(v) for v in both.values()), both


# ------------------------------------------------------------------------ scores


def test_none_scores_pass_with_their_reasons() -> None:
    inputs = RewardInputs(["a", "b", "c"], ["x", "y", "z"])
    plain = score_rollouts(lambda p, r: [1.0, None, 0.5], inputs)
    assert plain.scores == [1.0, None, 0.5]
    assert plain.masked == [None, NO_REASON, None]
    assert score_rollouts(lambda p, r: [1, 2, 3], inputs).masked is None

    class Client:
        """A RewardClient's answer shape, with its reasons."""

        def score_pairs_detailed(self, prompts: list[str], responses: list[str]) -> Any:
            return SimpleNamespace(
                scores=[None, 0.25, None],
                truncated=[False, False, False],
                masked=["timeout", None, "crash"],
            )

    detailed = score_rollouts(Client(), inputs)  # type: ignore[arg-type]
    assert detailed.scores == [None, 0.25, None]
    assert detailed.masked == ["timeout", None, "crash"]
    with pytest.raises(ValueError, match="non-finite"):
        score_rollouts(lambda p, r: [1.0, float("nan"), None], inputs)


def test_chunks_with_and_without_masked_items_join_and_reorder() -> None:
    first = Scores([1.0, None], None, masked=[None, "deadline"])
    second = Scores([2.0, 3.0], None)
    joined = join_scores([first, second])
    assert joined.scores == [1.0, None, 2.0, 3.0]
    assert joined.masked == [None, "deadline", None, None]
    assert join_scores([second, second]).masked is None
    back = reorder(joined, [3, 2, 1, 0])
    assert back.scores == [3.0, 2.0, None, 1.0] and back.masked == [None, None, "deadline", None]


@pytest.fixture(scope="module")
def tokenizer(gpt2_policy: Path) -> Any:
    return AutoTokenizer.from_pretrained(gpt2_policy)


def test_outcome_rewards_carry_which_rows_are_valid() -> None:
    scored = Scores([0.5, None, -1.0], None, masked=[None, "timeout", None])
    responses = torch.zeros(3, 4, dtype=torch.long)
    self: Any = SimpleNamespace(
        config=SimpleNamespace(reward_mode="outcome"),
        accelerator=SimpleNamespace(device=torch.device("cpu")),
    )
    out = RolloutCollector._rewards(self, scored, responses, torch.zeros(3, dtype=torch.long))
    assert out["valid"].tolist() == [True, False, True]
    assert out["raw_scores"].tolist() == [0.5, 0.0, -1.0]


def test_a_masked_item_masks_its_whole_row_in_process_mode(tokenizer: Any) -> None:
    ids = [tokenizer(text)["input_ids"] for text in ("one. two.", "three. four.")]
    width = max(len(x) for x in ids)
    responses = torch.tensor([x + [0] * (width - len(x)) for x in ids])
    seq_lengths = torch.tensor([len(x) - 1 for x in ids])
    scored = Scores(
        scores=[1.5, None],
        truncated=None,
        step_scores=[[0.5, 1.0], None],
        step_ends=[[4, 9], None],
        outcome_scores=[0.25, None],
        masked=[None, "parse_failure"],
    )
    self: Any = SimpleNamespace(tokenizer=tokenizer)
    out = RolloutCollector._process_rewards(self, scored, responses, seq_lengths)
    assert out["valid"].tolist() == [True, False]
    assert out["raw_scores"].tolist() == [0.25, 0.0]
    assert out["step_scores"] == [[0.5, 1.0], []] and out["step_tokens"][1] == []
    assert not out["step_rewards"][1].any() and out["step_rewards"][0].sum().item() == 1.5
    # A missing step list masks the row as well, whatever its score.
    scored = scored._replace(scores=[1.5, 2.0], outcome_scores=None)
    out = RolloutCollector._process_rewards(self, scored, responses, seq_lengths)
    assert out["valid"].tolist() == [True, False]


# ------------------------------------------------------------------------ ppo-client score


class MaskingClient:
    """A RewardClient whose server masked the second item."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> MaskingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def score_detailed(self, **kwargs: Any) -> Any:
        return SimpleNamespace(
            scores=[0.5, None],
            tokens=[3, 2],
            truncated=[False, False],
            masked=[None, "timeout"],
        )


def test_ppo_client_score_prints_a_masked_item(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import reward_client
    from ppo_client import cli

    monkeypatch.setattr(reward_client, "RewardClient", MaskingClient)
    assert cli.main(["score", "--reward-url", "http://rm.test", "a", "b"]) == 0
    assert capsys.readouterr().out.splitlines() == ["0.5", "masked (timeout)"]
    assert cli.main(["score", "--reward-url", "http://rm.test", "--json", "a", "b"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["scores"] == [0.5, None] and answer["masked"] == [None, "timeout"]
