"""The reward side of a rollout: what the reward function gets (:class:`RewardInputs`, the
texts :func:`reward_inputs` decodes) and answers (:class:`Scores`), and the machinery that
streams rows to it while the others still generate: :class:`FinishedRows` (a ``generate``
stopping-criterion hook), :class:`Batch` (the requests in flight for one update's prompts)
and the helpers that put streamed scores back in row order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

import torch
from transformers import PreTrainedTokenizerBase, StoppingCriteria

if TYPE_CHECKING:
    from ppo_client.rollout import Prompt

__all__ = [
    "Batch",
    "FinishedRows",
    "RewardInputs",
    "ScoreFn",
    "Scores",
    "join_scores",
    "reorder",
    "reward_inputs",
    "row_order",
]


@dataclass
class RewardInputs:
    """What the reward function gets: the prompts, the decoded responses and, with
    ``label_column``, each prompt's label."""

    prompts: list[Prompt]
    responses: list[str]
    labels: list[Any] | None = None


def reward_inputs(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Prompt],
    query_ids: torch.Tensor,
    query_mask: torch.Tensor,
    responses: torch.Tensor,
    seq_lengths: torch.Tensor,
) -> RewardInputs:
    """Text for the reward model: chat prompts as their original messages, text prompts as the
    policy saw them, responses up to their stop token; no special tokens, no chat markup."""
    response_rows = [
        row[: int(n) + 1].tolist()
        for row, n in zip(responses.cpu(), seq_lengths.cpu(), strict=True)
    ]
    response_texts = tokenizer.batch_decode(response_rows, skip_special_tokens=True)
    out: list[Prompt] = []
    text_rows = [
        ids[mask.bool()].tolist()
        for ids, mask in zip(query_ids.cpu(), query_mask.cpu(), strict=True)
    ]
    for prompt, ids in zip(prompts, text_rows, strict=True):
        if isinstance(prompt, str):
            out.append(tokenizer.decode(ids, skip_special_tokens=True))
        else:
            out.append([dict(m) for m in prompt])
    return RewardInputs(out, list(response_texts))


class Scores(NamedTuple):
    """The reward's scores of some rollouts and, when it reports them, which inputs it
    truncated and a process reward model's steps (scores, end offsets into each response,
    and the sequence models' outcome scores)."""

    scores: list[float]
    truncated: list[bool] | None
    step_scores: list[list[float]] | None = None
    step_ends: list[list[int]] | None = None
    outcome_scores: list[float] | None = None


#: Scores the decoded rollouts of one chunk (called on the reward worker thread).
ScoreFn: TypeAlias = Callable[[RewardInputs], Scores]


def join_scores(results: Sequence[Scores]) -> Scores:
    """The chunks' scores in order; truncation flags and steps only if every chunk
    reported them."""

    def joined(column: int) -> list[Any] | None:
        parts = [r[column] for r in results]
        if any(part is None for part in parts):
            return None
        return [x for part in parts for x in part]

    truncated = joined(1)
    return Scores(
        [s for r in results for s in r.scores],
        None if truncated is None else [bool(x) for x in truncated],
        *(joined(column) for column in range(2, len(Scores._fields))),
    )


@dataclass
class Batch:
    """One update's prompts on their way through the rollout, and the reward requests sent
    for them: ``groups[k]`` holds the rows whose scores ``futures[k]`` brings."""

    prompts: list[Prompt]
    queries: torch.Tensor  # (B, P) left-padded
    query_mask: torch.Tensor
    labels: list[Any] | None
    pool: Executor
    futures: list[Future[Scores]] = field(default_factory=list)
    groups: list[list[int]] = field(default_factory=list)
    sent: list[RewardInputs] = field(default_factory=list)  # what futures[k] scores

    def texts(self) -> RewardInputs:
        """What the reward saw of every rollout, in prompt order (decoded once, when sent)."""
        order = row_order([row for group in self.groups for row in group])
        prompts = [p for inputs in self.sent for p in inputs.prompts]
        responses = [r for inputs in self.sent for r in inputs.responses]
        return RewardInputs([prompts[k] for k in order], [responses[k] for k in order], self.labels)

    engine_logprobs: torch.Tensor | None = None
    generate_s: float = 0.0  # sampling (with the engine's weight sync) and decoding
    sampled_at: float = 0.0  # perf_counter when the last row was sampled
    scored_at: list[float] = field(default_factory=list)  # perf_counter of each answer

    def tail(self) -> float:
        """Seconds from the end of sampling to the reward's last score: the reward work
        left when generation ended, whether the passes then hid it or not (all futures
        done)."""
        return max(0.0, max(self.scored_at, default=self.sampled_at) - self.sampled_at)


def row_order(rows: Sequence[int]) -> list[int]:
    """For values given in the order of ``rows`` (a permutation of 0..B-1): where row 0,
    1, ... of them is."""
    where = {row: k for k, row in enumerate(rows)}
    return [where[row] for row in range(len(rows))]


def reorder(scored: Scores, rows: Sequence[int]) -> Scores:
    """Scores given for ``rows`` (in that order) back in row order 0..B-1."""
    if list(rows) == sorted(rows):
        return scored
    order = row_order(rows)
    return Scores(*(None if col is None else [col[k] for k in order] for col in scored))


class FinishedRows(StoppingCriteria):
    """Hands ``on_finished`` the rows of a ``generate`` call that have emitted the stop token,
    ``group_size`` at a time (row indices in that call, and their responses so far padded to
    ``response_length``: what the finished generation will hold for them), while the other
    rows keep generating. It never stops a row itself: ``generate``'s own EOS and length
    criteria decide that, exactly as without it; ``pending`` are the finished rows not yet
    handed over when generation ends.

    A row is finished at its first stop token, the token :func:`ppo.sequence_lengths` cuts
    the response after, so a row sent now is decoded exactly as after ``generate``. (No
    ``eos_token_id`` attribute: ``generate`` would take that for an EOS criterion.)
    """

    def __init__(
        self,
        stop_token_id: int,
        context: int,
        response_length: int,
        pad_token_id: int,
        group_size: int,
        on_finished: Callable[[list[int], torch.Tensor], None],
    ) -> None:
        self.stop_token_id = stop_token_id
        self.context = context  # prompt width: the response starts at this column
        self.response_length = response_length
        self.pad_token_id = pad_token_id
        self.group_size = group_size
        self.on_finished = on_finished
        self.done: torch.Tensor | None = None  # (b,) rows that have emitted the stop token
        self.pending: list[int] = []
        self.sent: list[int] = []

    def __call__(
        self, input_ids: torch.Tensor, scores: torch.Tensor | None, **kwargs: Any
    ) -> torch.Tensor:
        if self.done is None:
            self.done = torch.zeros(input_ids.size(0), dtype=torch.bool, device=input_ids.device)
        # After its stop token generate pads a row with the pad id, which may be the stop
        # token itself (pad == EOS): only a row's first stop token finishes it.
        fresh = input_ids[:, -1].eq(self.stop_token_id) & ~self.done
        # On a GPU this reads one flag per step; generate's own stop check reads one too.
        if bool(fresh.any()):
            self.done |= fresh
            self.pending += fresh.nonzero().flatten().tolist()
            while len(self.pending) >= self.group_size:
                rows, self.pending = (
                    self.pending[: self.group_size],
                    self.pending[self.group_size :],
                )
                self.on_finished(rows, self._responses(input_ids, rows))
                self.sent += rows
        return torch.zeros(input_ids.size(0), dtype=torch.bool, device=input_ids.device)

    def _responses(self, input_ids: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """(len(rows), response_length): the rows' tokens so far, then the pad id."""
        new = input_ids[rows, self.context :]
        out = new.new_full((len(rows), self.response_length), self.pad_token_id)
        out[:, : new.size(1)] = new
        return out
