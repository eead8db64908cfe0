"""The ``format`` verifier: does a response have the shape a GRPO format reward asks for?

Pure logic (no I/O): the verifier worker processes call :func:`format_score` on the whole
response, its thinking included (a ``format`` entry keeps the reasoning).

The rules, in order (the first that fails gives the reason, one of :data:`REASONS`):

1. **Thinking.** At most one thinking block (``reasoning_tags``), and it comes first: only
   whitespace before its opening tag. A response with no opening tag and exactly one
   closing tag is read as thinking the generation prompt opened (Qwen3's and DeepSeek-R1's
   prompts end with ``<think>\\n``): everything before the closing tag is the thinking. A
   response with no tag at all has no thinking, which fails when ``require_reasoning``
   (the default); with thinking required, the block must hold more than whitespace.
2. **Answer.** The text after the thinking (the whole response without any) is the answer
   and holds more than whitespace. With ``answer_tags``, it is exactly one tagged block
   with more than whitespace inside and nothing but whitespace around it; the answer is
   then the text inside the tags.
3. **Pattern.** With ``pattern``, ``re.search(pattern, answer)`` finds a match.

1.0 when all hold, else 0.0 and the reason.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

__all__ = ["REASONS", "FormatOptions", "format_score"]

#: Why a response scores 0.0, in the order they are looked for.
REASONS = (
    "no_reasoning",  # no thinking block where one is required
    "several_reasoning_blocks",  # more than one opening or closing thinking tag
    "unclosed_reasoning",  # a thinking block that never closes
    "text_before_reasoning",  # text before the thinking block's opening tag
    "empty_reasoning",  # a required thinking block with nothing but whitespace
    "no_answer",  # nothing after the thinking, or no answer tags, or nothing inside them
    "several_answers",  # more than one opening or closing answer tag
    "unclosed_answer",  # an answer tag that never closes (or a closing tag first)
    "text_outside_answer",  # text before or after the tagged answer
    "pattern_mismatch",  # the pattern is not found in the answer
)


@dataclass(frozen=True, slots=True)
class FormatOptions:
    """What a ``format`` verifier asks of a response (plain picklable data for the workers).

    ``reasoning_tags``: the thinking block's tags. ``answer_tags``: the answer's tags, or
    None for an untagged answer. ``require_reasoning``: a response without thinking fails.
    ``pattern``: a regular expression that must be found (``re.search``) in the answer.
    Raises ValueError for empty or equal tags and a pattern that does not compile.
    """

    reasoning_tags: tuple[str, str] = ("<think>", "</think>")
    answer_tags: tuple[str, str] | None = None
    require_reasoning: bool = True
    pattern: str | None = None

    def __post_init__(self) -> None:
        _check_tags(self.reasoning_tags, "reasoning_tags")
        if self.answer_tags is not None:
            _check_tags(self.answer_tags, "answer_tags")
        if self.pattern is not None:
            try:
                _compiled(self.pattern)
            except re.error as exc:
                message = f"pattern {self.pattern!r} is not a regular expression: {exc}"
                raise ValueError(message) from exc


def _check_tags(tags: tuple[str, str], what: str) -> None:
    if len(tags) != 2 or not all(isinstance(t, str) and t for t in tags) or tags[0] == tags[1]:
        raise ValueError(f"{what} must be two different non-empty strings, not {tags!r}")


@functools.lru_cache(maxsize=64)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def format_score(response: str, options: FormatOptions | None = None) -> tuple[float, str | None]:
    """(1.0, None) when ``response`` has the shape ``options`` ask for, else (0.0, reason)."""
    options = options or FormatOptions()
    answer, reason = _after_thinking(response, options)
    if reason is None:
        answer, reason = _answer(answer, options.answer_tags)
    pattern = options.pattern
    if reason is None and pattern is not None and _compiled(pattern).search(answer) is None:
        reason = "pattern_mismatch"
    return (1.0 if reason is None else 0.0), reason


def _after_thinking(response: str, options: FormatOptions) -> tuple[str, str | None]:
    """The text after the thinking block, or the reason the thinking breaks the rules."""
    start, end = options.reasoning_tags
    opened, closed = response.count(start), response.count(end)
    if opened == 0 and closed == 0:
        return response, ("no_reasoning" if options.require_reasoning else None)
    if opened > 1 or closed > 1:
        return "", "several_reasoning_blocks"
    stop = response.find(end)
    if opened == 0:  # the generation prompt opened the thinking
        thinking = response[:stop]
    else:
        at = response.find(start)
        if closed == 0:
            return "", "unclosed_reasoning"
        if stop < at:  # prompt-opened thinking, then a second block that never closes
            return "", "several_reasoning_blocks"
        if response[:at].strip():
            return "", "text_before_reasoning"
        thinking = response[at + len(start) : stop]
    if options.require_reasoning and not thinking.strip():
        return "", "empty_reasoning"
    return response[stop + len(end) :], None


def _answer(text: str, tags: tuple[str, str] | None) -> tuple[str, str | None]:
    """The answer inside ``text`` (inside its tags when given), or why there is none."""
    if tags is None:
        return text, (None if text.strip() else "no_answer")
    start, end = tags
    opened, closed = text.count(start), text.count(end)
    if opened == 0 and closed == 0:
        return "", "no_answer"
    if opened > 1 or closed > 1:
        return "", "several_answers"
    at, stop = text.find(start), text.find(end)
    if opened == 0 or closed == 0 or stop < at:
        return "", "unclosed_answer"
    if text[:at].strip() or text[stop + len(end) :].strip():
        return "", "text_outside_answer"
    inside = text[at + len(start) : stop]
    return inside, (None if inside.strip() else "no_answer")
