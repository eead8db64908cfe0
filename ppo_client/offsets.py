"""Character offsets into a decoded response -> the policy tokens that produced them.

A process reward model's server reports where each step of a response ends as an offset
into the response *text* (Python ``str`` indices, i.e. Unicode code points). The trainer
decoded that text from the policy's own tokens, so it can tell which token produced each
character: it decodes the growing prefixes ``ids[:1]``, ``ids[:2]``, ... exactly as it
decoded the whole response, and a character belongs to the first token whose prefix
decodes to a text that agrees with the whole one up to and including that character.

Why prefixes rather than each token alone: a token's text depends on its neighbours
(SentencePiece drops the leading space of the first token; WordPiece glues ``##`` pieces to
the word before and removes spaces before punctuation), and a byte-level BPE token (GPT-2,
or a Llama byte-fallback token such as ``<0xC3>``) may end inside a multi-byte UTF-8
character, which decodes to U+FFFD until the token that completes it arrives; the prefix
then disagrees with the whole text at that character, so the character belongs to the
completing token. Special tokens decode to nothing and own no character.

Cost: one decode per prefix, O(T^2) token reads per response of T tokens (one batched
call to the tokenizer); only the ``reward_mode: process`` trainer pays it.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

__all__ = ["Decoder", "char_ends", "step_rewards", "step_tokens", "token_for_offset"]


class Decoder(Protocol):
    """What the map needs of a tokenizer: ``batch_decode`` (transformers' signature)."""

    def batch_decode(self, sequences: list[list[int]], **kwargs: Any) -> list[str]: ...


def _agreeing(prefix: str, text: str) -> int:
    """Length of the common beginning of ``prefix`` and ``text``."""
    if text.startswith(prefix):  # the usual case: the prefix decodes to a prefix
        return len(prefix)
    n = 0
    for a, b in zip(prefix, text, strict=False):
        if a != b:
            break
        n += 1
    return n


def char_ends(
    tokenizer: Decoder, ids: Sequence[int], *, skip_special_tokens: bool = True
) -> list[int]:
    """For each token ``k``, how many characters of the decoded ``ids`` the tokens
    ``0..k`` have produced (non-decreasing; the last equals the text's length).

    Token ``k`` owns the characters ``ends[k-1] .. ends[k]-1`` (``ends[-1]`` read as 0);
    decode exactly as the text was decoded (same ``skip_special_tokens``).
    """
    ids = [int(i) for i in ids]
    if not ids:
        return []
    decoded = tokenizer.batch_decode(
        [ids[: k + 1] for k in range(len(ids))], skip_special_tokens=skip_special_tokens
    )
    text = decoded[-1]
    ends, done = [], 0
    for prefix in decoded:
        # max(): a later token never takes back a character an earlier one produced (a
        # clean-up that rewrites text before the end must not move steps backwards).
        done = max(done, _agreeing(prefix, text))
        ends.append(done)
    return ends


def token_for_offset(ends: Sequence[int], offset: int) -> int | None:
    """The token whose span holds character ``offset - 1``: where a step ending at the
    exclusive ``offset`` ends. None for offset 0 (an empty response: nothing holds it).

    Raises ValueError for an offset past the text's end (the server and the trainer do not
    agree on the response text).
    """
    length = ends[-1] if ends else 0
    if not 0 <= offset <= length:
        raise ValueError(f"step end {offset} is outside the response text of {length} characters")
    if offset == 0:
        return None
    # The first token whose prefix covers characters 0..offset-1: ends[k] >= offset.
    return bisect.bisect_left(ends, offset)


def step_tokens(
    tokenizer: PreTrainedTokenizerBase,
    responses: torch.Tensor,
    seq_lengths: torch.Tensor,
    step_ends: Sequence[Sequence[int]],
) -> list[list[int]]:
    """For each response, the index of the policy token holding each step's last character.

    The offsets count characters of each response as :func:`reward_inputs` decoded it
    (its tokens up to the stop token, special tokens skipped); a step ending at offset 0
    (an empty response) goes on the last response token.
    """
    out = []
    for row, n, ends in zip(responses.cpu(), seq_lengths.cpu(), step_ends, strict=True):
        last = int(n)
        spans = char_ends(tokenizer, row[: last + 1].tolist(), skip_special_tokens=True)
        indices = [token_for_offset(spans, end) for end in ends]
        out.append([last if k is None else k for k in indices])
    return out


def step_rewards(
    shape: torch.Size, step_scores: Sequence[Sequence[float]], tokens: Sequence[Sequence[int]]
) -> torch.Tensor:
    """Dense rewards (B, T): each step's score added on its token (steps may share one)."""
    dense = torch.zeros(shape, dtype=torch.float32)
    for i, (scores, indices) in enumerate(zip(step_scores, tokens, strict=True)):
        for score, k in zip(scores, indices, strict=True):
            dense[i, k] += float(score)
    return dense
