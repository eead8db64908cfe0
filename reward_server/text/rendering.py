"""Text to token ids with the reward model's tokenizer: chat templates, pairs, the BOS rule and
truncation. Tokenizer only: no torch, no HTTP, so every engine renders the same way.

The rules:

* Pairs and conversations are rendered with the tokenizer's chat template (no generation
  prompt); without one, a pair is the query and the response joined as they are.
* Special tokens: the tokenizer's special tokens are added, except when a text already starts
  with the BOS token string (a rendered chat template usually does); then none are added.
* Truncation keeps the special tokens in place and cuts the content on one side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reward_server.errors import (
    ChatTemplateError,
    ModelLoadError,
    TextTooLongError,
    UnrenderableError,
    one_line,
)
from reward_server.text.messages import MessageOptions, Support, for_template, probe_support

#: One item's tools: OpenAI function specs.
Tools = Sequence[Mapping[str, Any]]
#: Each item's tools (None: that item has none), or None when no item has any.
ItemTools = Sequence[Tools | None] | None

__all__ = [
    "Encoded",
    "ItemTools",
    "Renderer",
    "RendersText",
    "prepare_tokenizer",
    "read_template",
    "special_affixes",
]

#: Probe texts whose encodings reveal the special tokens a tokenizer adds around a text.
_PROBES = ("hello world", "a", "the quick brown fox")


@dataclass(frozen=True, slots=True)
class Encoded:
    """One tokenized text, ready to score."""

    input_ids: list[int]
    truncated: bool
    num_tokens: int  # == len(input_ids), tokens actually scored


def _at(tools: ItemTools, i: int) -> Tools | None:
    return None if tools is None else tools[i]


def read_template(chat_template: str) -> str | None:
    """``auto``/``none`` -> None (see :func:`prepare_tokenizer`); otherwise the file's text."""
    if chat_template in ("auto", "none"):
        return None
    path = Path(chat_template).expanduser()
    if not path.is_file():
        raise ModelLoadError(f"chat template file not found: {chat_template}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"cannot read chat template {chat_template}: {one_line(exc)}") from exc
    if not text.strip():
        raise ModelLoadError(f"chat template file is empty: {chat_template}")
    return text


def prepare_tokenizer(
    tokenizer: Any, *, name: str, chat_template: str, template: str | None
) -> None:
    """Give ``tokenizer`` a pad token and the chat template asked for, in place.

    ``chat_template``: ``auto`` keeps the tokenizer's own, ``none`` removes it, anything
    else is a file whose text :func:`read_template` gave as ``template``.
    """
    if tokenizer.pad_token is None:
        # Any id works as padding (rows are read at their last real token), EOS is the
        # conventional choice; transformers' pooling code still needs config.pad_token_id.
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise ModelLoadError(f"tokenizer of {name!r} has no pad, eos or unk token")
        tokenizer.pad_token = fallback
    # We tokenize untruncated and cut ourselves; silence transformers' "longer than the
    # maximum ... indexing errors" warning, which would be false here.
    warned = getattr(tokenizer, "deprecation_warnings", None)
    if isinstance(warned, dict):
        warned["sequence-length-is-longer-than-the-specified-maximum"] = True
    if template is not None:
        tokenizer.chat_template = template
    elif chat_template == "none":
        tokenizer.chat_template = None


def special_affixes(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The token ids the tokenizer adds before and after a single text."""
    found: tuple[list[int], list[int]] | None = None
    for probe in _PROBES:
        plain = tokenizer(probe, add_special_tokens=False)["input_ids"]
        full = tokenizer(probe, add_special_tokens=True)["input_ids"]
        n = len(plain)
        starts = [i for i in range(len(full) - n + 1) if full[i : i + n] == plain]
        if not plain or not starts:
            continue
        affixes = (full[: starts[0]], full[starts[0] + n :])
        if found is not None and affixes != found:
            raise ModelLoadError("the tokenizer adds different special tokens to different texts")
        found = affixes
    if found is None:
        raise ModelLoadError("cannot determine which special tokens the tokenizer adds")
    return found


class Renderer:
    """Renders and tokenizes texts for one reward model (its tokenizer, template and limits).

    What its chat template renders of tool calls, tool results, tools and reasoning content is
    probed once, here (:func:`~reward_server.text.messages.probe_support`); ``messages`` says
    what to do with what it does not (:class:`~reward_server.text.messages.MessageOptions`).
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        name: str,
        max_length: int,
        truncation_side: str,
        messages: MessageOptions | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.name = name
        self.max_length = max_length
        self.truncation_side = truncation_side
        self.messages = messages or MessageOptions()
        self.pad_token_id: int = int(tokenizer.pad_token_id)
        self.bos_token: str | None = tokenizer.bos_token or None
        self.bos_token_id: int | None = tokenizer.bos_token_id if self.bos_token else None
        self.prefix, self.suffix = special_affixes(tokenizer)
        if max_length <= len(self.prefix) + len(self.suffix):
            raise ModelLoadError(
                f"max_length {max_length} leaves no room for text after the special tokens"
            )
        #: What the chat template renders (nothing without one).
        self.support = probe_support(self._apply) if self.has_chat_template else Support()

    @property
    def has_chat_template(self) -> bool:
        """Whether pairs and conversations are rendered with a chat template."""
        return bool(getattr(self.tokenizer, "chat_template", None))

    def render_pairs(
        self, queries: Sequence[str], responses: Sequence[str], tools: ItemTools = None
    ) -> list[str]:
        """Render query/response pairs with the chat template (with each pair's ``tools``),
        or join them without one."""
        if len(queries) != len(responses):
            raise ValueError(f"{len(queries)} queries but {len(responses)} responses")
        if not self.has_chat_template:
            return [
                self._tools_without_template(_at(tools, i)) + q + r
                for i, (q, r) in enumerate(zip(queries, responses, strict=True))
            ]
        return self._render(
            [
                [{"role": "user", "content": q}, {"role": "assistant", "content": r}]
                for q, r in zip(queries, responses, strict=True)
            ],
            tools,
        )

    def render_conversations(
        self, conversations: Sequence[Sequence[Mapping[str, Any]]], tools: ItemTools = None
    ) -> list[str]:
        """Render conversations (with each one's ``tools``) with the chat template;
        ChatTemplateError without one."""
        if not self.has_chat_template:
            raise ChatTemplateError(
                f"model {self.name!r} has no chat template; send texts or queries/responses, "
                "or start the server with --chat-template PATH"
            )
        return self._render(conversations, tools)

    def _tools_without_template(self, tools: Tools | None) -> str:
        """The tools of a pair joined without a chat template: written as text in front
        (``tool_rendering: text``), else UnrenderableError."""
        if not tools:
            return ""
        messages, _ = for_template(
            [{"role": "user", "content": ""}],
            tools,
            support=Support(),
            rendering=self.messages.tool_rendering,
            reasoning_tags=self.messages.reasoning_tags,
        )
        return str(messages[0]["content"]) + "\n"

    def _apply(self, messages: list[dict[str, Any]], tools: Tools | None) -> str:
        """The chat template applied to one conversation (no generation prompt)."""
        text = self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False)
        if not isinstance(text, str):
            raise ChatTemplateError(f"chat template returned {type(text).__name__}, not text")
        return text

    def _render(
        self, conversations: Sequence[Sequence[Mapping[str, Any]]], tools: ItemTools
    ) -> list[str]:
        """Apply the chat template to each conversation (no generation prompt), its tool
        calls, tool results and tools as :func:`~reward_server.text.messages.for_template`
        gives them."""
        from jinja2 import TemplateError

        out: list[str] = []
        for i, conversation in enumerate(conversations):
            try:
                messages, given = for_template(
                    conversation,
                    _at(tools, i),
                    support=self.support,
                    rendering=self.messages.tool_rendering,
                    reasoning_tags=self.messages.reasoning_tags,
                )
                out.append(self._apply(messages, given))
            except UnrenderableError as exc:
                raise UnrenderableError(f"conversation {i}: {exc}") from None
            except (TemplateError, ValueError, KeyError, TypeError, IndexError) as exc:
                if isinstance(exc, ChatTemplateError):
                    raise
                raise ChatTemplateError(
                    f"chat template failed on conversation {i}: {one_line(exc)}"
                ) from exc
        return out

    def encode(
        self, texts: Sequence[str], *, truncate: bool, max_length: int | None = None
    ) -> list[Encoded]:
        """Tokenize texts with the special-token rule; truncate or raise TextTooLongError.

        ``max_length``: a tighter limit than the model's for this call (never a looser one).
        """
        limit = self.max_length if max_length is None else min(max_length, self.max_length)
        if not texts:
            return []
        contents: list[list[int]] = self.tokenizer(
            list(texts), add_special_tokens=False, return_attention_mask=False
        )["input_ids"]
        return [
            self._fit(i, *self._affixes(text, content), truncate=truncate, limit=limit)
            for i, (text, content) in enumerate(zip(texts, contents, strict=True))
        ]

    def _affixes(self, text: str, content: list[int]) -> tuple[list[int], list[int], list[int]]:
        """``(prefix, content, suffix)`` of one text by the special-token rule."""
        bos = self.bos_token
        if not (bos and text.startswith(bos)):
            return self.prefix, content, self.suffix
        # Already carries its specials (e.g. a rendered chat template): add none, but keep a
        # leading BOS in place when truncating.
        if content and content[0] == self.bos_token_id:
            return content[:1], content[1:], []
        return [], content, []

    def _fit(
        self,
        index: int,
        prefix: list[int],
        content: list[int],
        suffix: list[int],
        *,
        truncate: bool,
        limit: int,
    ) -> Encoded:
        """Cut the content to ``limit`` tokens (or raise) and put the specials around it."""
        budget = max(0, limit - len(prefix) - len(suffix))
        truncated = len(content) > budget
        if truncated:
            if not truncate:
                raise TextTooLongError(index, len(prefix) + len(content) + len(suffix), limit)
            # (content[-0:] would keep everything: a budget of 0 keeps nothing.)
            content = (
                content[len(content) - budget :]
                if self.truncation_side == "left"
                else content[:budget]
            )
        ids = [*prefix, *content, *suffix]
        if not ids:
            # An empty text with no special tokens: score a lone BOS/EOS/pad token instead of
            # an empty row (the model cannot read a score from zero tokens).
            fallback = self.tokenizer.bos_token_id
            if fallback is None:
                fallback = self.tokenizer.eos_token_id
            ids = [self.pad_token_id if fallback is None else int(fallback)]
        return Encoded(input_ids=ids, truncated=truncated, num_tokens=len(ids))


class RendersText:
    """The rendering half of an engine's Scorer, delegated to its :class:`Renderer`
    (every engine renders and tokenizes the same way)."""

    rendering: Renderer

    @property
    def has_chat_template(self) -> bool:
        """Whether pairs and conversations are rendered with a chat template."""
        return self.rendering.has_chat_template

    def rendering_info(self) -> dict[str, object]:
        """The rendering's part of GET /info."""
        r = self.rendering
        return {
            "model": r.name,
            "max_length": r.max_length,
            "truncation_side": r.truncation_side,
            "chat_template": r.has_chat_template,
        }

    def render_pairs(
        self, queries: Sequence[str], responses: Sequence[str], tools: ItemTools = None
    ) -> list[str]:
        """:meth:`Renderer.render_pairs` of the engine's rendering."""
        return self.rendering.render_pairs(queries, responses, tools)

    def render_conversations(
        self, conversations: Sequence[Sequence[Mapping[str, Any]]], tools: ItemTools = None
    ) -> list[str]:
        """:meth:`Renderer.render_conversations` of the engine's rendering."""
        return self.rendering.render_conversations(conversations, tools)

    def encode(
        self, texts: Sequence[str], *, truncate: bool, max_length: int | None = None
    ) -> list[Encoded]:
        """Tokenize texts with the special-token rule; truncate or raise TextTooLongError
        (``max_length`` tightens the model's limit for this call)."""
        return self.rendering.encode(texts, truncate=truncate, max_length=max_length)
