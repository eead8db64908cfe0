"""The reward side of a rollout: what the reward function gets (:class:`RewardInputs`, the
texts :func:`reward_inputs` decodes, :class:`RolloutDecoder` for rows of a batch) and
answers (:class:`Scores`), and :class:`RewardStream`, which sends rows to it as they finish
while the others still generate and puts the scores back in row order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

import torch
from transformers import PreTrainedTokenizerBase

from ppo_client import ppo

if TYPE_CHECKING:
    from ppo_client.rollout import Prompt
    from ppo_client.timing import RolloutClock

__all__ = [
    "NO_REASON",
    "RewardInputs",
    "RewardStream",
    "RolloutDecoder",
    "ScoreFn",
    "Scores",
    "join_scores",
    "reorder",
    "reward_inputs",
    "row_order",
]


#: The reason given for a None (masked) score that came without one (a reward callable's).
NO_REASON = "no_score"


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
    and the sequence models' outcome scores).

    A score is None where the reward masked the item (its reward could not be computed:
    a verifier's timeout or crash, a judge's answer that did not parse, ...); ``masked``
    then gives each item's reason (None for a scored item), when known. A masked item's
    steps and outcome score may be None as well.
    """

    scores: list[float | None]
    truncated: list[bool] | None
    step_scores: list[list[float] | None] | None = None
    step_ends: list[list[int] | None] | None = None
    outcome_scores: list[float | None] | None = None
    masked: list[str | None] | None = None


#: Scores the decoded rollouts of one chunk (called on the reward worker thread).
ScoreFn: TypeAlias = Callable[[RewardInputs], Scores]


def join_scores(results: Sequence[Scores]) -> Scores:
    """The chunks' scores in order; truncation flags and steps only if every chunk
    reported them; the masked reasons if any chunk did (None for the others' items)."""

    def joined(column: int) -> list[Any] | None:
        parts = [r[column] for r in results]
        if any(part is None for part in parts):
            return None
        return [x for part in parts for x in part]

    truncated = joined(1)
    masked: list[str | None] | None = None
    if any(r.masked is not None for r in results):
        masked = [
            reason
            for r in results
            for reason in (r.masked if r.masked is not None else [None] * len(r.scores))
        ]
    return Scores(
        [s for r in results for s in r.scores],
        None if truncated is None else [bool(x) for x in truncated],
        *(joined(column) for column in range(2, Scores._fields.index("masked"))),
        masked=masked,
    )


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


@dataclass(frozen=True)
class RolloutDecoder:
    """One rollout's prompts as the policy and the reward see them: turns rows of its
    responses into the reward's inputs."""

    tokenizer: PreTrainedTokenizerBase
    stop_token_id: int | None
    prompts: list[Prompt]
    queries: torch.Tensor  # (B, P) left-padded
    query_mask: torch.Tensor  # (B, P)
    labels: list[Any] | None  # one per prompt with label_column

    def decode(self, rows: list[int], responses: torch.Tensor) -> RewardInputs:
        """The reward's inputs of ``rows`` of the batch from their responses (len(rows), T),
        each read up to its first stop token (the rest, cut or not, is never decoded)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.queries.device)
        inputs = reward_inputs(
            self.tokenizer,
            [self.prompts[r] for r in rows],
            self.queries[index],
            self.query_mask[index],
            responses,
            ppo.sequence_lengths(responses, self.stop_token_id),
        )
        inputs.labels = None if self.labels is None else [self.labels[r] for r in rows]
        return inputs


class _Request(NamedTuple):
    """One reward request: the batch rows it holds, what it sent, its answer to come."""

    rows: list[int]
    inputs: RewardInputs
    answer: Future[Scores]


@dataclass
class RewardStream:
    """One rollout's reward requests. :meth:`submit` decodes rows as they finish and hands
    them to ``pool`` (a worker thread, or inline), so they are scored while generation and
    the passes go on; :meth:`results` gathers every answer, in row order whatever order the
    rows were sent in. The ``clock`` gets the decoding as generation, the time blocked
    handing a request over or gathering answers as a reward wait, and each answer's time.
    """

    score: ScoreFn
    pool: Executor
    decoder: RolloutDecoder
    clock: RolloutClock
    _requests: list[_Request] = field(default_factory=list, init=False)

    def submit(self, rows: list[int], responses: torch.Tensor) -> None:
        """Send ``rows`` of the batch (their responses: (len(rows), T)) to the reward."""
        with self.clock.generating():
            inputs = self.decoder.decode(rows, responses)
        with self.clock.waiting():  # an inline pool scores right here
            answer = self.pool.submit(self._score, inputs)
        self._requests.append(_Request(rows, inputs, answer))

    def _score(self, inputs: RewardInputs) -> Scores:
        """Score on the pool, noting when the answer came (before its future is done)."""
        scored = self.score(inputs)
        self.clock.scored()
        return scored

    def results(self) -> Scores:
        """The scores of every row sent, in row order (blocks until all are answered)."""
        with self.clock.waiting():
            answers = [request.answer.result() for request in self._requests]
        return reorder(join_scores(answers), self._rows())

    def texts(self) -> RewardInputs:
        """What the reward saw of every row, in row order (decoded once, when sent)."""
        order = row_order(self._rows())
        prompts = [p for request in self._requests for p in request.inputs.prompts]
        responses = [r for request in self._requests for r in request.inputs.responses]
        return RewardInputs(
            [prompts[k] for k in order], [responses[k] for k in order], self.decoder.labels
        )

    def _rows(self) -> list[int]:
        """The rows in the order they were sent."""
        return [row for request in self._requests for row in request.rows]
