"""Step 2 of the rollout: the policy's responses to a batch of prompts, sampled by
transformers' ``generate`` (:class:`TransformersSampler`, chunk by chunk) or by a colocated
vLLM engine (:class:`VllmSampler`, the whole batch at once).

Sampling is pure: ``softmax(logits / temperature)``, no top-k, no top-p, no other
processors (:func:`sampling_config`). While rows still generate, those that have finished
are handed to ``on_finished`` (the reward stream's ``submit``) in groups of
``reward_stream_size``; each chunk a sampler yields says which of its rows are left to send.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import torch
from transformers import (
    GenerationConfig,
    PreTrainedModel,
    StoppingCriteria,
    StoppingCriteriaList,
)

if TYPE_CHECKING:
    from ppo_client.timing import RolloutClock
    from ppo_client.vllm_rollout import VllmRollout

__all__ = [
    "FinishedRows",
    "OnFinished",
    "SampledChunk",
    "Sampler",
    "TransformersSampler",
    "VllmSampler",
    "generate_responses",
    "sampling_config",
]

#: Takes rows of the batch that have finished and their responses (len(rows), T).
OnFinished: TypeAlias = Callable[[list[int], torch.Tensor], None]


def sampling_config(
    response_length: int, temperature: float, stop_token_id: int | None, pad_token_id: int
) -> GenerationConfig:
    """Pure sampling from softmax(logits / temperature): no top-k, no top-p, no other processors."""
    return GenerationConfig(
        max_new_tokens=response_length,
        min_new_tokens=0,
        do_sample=True,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        min_p=None,
        typical_p=1.0,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        num_beams=1,
        eos_token_id=stop_token_id,
        pad_token_id=pad_token_id,
        bos_token_id=None,
        use_cache=True,
    )


@contextlib.contextmanager
def _only_generation_config(model: PreTrainedModel, config: GenerationConfig) -> Iterator[None]:
    """Make ``config`` the model's generation config for a while, so that none of the
    checkpoint's own defaults (top_k, top_p, repetition penalty, EOS) leak into sampling."""
    saved = model.generation_config
    model.generation_config = config
    try:
        yield
    finally:
        model.generation_config = saved


@torch.no_grad()
def generate_responses(
    policy: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    config: GenerationConfig,
    chunk_size: int,
    watcher: StoppingCriteria | None = None,
) -> torch.Tensor:
    """Sample responses (B, response_length) in chunks; positions after the end hold the pad id.
    ``watcher`` (a :class:`FinishedRows`) sees every step of each chunk's ``generate``."""
    length = int(config.max_new_tokens)
    pad = int(config.pad_token_id)
    context = input_ids.size(1)
    out = torch.full((input_ids.size(0), length), pad, dtype=torch.long, device=input_ids.device)
    with _only_generation_config(policy, config):
        for start in range(0, input_ids.size(0), chunk_size):
            rows = slice(start, start + chunk_size)
            generated = policy.generate(
                input_ids=input_ids[rows],
                attention_mask=attention_mask[rows],
                generation_config=config,
                stopping_criteria=None if watcher is None else StoppingCriteriaList([watcher]),
            )
            new = generated[:, context:]
            out[rows, : new.size(1)] = new
    return out


class FinishedRows(StoppingCriteria):
    """Hands ``on_finished`` the rows of a ``generate`` call that have emitted the stop token,
    ``group_size`` at a time (as rows ``first_row + r`` of the batch, with their responses so
    far padded to ``response_length``: what the finished generation will hold for them),
    while the other rows keep generating. It never stops a row itself: ``generate``'s own
    EOS and length criteria decide that, exactly as without it; ``pending`` are the finished
    rows (indices in the call) not yet handed over when generation ends.

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
        on_finished: OnFinished,
        *,
        first_row: int = 0,
    ) -> None:
        self.stop_token_id = stop_token_id
        self.context = context  # prompt width: the response starts at this column
        self.response_length = response_length
        self.pad_token_id = pad_token_id
        self.group_size = group_size
        self.on_finished = on_finished
        self.first_row = first_row  # the call's row 0 in the batch
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
                responses = self._responses(input_ids, rows)
                self.on_finished([self.first_row + r for r in rows], responses)
                self.sent += rows
        return torch.zeros(input_ids.size(0), dtype=torch.bool, device=input_ids.device)

    def _responses(self, input_ids: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """(len(rows), response_length): the rows' tokens so far, then the pad id."""
        new = input_ids[rows, self.context :]
        out = new.new_full((len(rows), self.response_length), self.pad_token_id)
        out[:, : new.size(1)] = new
        return out

    def unsent(self, size: int) -> list[int]:
        """After generation: the call's rows (of ``size``) not handed over, finished first."""
        handed = set(self.sent + self.pending)
        return self.pending + [r for r in range(size) if r not in handed]


# ============================================================================== samplers


@dataclass
class SampledChunk:
    """Responses sampled for rows ``start...`` of the batch, and the reward requests still
    to send for them (those sent while they generated are gone already)."""

    start: int
    responses: torch.Tensor  # (b, T) as sampled: pad after the stop token (or none)
    to_send: list[list[int]]  # the batch rows of each request left, in the order to send
    engine_logprobs: torch.Tensor | None = None  # (b, T) vLLM's log-prob of each token


class Sampler(Protocol):
    """Samples responses to a batch of prompts, chunk by chunk, for one rollout: rows that
    finish while others generate go to its ``on_finished``; its ``clock`` gets the sampling
    time (the time inside ``on_finished`` is that call's own) and the end of sampling."""

    def chunks(
        self, policy: PreTrainedModel, queries: torch.Tensor, query_mask: torch.Tensor
    ) -> Iterator[SampledChunk]:
        """The chunks of ``queries`` (B, P) in batch order, each sampled when the previous
        one has been taken."""
        ...


def request_groups(rows: Sequence[int], size: int) -> list[list[int]]:
    """``rows`` cut into reward requests of ``size`` (the last one shorter)."""
    return [list(rows[k : k + size]) for k in range(0, len(rows), size)]


@dataclass(frozen=True)
class TransformersSampler:
    """``rollout_engine: transformers``: one ``generate`` call per chunk of ``chunk_size``
    prompts. With ``stream`` and a stop token, each ``group_size`` rows that emitted it go
    to ``on_finished`` while the chunk's others generate; the chunk's other rows are left to
    send after it, ``group_size`` per request with ``stream``, else all in one request."""

    config: GenerationConfig
    chunk_size: int
    stream: bool
    group_size: int
    stop_token_id: int | None
    on_finished: OnFinished
    clock: RolloutClock

    def chunks(
        self, policy: PreTrainedModel, queries: torch.Tensor, query_mask: torch.Tensor
    ) -> Iterator[SampledChunk]:
        for start in range(0, queries.size(0), self.chunk_size):
            rows = slice(start, start + self.chunk_size)
            yield self._chunk(policy, queries[rows], query_mask[rows], start)

    def _chunk(
        self, policy: PreTrainedModel, query: torch.Tensor, query_mask: torch.Tensor, start: int
    ) -> SampledChunk:
        """Rows ``start...`` of the batch, from their queries (b, P) left-padded."""
        size = query.size(0)
        watcher = None
        if self.stream and self.stop_token_id is not None:
            length, pad = int(self.config.max_new_tokens), int(self.config.pad_token_id)
            watcher = FinishedRows(
                self.stop_token_id,
                query.size(1),
                length,
                pad,
                self.group_size,
                self.on_finished,
                first_row=start,
            )
        with self.clock.generating():
            responses = generate_responses(policy, query, query_mask, self.config, size, watcher)
        self.clock.sampled()
        left = list(range(size)) if watcher is None else watcher.unsent(size)
        per_request = self.group_size if self.stream else max(1, len(left))
        return SampledChunk(
            start, responses, request_groups([start + r for r in left], per_request)
        )


@dataclass(frozen=True)
class VllmSampler:
    """``rollout_engine: vllm``: the policy's current weights into the engine, then every
    response at once; with ``stream`` each ``group_size`` finished rows go to
    ``on_finished`` as they finish, else all are left to send after, ``group_size`` per
    request. The engine sleeps once sampling ends (on a GPU: while the trainer updates)."""

    engine: VllmRollout
    stream: bool
    group_size: int
    on_finished: OnFinished
    clock: RolloutClock

    def chunks(
        self, policy: PreTrainedModel, queries: torch.Tensor, query_mask: torch.Tensor
    ) -> Iterator[SampledChunk]:
        with self.clock.generating():  # the weight sync counts as generation
            self.engine.sync(policy)
            rows = zip(queries.cpu(), query_mask.cpu(), strict=True)
            ids = [q[m.bool()].tolist() for q, m in rows]  # no padding for the engine
            on_finished = self.on_finished if self.stream else None
            sampled = self.engine.generate(ids, on_finished=on_finished, group_size=self.group_size)
        self.clock.sampled()
        self.engine.sleep()
        to_send = [] if self.stream else request_groups(range(len(ids)), self.group_size)
        device = queries.device
        yield SampledChunk(0, sampled.responses.to(device), to_send, sampled.logprobs.to(device))
