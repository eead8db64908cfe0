"""The rollout step (:class:`RolloutCollector`): encode prompts for the policy, sample
responses, send them to the reward as text while the policy and reference log-probs and the
values PPO needs are computed, and gather the scores.

Its parts, one job each: :mod:`ppo_client.sampling` samples the responses (transformers'
``generate`` or the vLLM engine), :class:`~ppo_client.streaming.RewardStream` decodes and
scores rows as they finish, :class:`~ppo_client.timing.RolloutClock` times both for the
``time/`` metrics. The reward side only ever sees text: the prompt as the user wrote it
(chat prompts as their original messages) and the response decoded with the policy
tokenizer without special tokens.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase

from ppo_client import offsets, ppo
from ppo_client.ppo import contains_token
from ppo_client.sampling import (
    FinishedRows,
    Sampler,
    TransformersSampler,
    VllmSampler,
    generate_responses,
    sampling_config,
)
from ppo_client.streaming import (
    NO_REASON,
    RewardInputs,
    RewardStream,
    RolloutDecoder,
    ScoreFn,
    Scores,
    reward_inputs,
)
from ppo_client.timing import RolloutClock

if TYPE_CHECKING:
    from accelerate import Accelerator
    from torch import nn

    from ppo_client.config import PPOConfig
    from ppo_client.models import PolicyAndValue, Reference
    from ppo_client.vllm_rollout import VllmRollout

# The sampling and reward names are re-exported: they were imported from here before
# those parts had modules of their own.
__all__ = [
    "EncodedPrompts",
    "FinishedRows",
    "Prompt",
    "RewardInputs",
    "Rollout",
    "RolloutCollector",
    "RolloutTensors",
    "ScoreFn",
    "Scores",
    "contains_token",
    "encode_prompts",
    "generate_responses",
    "normalize_prompt",
    "pad_token_id_for",
    "position_ids_from_mask",
    "reward_inputs",
    "sampling_config",
]

logger = logging.getLogger(__name__)

Message: TypeAlias = dict[str, str]
Prompt: TypeAlias = str | list[Message]


def normalize_prompt(value: Any) -> Prompt:
    """A dataset prompt as text or a list of ``{"role", "content"}`` messages (other keys dropped)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence) and value and all(isinstance(m, Mapping) for m in value):
        messages = []
        for m in value:
            role, content = m.get("role"), m.get("content")
            if not isinstance(role, str) or not isinstance(content, str):
                raise ValueError(f"chat messages need string 'role' and 'content', got {dict(m)!r}")
            messages.append({"role": role, "content": content})
        return messages
    raise ValueError(f"a prompt must be a string or a list of chat messages, got {value!r:.200}")


def pad_token_id_for(tokenizer: PreTrainedTokenizerBase) -> int:
    """Id used to fill padding; any valid id works because masks, not ids, mark padding."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id):
        if candidate is not None:
            return int(candidate)
    return 0


def prompt_token_ids(tokenizer: PreTrainedTokenizerBase, prompt: Prompt) -> list[int]:
    """Policy token ids of one prompt; chat prompts go through the policy's chat template."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt)["input_ids"])
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            "the dataset has chat prompts but the policy tokenizer has no chat template; "
            "set one on the tokenizer or use plain-text prompts"
        )
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    # The rendered template already carries the special tokens it wants (BOS etc.).
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@dataclass
class EncodedPrompts:
    """Left-padded prompt ids (B, P), their mask, and how many prompts were cut short."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    num_truncated: int


def encode_prompts(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[Prompt],
    pad_token_id: int,
    max_prompt_length: int | None = None,
) -> EncodedPrompts:
    """Tokenize prompts for the policy and left-pad them to a common length."""
    rows, truncated = [], 0
    for prompt in prompts:
        ids = prompt_token_ids(tokenizer, prompt)
        if max_prompt_length is not None and len(ids) > max_prompt_length:
            ids = ids[-max_prompt_length:]  # keep the end, next to where the response starts
            truncated += 1
        if not ids:
            raise ValueError(f"prompt {prompt!r:.100} encodes to no tokens")
        rows.append(ids)
    width = max(len(r) for r in rows)
    input_ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, ids in enumerate(rows):
        input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, width - len(ids) :] = 1
    return EncodedPrompts(input_ids, attention_mask, truncated)


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens only, so left padding does not shift them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


# ================================================================================= the step


@dataclass
class RolloutTensors:
    """The tensors of a batch of rollouts (all on the device)."""

    query_responses: torch.Tensor  # (B, P + T)
    attention_mask: torch.Tensor  # (B, P + T), zero on prompt padding and after the stop token
    position_ids: torch.Tensor  # (B, P + T)
    responses: torch.Tensor  # (B, T)
    seq_lengths: torch.Tensor  # (B,)
    logprobs: torch.Tensor  # (B, T)
    ref_logprobs: torch.Tensor  # (B, T)
    values: torch.Tensor  # (B, T)


@dataclass
class Rollout(RolloutTensors):
    """One update's rollouts on this rank: the tensors, the texts the reward saw, its scores."""

    prompts: list[Prompt]
    texts: RewardInputs
    raw_scores: torch.Tensor  # (B,); reward_mode process: the outcome scores (0 if none)
    valid: torch.Tensor  # (B,) bool: false where the reward masked the row (raw score 0)
    truncated: list[bool] | None
    reward_wait_s: float
    step_scores: list[list[float]] | None = None  # reward_mode process: each step's score,
    step_tokens: list[list[int]] | None = None  # the token it is placed on,
    step_rewards: torch.Tensor | None = None  # and all of them as (B, T) dense rewards
    engine_logprobs: torch.Tensor | None = None  # (B, T) vLLM's log-prob of each sampled token
    generate_s: float = 0.0  # seconds sampling and decoding (no passes, no reward wait)
    reward_tail_s: float = 0.0  # from the end of sampling to the reward's last score
    masked: list[str | None] | None = None  # each masked row's reason (None: not masked)


def _log_masked(scored: Scores, valid: list[bool]) -> None:
    """One log line for the rows the reward masked on this rank, counted by reason."""
    masked = len(valid) - sum(valid)
    if not masked:
        return
    reasons = scored.masked or [None] * len(valid)
    counts = Counter(
        reason or NO_REASON for reason, ok in zip(reasons, valid, strict=True) if not ok
    )
    logger.info(
        "the reward masked %d of %d rollouts (%s): left out of this update",
        masked,
        len(valid),
        ", ".join(f"{reason}: {n}" for reason, n in counts.most_common()),
    )


def _concat(chunks: Sequence[RolloutTensors]) -> dict[str, torch.Tensor]:
    """Each tensor of the chunks concatenated along the batch, in chunk order: (B, ...)."""
    return {
        f.name: torch.cat([getattr(c, f.name) for c in chunks], 0)
        for f in dataclasses.fields(RolloutTensors)
    }


@dataclass
class RolloutCollector:
    """Steps 2-3 of an update: a sampler generates each chunk of responses, the reward
    stream decodes and scores rows as they finish (while the others generate), and while a
    chunk's requests are in flight its policy and reference log-probs and its values are
    computed; a clock times generation and the waits for the reward."""

    config: PPOConfig
    accelerator: Accelerator
    tokenizer: PreTrainedTokenizerBase
    reference: Reference
    score: ScoreFn
    stop_token_id: int | None
    pad_token_id: int
    engine: VllmRollout | None = None  # rollout_engine vllm; None: transformers' generate
    gen_config: GenerationConfig = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.config
        self.gen_config = sampling_config(
            cfg.response_length, cfg.temperature, self.stop_token_id, self.pad_token_id
        )

    @torch.no_grad()
    def collect(
        self,
        model: nn.Module,
        prompts: list[Prompt],
        pool: Executor,
        labels: list[Any] | None = None,
    ) -> Rollout:
        """Rollouts of ``prompts`` by the (prepared) ``model``; rewards scored on ``pool``,
        each rollout sent with its prompt's label when ``labels`` are given."""
        cfg, device = self.config, self.accelerator.device
        enc = encode_prompts(self.tokenizer, prompts, self.pad_token_id, cfg.max_prompt_length)
        if enc.num_truncated:
            logger.debug("%d prompt(s) cut to max_prompt_length", enc.num_truncated)
        decoder = RolloutDecoder(
            self.tokenizer,
            self.stop_token_id,
            prompts,
            enc.input_ids.to(device),  # (B, P), left-padded
            enc.attention_mask.to(device),
            labels,
        )
        clock = RolloutClock()
        stream = RewardStream(self.score, pool, decoder, clock)
        wrapper: PolicyAndValue = self.accelerator.unwrap_model(model)
        wrapper.eval()
        tensors, engine_logprobs = self._roll_out(wrapper, decoder, stream, clock)
        # e. collect the scores; only the time spent blocked here is network the GPU did not hide
        scored = stream.results()
        wrapper.train()
        return Rollout(
            **tensors,
            **self._rewards(scored, tensors["responses"], tensors["seq_lengths"]),
            prompts=prompts,
            texts=stream.texts(),
            truncated=scored.truncated,
            masked=scored.masked,
            engine_logprobs=engine_logprobs,
            reward_wait_s=clock.reward_wait_s,
            generate_s=clock.generate_s,
            reward_tail_s=clock.reward_tail_s,
        )

    def _sampler(self, stream: RewardStream, clock: RolloutClock) -> Sampler:
        """One rollout's sampler, sending finished rows to ``stream``: the engine the
        trainer gave (rollout_engine vllm), else transformers' generate."""
        cfg = self.config
        if self.engine is not None:
            return VllmSampler(
                self.engine, cfg.stream_rewards, cfg.reward_stream_size, stream.submit, clock
            )
        return TransformersSampler(
            config=self.gen_config,
            chunk_size=cfg.local_rollout_forward_batch_size,
            stream=cfg.stream_rewards,
            group_size=cfg.reward_stream_size,
            stop_token_id=self.stop_token_id,
            on_finished=stream.submit,
            clock=clock,
        )

    def _roll_out(
        self,
        wrapper: PolicyAndValue,
        decoder: RolloutDecoder,
        stream: RewardStream,
        clock: RolloutClock,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        """Every chunk's tensors (B, ...) and the engine's log-probs (B, T) if it gave any.
        The sampler's next chunk is sampled once this one's passes are done."""
        queries, query_mask = decoder.queries, decoder.query_mask
        chunks: list[RolloutTensors] = []
        engine_logprobs: list[torch.Tensor] = []
        sampler = self._sampler(stream, clock)
        # a. sample (pure sampling at the configured temperature), finished rows streamed
        for sampled in sampler.chunks(wrapper.policy, queries, query_mask):
            # b. truncate at the stop token; the response ends at index seq_len (inclusive)
            responses, seq_lengths, resp_mask = self._cut(sampled.responses)
            # c. decode to text and score on the worker thread the rows not sent yet
            for rows in sampled.to_send:
                local = [row - sampled.start for row in rows]
                index = torch.tensor(local, dtype=torch.long, device=responses.device)
                stream.submit(rows, responses[index])
            # d. meanwhile: log-probs of policy and reference, and values, on the same inputs
            rows = slice(sampled.start, sampled.start + responses.size(0))
            inputs = (queries[rows], query_mask[rows], responses, resp_mask, seq_lengths)
            step = self.config.local_rollout_forward_batch_size
            for k in range(0, responses.size(0), step):
                chunks.append(self._passes(wrapper, *(t[k : k + step] for t in inputs)))
            if sampled.engine_logprobs is not None:
                engine_logprobs.append(sampled.engine_logprobs.masked_fill(~resp_mask, 0.0))
        return _concat(chunks), torch.cat(engine_logprobs) if engine_logprobs else None

    def _cut(self, responses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Responses truncated at the stop token (the rest padded), their lengths and mask."""
        seq_lengths = ppo.sequence_lengths(responses, self.stop_token_id)  # (b,)
        resp_mask = ppo.response_mask(seq_lengths, self.config.response_length)  # (b, T)
        return responses.masked_fill(~resp_mask, self.pad_token_id), seq_lengths, resp_mask

    def _rewards(
        self, scored: Scores, responses: torch.Tensor, seq_lengths: torch.Tensor
    ) -> dict[str, Any]:
        """The scores as the update takes them: the raw scores (reward_mode outcome), or
        the outcome scores and the steps on their tokens (process); with each row's
        validity (false where the reward masked it: its raw score is then 0, a placeholder
        the update never uses)."""
        if self.config.reward_mode == "process":
            return self._process_rewards(scored, responses, seq_lengths)
        device = self.accelerator.device
        valid = [s is not None for s in scored.scores]
        _log_masked(scored, valid)
        raw = [0.0 if s is None else s for s in scored.scores]
        return {
            "raw_scores": torch.tensor(raw, dtype=torch.float32, device=device),
            "valid": torch.tensor(valid, dtype=torch.bool, device=device),
        }

    def _process_rewards(
        self, scored: Scores, responses: torch.Tensor, seq_lengths: torch.Tensor
    ) -> dict[str, Any]:
        """reward_mode process: the outcome scores (0 without any) for the last token, and
        the step scores placed on the policy's tokens. An item the reward masked (its
        score, its steps or its outcome score None) masks its whole row: no outcome, no
        steps."""
        if scored.step_scores is None or scored.step_ends is None:
            raise ValueError(
                "reward_mode is process but the reward answered no step_scores/step_ends: "
                "the reward server serves no kind: process model (or the reward function "
                "is not a remote-reward client)"
            )
        outcome: list[float | None] = (
            list(scored.outcome_scores)
            if scored.outcome_scores is not None
            else [0.0] * len(scored.scores)
        )
        valid = [
            score is not None and steps is not None and ends is not None and out is not None
            for score, steps, ends, out in zip(
                scored.scores, scored.step_scores, scored.step_ends, outcome, strict=True
            )
        ]
        _log_masked(scored, valid)
        # A masked row keeps no step: nothing to place on its tokens.
        step_scores = [
            list(s) if ok and s is not None else []
            for s, ok in zip(scored.step_scores, valid, strict=True)
        ]
        step_ends = [
            list(e) if ok and e is not None else []
            for e, ok in zip(scored.step_ends, valid, strict=True)
        ]
        raw = [o if ok and o is not None else 0.0 for o, ok in zip(outcome, valid, strict=True)]
        tokens = offsets.step_tokens(self.tokenizer, responses, seq_lengths, step_ends)
        dense = offsets.step_rewards(responses.shape, step_scores, tokens)
        return {
            "raw_scores": torch.tensor(raw, dtype=torch.float32, device=responses.device),
            "valid": torch.tensor(valid, dtype=torch.bool, device=responses.device),
            "step_scores": step_scores,
            "step_tokens": tokens,
            "step_rewards": dense.to(responses.device),
        }

    def _passes(
        self,
        wrapper: PolicyAndValue,
        query: torch.Tensor,
        query_mask: torch.Tensor,
        responses: torch.Tensor,
        response_mask: torch.Tensor,
        seq_lengths: torch.Tensor,
    ) -> RolloutTensors:
        """Policy and reference log-probs and values (b, T) of one sampled chunk."""
        temperature = self.config.temperature
        query_response = torch.cat([query, responses], 1)  # (b, P + T)
        attention_mask = torch.cat([query_mask, response_mask.long()], 1)
        position_ids = position_ids_from_mask(attention_mask)
        with self.accelerator.autocast():
            logits = wrapper.policy_logits(query_response, attention_mask, position_ids)
            logprobs = ppo.logprobs_from_logits(logits / temperature, responses)
            del logits
            ref_logits = self.reference.logits(
                wrapper, query_response, attention_mask, position_ids
            )
            ref_logprobs = ppo.logprobs_from_logits(ref_logits / temperature, responses)
            del ref_logits
            values = wrapper.values(query_response, attention_mask, position_ids)
        return RolloutTensors(
            query_response,
            attention_mask,
            position_ids,
            responses,
            seq_lengths,
            logprobs,
            ref_logprobs,
            values,
        )
