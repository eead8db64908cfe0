"""Rollout helpers: encode prompts for the policy, sample responses, and turn them into text.

The reward side only ever sees text: the prompt as the user wrote it (chat prompts as their
original messages) and the response decoded with the policy tokenizer without special tokens.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "EncodedPrompts",
    "Prompt",
    "RewardInputs",
    "contains_token",
    "encode_prompts",
    "generate_responses",
    "normalize_prompt",
    "pad_token_id_for",
    "position_ids_from_mask",
    "reward_inputs",
    "sampling_config",
]

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
) -> torch.Tensor:
    """Sample responses (B, response_length) in chunks; positions after the end hold the pad id."""
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
            )
            new = generated[:, context:]
            out[rows, : new.size(1)] = new
    return out


@dataclass
class RewardInputs:
    """What the reward function gets: the prompts and the decoded responses."""

    prompts: list[Prompt]
    responses: list[str]


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


def contains_token(
    responses: torch.Tensor, token_id: int | None, mask: torch.Tensor
) -> torch.Tensor:
    """Whether each response (B,) holds ``token_id`` among its real tokens (false if None)."""
    if token_id is None:
        return torch.zeros(responses.size(0), dtype=torch.bool, device=responses.device)
    return ((responses == token_id) & mask).any(-1)
