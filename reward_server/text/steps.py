"""The text side of process reward models (PRMs): a response split into steps, the step tag,
and the token each step is read at. Tokenizer only: no torch, no HTTP.

The rules:

* A response is split on the step separator; the separator belongs to the step before it
  (separators before the first step belong to that step), and empty pieces are dropped. A
  response always has a step: an empty one (or one of separators only) is one step.
* ``step_ends`` are offsets into the response in Python ``str`` indices (Unicode code
  points), exclusive: ``response[:end]`` is the text up to and including that step.
* Without a step tag the model reads the response as it is, and each step at its last
  token: the last token that starts before the step's end (the token holding the step's
  last character, or the one before when no token covers it, e.g. white space in WordPiece).
* With a step tag (Qwen2.5-Math-PRM's ``<extra_0>``) the model reads the steps joined by
  the tag, with the tag after the last one, and each step at its tag token: the separators
  are replaced by the tag, as those models were trained.
* The response is found in the rendered text (chat template or joined pair) by rendering
  the item once more with a marker as its response; a template that trims the response is
  followed, one that changes it otherwise is a :class:`ResponseNotFoundError`.
* Truncation keeps the tokens :class:`~reward_server.text.rendering.Renderer` keeps; steps read at
  a cut token are dropped and counted; when none is left, :class:`StepsTruncatedError`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from reward_server.errors import ModelLoadError, ResponseNotFoundError, StepsTruncatedError
from reward_server.text.messages import content_text
from reward_server.text.rendering import Encoded, ItemTools, Renderer

__all__ = [
    "DEFAULT_STEP_SEPARATOR",
    "STEP_AGGREGATES",
    "Step",
    "StepEncoded",
    "StepOptions",
    "StepRenderer",
    "StepResult",
    "StepScorer",
    "aggregate_steps",
    "read_steps",
    "split_steps",
    "step_results",
    "tagged_response",
]

DEFAULT_STEP_SEPARATOR = "\n\n"
#: How the step scores of an item make its score.
STEP_AGGREGATES = ("min", "mean", "last", "prod")

# Stands in for the response when rendering an item to find where its response goes: a
# private-use character no chat template treats specially.
_MARK = "\ue000"

#: Renders one response per item (the same items each time) into texts.
RenderResponses = Callable[[list[str]], list[str]]


@dataclass(frozen=True, slots=True)
class StepOptions:
    """How a process model splits a response and turns its step scores into one score."""

    separator: str = DEFAULT_STEP_SEPARATOR
    tag: str | None = None
    aggregate: str = "min"

    def __post_init__(self) -> None:
        if not self.separator:
            raise ValueError("step_separator must not be empty")
        if self.tag is not None and not self.tag:
            raise ValueError("step_tag must not be empty (null for none)")
        if self.aggregate not in STEP_AGGREGATES:
            raise ValueError(
                f"step_aggregate must be one of {', '.join(STEP_AGGREGATES)}, "
                f"not {self.aggregate!r}"
            )


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a response: ``response[start:end]`` with its trailing separators,
    ``response[start:content_end]`` without them."""

    start: int
    content_end: int
    end: int


@dataclass(frozen=True, slots=True)
class StepEncoded:
    """One item ready for a process model: its tokens and where each kept step is read."""

    encoded: Encoded
    #: Index into ``encoded.input_ids`` of the token each kept step is read at.
    positions: list[int]
    #: End offset in the response of each kept step (same length as ``positions``).
    step_ends: list[int]
    #: Steps read at a token that truncation cut (left out of the two lists above).
    steps_dropped: int

    @property
    def input_ids(self) -> list[int]:
        """The token ids to score."""
        return self.encoded.input_ids

    @property
    def num_tokens(self) -> int:
        """Tokens scored."""
        return self.encoded.num_tokens

    @property
    def truncated(self) -> bool:
        """Whether truncation cut tokens (steps or not)."""
        return self.encoded.truncated


def split_steps(response: str, separator: str = DEFAULT_STEP_SEPARATOR) -> list[Step]:
    """The steps of ``response`` (at least one; see the module's rules)."""
    steps: list[Step] = []
    start = pos = 0
    for i, piece in enumerate(response.split(separator)):
        if i:  # the separator before this piece closes the step before it
            pos += len(separator)
            if steps:
                steps[-1] = Step(steps[-1].start, steps[-1].content_end, pos)
                start = pos
        pos += len(piece)
        if piece:
            steps.append(Step(start, pos, pos))
            start = pos
    # Empty, or separators only: one step, the whole response.
    return steps or [Step(0, len(response), len(response))]


def tagged_response(response: str, steps: Sequence[Step], tag: str) -> tuple[str, list[int]]:
    """The steps joined by ``tag`` with one after the last (separators replaced), and the
    offset just past each step's tag in that text."""
    parts: list[str] = []
    ends: list[int] = []
    length = 0
    for step in steps:
        part = response[step.start : step.content_end] + tag
        parts.append(part)
        length += len(part)
        ends.append(length)
    return "".join(parts), ends


def aggregate_steps(scores: Sequence[float], how: str) -> float:
    """One score from an item's step scores (``how``: one of :data:`STEP_AGGREGATES`)."""
    if not scores:
        raise ValueError("no step scores to aggregate")
    if how == "min":
        return min(scores)
    if how == "mean":
        return math.fsum(scores) / len(scores)
    if how == "last":
        return scores[-1]
    if how == "prod":
        return math.prod(scores)
    raise ValueError(f"unknown step aggregate {how!r}")


@dataclass(frozen=True, slots=True)
class StepResult:
    """One item's answer from a process model."""

    score: float
    step_scores: list[float]
    step_ends: list[int]
    steps_dropped: int


def read_steps(token_scores: Sequence[float], item: StepEncoded) -> list[float]:
    """The step scores of ``item`` from the per-token scores of its row."""
    return [float(token_scores[p]) for p in item.positions]


def step_results(
    rows: Sequence[Sequence[float]], items: Sequence[StepEncoded], aggregate: str
) -> list[StepResult]:
    """Each item's steps read from its row of per-token scores, and aggregated."""
    if len(rows) != len(items):
        raise RuntimeError(f"{len(rows)} rows of token scores for {len(items)} items")
    results = []
    for row, item in zip(rows, items, strict=True):
        scores = read_steps(row, item)
        results.append(
            StepResult(
                aggregate_steps(scores, aggregate), scores, item.step_ends, item.steps_dropped
            )
        )
    return results


class StepScorer(Protocol):
    """A loaded process model as the server uses it (the transformers engine's is
    ``reward_server.engines._process_reward.ProcessRewardModel``)."""

    #: The model served, its device and the most tokens it scores per text.
    name: str
    device: str
    max_length: int
    #: Renders and tokenizes items and places their steps.
    rendering: StepRenderer
    steps: StepOptions

    def token_scores(self, batch: Sequence[Sequence[int]]) -> list[list[float]]:
        """The step score of every token of each row of token ids, in order."""
        ...

    def info(self) -> dict[str, object]:
        """Static facts for GET /info."""
        ...

    def close(self) -> None:
        """Release the model; no scoring after it."""
        ...


# ---------------------------------------------------------------------- finding the response


@dataclass(frozen=True, slots=True)
class _Rendered:
    """One item rendered and tokenized, before truncation."""

    text: str
    ids: list[int]
    #: Character span of each token in ``text``.
    spans: list[tuple[int, int]]
    #: Offsets in the response the model sees -> offsets in ``text``.
    to_text: Callable[[int], int]
    #: Where each step is read in the response the model sees (just past its last
    #: character, or past its tag) and where it ends in the response sent.
    read_ends: list[int]
    step_ends: list[int]


def _response_region(text: str, marked: str) -> tuple[int, int]:
    """Where the response lies in ``text``, from the same item rendered with the marker as
    its response; the whole text when the marker does not tell."""
    at = marked.find(_MARK)
    if at < 0 or marked.count(_MARK) != 1:
        return 0, len(text)
    head, tail = marked[:at], marked[at + len(_MARK) :]
    fits = len(head) + len(tail) <= len(text)
    if fits and text.startswith(head) and text.endswith(tail):
        return len(head), len(text) - len(tail)
    return 0, len(text)


def _locate(index: int, text: str, marked: str, response: str) -> Callable[[int], int]:
    """A map from offsets in ``response`` to offsets in the rendered ``text``."""
    lo, hi = _response_region(text, marked)
    region = text[lo:hi]
    at = region.rfind(response)
    if at >= 0:
        return lambda offset: lo + at + offset
    # Templates that trim the content (Llama 3's ``| trim``): map into the trimmed text.
    core = response.strip()
    at = region.rfind(core) if core else -1
    if at < 0:
        raise ResponseNotFoundError(
            f"item {index}: the chat template changes the response, so its steps cannot be "
            "found in the rendered text (use a template that keeps the response as it is)"
        )
    lead = len(response) - len(response.lstrip())
    return lambda offset: lo + at + min(max(offset - lead, 0), len(core))


def _last_token_before(starts: Sequence[int], spans: Sequence[tuple[int, int]], end: int) -> int:
    """Index of the last token (with a non-empty span) that starts before ``end``; 0 if none."""
    # Fast tokenizers give offsets in text order, so the starts never decrease.
    j = bisect.bisect_left(starts, end) - 1
    while j > 0 and spans[j][0] == spans[j][1]:
        j -= 1
    return max(j, 0)


def _last_response(index: int, conversation: Sequence[Mapping[str, Any]]) -> str:
    """The response of a conversation: its last message, which must be the assistant's."""
    role = conversation[-1].get("role")
    if role != "assistant":
        raise ResponseNotFoundError(
            f"conversation {index}: a process model scores the last message as the response, "
            f"and it must be the assistant's (role 'assistant', not {role!r})"
        )
    return content_text(conversation[-1].get("content"))


# ---------------------------------------------------------------------- the renderer


class StepRenderer(Renderer):
    """A :class:`Renderer` that also finds where each step of a response is read."""

    def __init__(self, tokenizer: object, *, steps: StepOptions, **options: Any) -> None:
        """``options``: :class:`Renderer`'s (name, max_length, truncation_side, messages)."""
        super().__init__(tokenizer, **options)
        if not getattr(tokenizer, "is_fast", False):
            raise ModelLoadError(
                f"process model {self.name!r} needs a fast tokenizer (its character offsets "
                "place the steps)"
            )
        self.steps = steps
        self.tag_id: int | None = None if steps.tag is None else self._tag_id(steps.tag)

    def _tag_id(self, tag: str) -> int:
        """The one token id of the step tag (ModelLoadError if it is not one token)."""
        ids = self.tokenizer(tag, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise ModelLoadError(
                f"step_tag {tag!r} is {len(ids)} tokens for {self.name!r}'s tokenizer; it must "
                "be one token (a special token of the model)"
            )
        return int(ids[0])

    def info(self) -> dict[str, object]:
        """The step settings for GET /info."""
        s = self.steps
        return {"step_separator": s.separator, "step_tag": s.tag, "step_aggregate": s.aggregate}

    def encode_pairs(
        self,
        queries: Sequence[str],
        responses: Sequence[str],
        *,
        truncate: bool,
        max_length: int | None = None,
        tools: ItemTools = None,
    ) -> list[StepEncoded]:
        """Query/response pairs (with their ``tools``) rendered, tokenized and their steps
        placed."""
        if len(queries) != len(responses):
            raise ValueError(f"{len(queries)} queries but {len(responses)} responses")
        return self._encode_steps(
            list(responses),
            lambda shown: self.render_pairs(queries, shown, tools),
            truncate=truncate,
            max_length=max_length,
        )

    def encode_conversations(
        self,
        conversations: Sequence[Sequence[Mapping[str, Any]]],
        *,
        truncate: bool,
        max_length: int | None = None,
        tools: ItemTools = None,
    ) -> list[StepEncoded]:
        """Conversations (the last message is the response; with their ``tools``) rendered,
        tokenized and their steps placed."""
        responses = [_last_response(i, conv) for i, conv in enumerate(conversations)]

        def render(shown: list[str]) -> list[str]:
            return self.render_conversations(
                [
                    [*conv[:-1], {**conv[-1], "content": response}]
                    for conv, response in zip(conversations, shown, strict=True)
                ],
                tools,
            )

        return self._encode_steps(responses, render, truncate=truncate, max_length=max_length)

    def _encode_steps(
        self,
        responses: list[str],
        render: RenderResponses,
        *,
        truncate: bool,
        max_length: int | None,
    ) -> list[StepEncoded]:
        """Split, render (with the tag if any), tokenize with offsets, truncate, place."""
        if not responses:
            return []
        limit = self.max_length if max_length is None else min(max_length, self.max_length)
        split = [split_steps(r, self.steps.separator) for r in responses]
        shown: list[tuple[str, list[int]]] = [
            (r, [s.end for s in steps])
            if self.steps.tag is None
            else tagged_response(r, steps, self.steps.tag)
            for r, steps in zip(responses, split, strict=True)
        ]
        texts = render([text for text, _ in shown])
        marked = render([_MARK] * len(responses))
        tokens = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        return [
            self._place(
                i,
                _Rendered(
                    text=texts[i],
                    ids=tokens["input_ids"][i],
                    spans=tokens["offset_mapping"][i],
                    to_text=_locate(i, texts[i], marked[i], shown[i][0]),
                    read_ends=shown[i][1],
                    step_ends=[s.end for s in split[i]],
                ),
                truncate=truncate,
                limit=limit,
            )
            for i in range(len(responses))
        ]

    def _place(self, index: int, item: _Rendered, *, truncate: bool, limit: int) -> StepEncoded:
        """Fit one item's tokens to ``limit`` and find the kept token of each step."""
        prefix, content, suffix = self._affixes(item.text, item.ids)
        encoded = self._fit(index, prefix, content, suffix, truncate=truncate, limit=limit)
        if not content:  # an empty text: every step is read at the one token scored
            return StepEncoded(encoded, [0] * len(item.step_ends), list(item.step_ends), 0)
        # The content is the text's tokens, less a leading BOS moved into the prefix.
        spans = item.spans[len(item.ids) - len(content) :]
        starts = [start for start, _ in spans]
        # The content tokens kept: content[first : first + kept].
        kept = min(len(encoded.input_ids) - len(prefix) - len(suffix), len(content))
        first = len(content) - kept if encoded.truncated and self.truncation_side == "left" else 0
        positions: list[int] = []
        step_ends: list[int] = []
        for read_end, step_end in zip(item.read_ends, item.step_ends, strict=True):
            j = _last_token_before(starts, spans, item.to_text(read_end))
            if self.tag_id is not None and content[j] != self.tag_id:
                raise ResponseNotFoundError(
                    f"item {index}: the step tag {self.steps.tag!r} is not where a step ends "
                    "in the rendered text"
                )
            if first <= j < first + kept:
                positions.append(len(prefix) + j - first)
                step_ends.append(step_end)
        if not positions:
            raise StepsTruncatedError(
                f"item {index}: truncation to {limit} tokens ({self.truncation_side} side) "
                "cut every step of the response; nothing is left to score"
            )
        return StepEncoded(encoded, positions, step_ends, len(item.step_ends) - len(positions))
