"""A reasoning model's thinking told apart from its answer. Plain text only: no tokenizer.

A reasoning policy writes its thinking between two tags (``<think>`` and ``</think>`` by
default) before its answer, or sends it apart (an assistant message's
``reasoning_content``). Reward models and judges are trained on final answers, and
verifiers check the answer, so by default (``reasoning: strip``) the thinking is removed
before anything is rendered or read; a process reward model, whose steps are the thinking,
keeps it (``reasoning: keep``). The rules of :func:`answer`:

* every closed block (the opening tag, the thinking, the closing tag) is removed, with the
  white space after it (so ``<think>x</think>\\n\\nanswer`` is ``answer``, as Qwen3's own
  template writes earlier turns);
* in a response, a closing tag before any opening tag ends a thinking block that the prompt
  opened (DeepSeek-R1's and some Qwen3 generation prompts end with ``<think>``): everything
  up to it is thinking;
* an opening tag that never closes means the policy ran out of tokens while thinking: the
  answer is what came before it, and the item is *unclosed* (masked by default, with the
  reason ``unclosed_reasoning``: there is no answer to score).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_TAGS", "Answer", "answer"]

#: The tags of a thinking block unless a model's entry names others.
DEFAULT_TAGS = ("<think>", "</think>")


@dataclass(frozen=True, slots=True)
class Answer:
    """A text with its thinking removed."""

    text: str
    #: True when a thinking block never closed (the text is what came before it).
    unclosed: bool = False
    #: True when something was removed.
    changed: bool = False


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def answer(text: str, tags: tuple[str, str] = DEFAULT_TAGS, *, response: bool = True) -> Answer:
    """``text`` without its thinking blocks (see the module's rules). ``response``: the text
    is a response, which may begin inside a block the prompt opened; False for a whole text
    (prompt and response), where a closing tag alone is left as it is."""
    opening, closing = tags
    if opening not in text and closing not in text:
        return Answer(text)
    kept: list[str] = []
    at = 0
    first_open = text.find(opening)
    first_close = text.find(closing)
    if response and first_close >= 0 and (first_open < 0 or first_close < first_open):
        at = _skip_space(text, first_close + len(closing))
    while True:
        start = text.find(opening, at)
        if start < 0:
            kept.append(text[at:])
            joined = "".join(kept)
            return Answer(joined, changed=joined != text)
        kept.append(text[at:start])
        end = text.find(closing, start + len(opening))
        if end < 0:
            return Answer("".join(kept), unclosed=True, changed=True)
        at = _skip_space(text, end + len(closing))
