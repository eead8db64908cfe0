"""The rollout step: encode prompts for the policy, sample responses, turn them into text for
the reward, and compute the log-probs and values PPO needs (:class:`RolloutCollector`).

The reward side only ever sees text: the prompt as the user wrote it (chat prompts as their
original messages) and the response decoded with the policy tokenizer without special tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import torch
from transformers import (
    GenerationConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    StoppingCriteria,
    StoppingCriteriaList,
)

from ppo_client import offsets, ppo
from ppo_client.ppo import contains_token
from ppo_client.streaming import (
    Batch,
    FinishedRows,
    RewardInputs,
    ScoreFn,
    Scores,
    join_scores,
    reorder,
    reward_inputs,
)

if TYPE_CHECKING:
    from accelerate import Accelerator
    from torch import nn

    from ppo_client.config import PPOConfig
    from ppo_client.models import PolicyAndValue, Reference
    from ppo_client.vllm_rollout import VllmRollout

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
    truncated: list[bool] | None
    reward_wait_s: float
    step_scores: list[list[float]] | None = None  # reward_mode process: each step's score,
    step_tokens: list[list[int]] | None = None  # the token it is placed on,
    step_rewards: torch.Tensor | None = None  # and all of them as (B, T) dense rewards
    engine_logprobs: torch.Tensor | None = None  # (B, T) vLLM's log-prob of each sampled token
    generate_s: float = 0.0  # seconds sampling and decoding (no passes, no reward wait)
    reward_tail_s: float = 0.0  # from the end of sampling to the reward's last score


def _concat(chunks: Sequence[RolloutTensors]) -> dict[str, torch.Tensor]:
    """Each tensor of the chunks concatenated along the batch, in chunk order: (B, ...)."""
    return {
        f.name: torch.cat([getattr(c, f.name) for c in chunks], 0)
        for f in dataclasses.fields(RolloutTensors)
    }


@dataclass
class RolloutCollector:
    """Steps 2-3 of an update: generate, truncate, decode and score each chunk of prompts;
    while a chunk's reward request is in flight, compute its policy and reference log-probs
    and its values."""

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
        queries = enc.input_ids.to(device)  # (B, P), left-padded
        query_mask = enc.attention_mask.to(device)
        wrapper: PolicyAndValue = self.accelerator.unwrap_model(model)
        wrapper.eval()
        batch = Batch(prompts, queries, query_mask, labels, pool)
        if self.engine is not None:
            tensors, waits = self._engine_rollout(wrapper, batch)
        else:
            tensors, waits = self._chunked_rollout(wrapper, batch)
        # e. collect the scores; only the time spent blocked here is network the GPU did not hide
        waited = time.perf_counter()
        results = [f.result() for f in batch.futures]
        reward_wait_s = waits + time.perf_counter() - waited
        wrapper.train()
        scored = reorder(join_scores(results), [row for rows in batch.groups for row in rows])
        texts = batch.texts()
        if cfg.reward_mode == "process":
            return Rollout(
                **tensors,
                **self._process_rewards(scored, tensors["responses"], tensors["seq_lengths"]),
                prompts=prompts,
                texts=texts,
                truncated=scored.truncated,
                reward_wait_s=reward_wait_s,
                engine_logprobs=batch.engine_logprobs,
                generate_s=batch.generate_s,
                reward_tail_s=batch.tail(),
            )
        return Rollout(
            **tensors,
            prompts=prompts,
            texts=texts,
            raw_scores=torch.tensor(scored.scores, dtype=torch.float32, device=device),
            truncated=scored.truncated,
            reward_wait_s=reward_wait_s,
            engine_logprobs=batch.engine_logprobs,
            generate_s=batch.generate_s,
            reward_tail_s=batch.tail(),
        )

    def _cut(self, responses: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Responses truncated at the stop token (the rest padded), their lengths and mask."""
        seq_lengths = ppo.sequence_lengths(responses, self.stop_token_id)  # (b,)
        resp_mask = ppo.response_mask(seq_lengths, self.config.response_length)  # (b, T)
        return responses.masked_fill(~resp_mask, self.pad_token_id), seq_lengths, resp_mask

    def _submit(self, batch: Batch, rows: list[int], responses: torch.Tensor) -> float:
        """Decode ``rows`` (their responses given) and send them to the reward on the pool;
        the seconds this thread was blocked doing so (an inline executor scores here)."""
        decoding = time.perf_counter()
        index = torch.tensor(rows, dtype=torch.long)
        cut, seq_lengths, _ = self._cut(responses)
        inputs = reward_inputs(
            self.tokenizer,
            [batch.prompts[r] for r in rows],
            batch.queries[index.to(batch.queries.device)],
            batch.query_mask[index.to(batch.queries.device)],
            cut,
            seq_lengths,
        )
        inputs.labels = None if batch.labels is None else [batch.labels[r] for r in rows]
        submitted = time.perf_counter()
        batch.generate_s += submitted - decoding
        batch.futures.append(batch.pool.submit(self._score_timed, batch, inputs))
        batch.groups.append(rows)
        batch.sent.append(inputs)
        return time.perf_counter() - submitted

    def _score_timed(self, batch: Batch, inputs: RewardInputs) -> Scores:
        """Score on the pool, noting when the answer came (before the future is done)."""
        scored = self.score(inputs)
        batch.scored_at.append(time.perf_counter())
        return scored

    def _chunked_rollout(
        self, wrapper: PolicyAndValue, batch: Batch
    ) -> tuple[dict[str, torch.Tensor], float]:
        """transformers: per chunk, sample (with ``stream_rewards``, each row that emits the
        stop token goes to the reward while the others still generate), send the rest, and
        run the passes while the reward works."""
        cfg = self.config
        chunk, group = cfg.local_rollout_forward_batch_size, cfg.reward_stream_size
        chunks: list[RolloutTensors] = []
        waits = 0.0
        for start in range(0, batch.queries.size(0), chunk):
            rows = slice(start, start + chunk)
            query, qmask = batch.queries[rows], batch.query_mask[rows]
            # a. sample (pure sampling at the configured temperature), streaming finished rows
            responses, left, blocked = self._sample_chunk(wrapper, batch, start, query, qmask)
            waits += blocked
            # b. truncate at the stop token; the response ends at index seq_len (inclusive)
            responses, seq_lengths, resp_mask = self._cut(responses)
            # c. decode to text and score on the worker thread the rows not sent yet: the
            # whole chunk in one request without streaming, else reward_stream_size at a time
            size = group if cfg.stream_rewards else len(left)
            for k in range(0, len(left), size):
                part = left[k : k + size]
                index = torch.tensor(part, dtype=torch.long, device=responses.device)
                waits += self._submit(batch, [start + r for r in part], responses[index])
            # d. meanwhile: log-probs of policy and reference, and values, on the same inputs
            chunks.append(self._passes(wrapper, query, qmask, responses, resp_mask, seq_lengths))
        return _concat(chunks), waits

    def _sample_chunk(
        self,
        wrapper: PolicyAndValue,
        batch: Batch,
        start: int,
        query: torch.Tensor,
        query_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, list[int], float]:
        """Sample one chunk (rows ``start``...), sending each group of finished rows to the
        reward meanwhile when streaming with a stop token. Returns the responses (b, T),
        the chunk's rows not sent yet (finished ones first) and the seconds blocked sending."""
        cfg = self.config
        inside = [0.0, 0.0]  # seconds in send (decoding and sending), of them blocked

        def send(rows: list[int], responses: torch.Tensor) -> None:
            entered = time.perf_counter()
            inside[1] += self._submit(batch, [start + r for r in rows], responses)
            inside[0] += time.perf_counter() - entered

        watcher = None
        if cfg.stream_rewards and self.stop_token_id is not None:
            context = query.size(1)
            watcher = FinishedRows(
                self.stop_token_id,
                context,
                cfg.response_length,
                self.pad_token_id,
                cfg.reward_stream_size,
                send,
            )
        sampling = time.perf_counter()
        responses = generate_responses(
            wrapper.policy, query, query_mask, self.gen_config, query.size(0), watcher
        )
        # _submit counts the decoding of the rows sent meanwhile; the blocked time is a wait
        batch.sampled_at = time.perf_counter()
        batch.generate_s += batch.sampled_at - sampling - inside[0]
        if watcher is None:
            return responses, list(range(query.size(0))), inside[1]
        sent = set(watcher.sent + watcher.pending)
        rest = [r for r in range(query.size(0)) if r not in sent]
        return responses, watcher.pending + rest, inside[1]

    def _engine_rollout(
        self, wrapper: PolicyAndValue, batch: Batch
    ) -> tuple[dict[str, torch.Tensor], float]:
        """vLLM: the policy's weights into the engine, every response sampled at once with
        the finished ones sent to the reward as they finish, then the passes by chunk."""
        cfg, engine = self.config, self.engine
        assert engine is not None
        sampling = time.perf_counter()
        engine.sync(wrapper.policy)
        cpu_rows = zip(batch.queries.cpu(), batch.query_mask.cpu(), strict=True)
        ids = [q[m.bool()].tolist() for q, m in cpu_rows]
        device = batch.queries.device
        waits = [0.0]

        def send(rows: list[int], responses: torch.Tensor) -> None:  # as rows finish
            waits[0] += self._submit(batch, rows, responses[rows].to(device))

        streaming = cfg.stream_rewards
        group = cfg.reward_stream_size
        sampled = engine.generate(ids, on_finished=send if streaming else None, group_size=group)
        batch.sampled_at = time.perf_counter()
        # Sync, sampling and the decoding of the rollouts sent meanwhile; not their waits.
        batch.generate_s = time.perf_counter() - sampling - waits[0]
        engine.sleep()
        if not streaming:
            for start in range(0, len(ids), group):
                send(list(range(start, min(start + group, len(ids)))), sampled.responses)
        responses = sampled.responses.to(device)
        responses, seq_lengths, resp_mask = self._cut(responses)
        chunks = []
        chunk = cfg.local_rollout_forward_batch_size
        for start in range(0, len(ids), chunk):
            rows = slice(start, start + chunk)
            chunks.append(
                self._passes(
                    wrapper,
                    batch.queries[rows],
                    batch.query_mask[rows],
                    responses[rows],
                    resp_mask[rows],
                    seq_lengths[rows],
                )
            )
        batch.engine_logprobs = sampled.logprobs.to(device).masked_fill(~resp_mask, 0.0)
        return _concat(chunks), waits[0]

    def _process_rewards(
        self, scored: Scores, responses: torch.Tensor, seq_lengths: torch.Tensor
    ) -> dict[str, Any]:
        """reward_mode process: the outcome scores (0 without any) for the last token, and
        the step scores placed on the policy's tokens."""
        if scored.step_scores is None or scored.step_ends is None:
            raise ValueError(
                "reward_mode is process but the reward answered no step_scores/step_ends: "
                "the reward server serves no kind: process model (or the reward function "
                "is not a remote-reward client)"
            )
        outcome = scored.outcome_scores
        if outcome is None:
            outcome = [0.0] * len(scored.scores)
        tokens = offsets.step_tokens(self.tokenizer, responses, seq_lengths, scored.step_ends)
        dense = offsets.step_rewards(responses.shape, scored.step_scores, tokens)
        return {
            "raw_scores": torch.tensor(outcome, dtype=torch.float32, device=responses.device),
            "step_scores": scored.step_scores,
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
