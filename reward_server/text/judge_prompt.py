"""A judge's prompt: its Jinja template (``template`` of a ``kind: judge`` entry) rendered per
item, then put in one user message of the judge's chat template with the generation prompt,
and tokenized so that the next token is the judge's answer. Tokenizer and Jinja only: no
torch, no HTTP.

The template's variables, per item:

* ``prompt``: the query of a pair; of a conversation, the contents of the messages before
  the response joined by a blank line (``"\\n\\n"``; one message: its content); ``""`` for a
  bare text.
* ``response``: the response (a conversation's last message; a bare text as it is).
* ``label``: the item's label (any JSON value; ``None`` without labels). Printed, a string is
  itself, ``None`` nothing, and any other value its JSON; a template may also read into it
  (``{{ label.answer }}``).
* ``messages``: the messages before the response (``[{"role": "user", "content": query}]`` for
  a pair, ``[]`` for a bare text), for templates that want the roles, tool calls and results.
* ``tool_calls``: the response's tool calls (OpenAI's shape, arguments as sent; ``[]`` when
  it made none), and ``tools``: the tools the item offered (``[]`` for none).

A judge that is sent tool calls, tool results or tools must see them: a template that reads
neither ``tool_calls`` (the response's calls) nor ``messages`` (earlier calls and results) nor
``tools`` makes such a request a 422 (:class:`~reward_server.errors.UnrenderableError`),
unless the entry says ``tool_rendering: text``; then what the template does not read is
written into ``response`` and ``prompt`` as text, as a reward model's chat template gets it
(:mod:`reward_server.text.messages`). The thinking of a reasoning policy is removed before
(``reasoning: strip``, a judge's default).

A pairwise judge's template (``mode: pairwise``) compares two responses to one prompt: it
reads ``prompt``, ``messages`` and ``label`` as above and ``response_a``, ``response_b`` (the
two responses, in the order shown) instead of ``response``
(:data:`reward_server.scoring.pairwise_model.PAIRWISE_VARIABLES`,
:meth:`JudgeTemplate.render_variables`). A rubric judge's template (``mode: rubric``) reads
the item's variables and ``criterion``, ``category`` (one criterion's text and category) or
``rubric`` (every criterion) (:data:`reward_server.scoring.rubric_model.RUBRIC_VARIABLES`).

The template runs in Jinja's sandbox with strict undefined variables: a name it does not know
is refused at load, an attribute an item lacks fails that request (ChatTemplateError, 422).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_server.errors import ChatTemplateError, ModelLoadError, UnrenderableError, one_line
from reward_server.text.messages import (
    MessageOptions,
    Support,
    ToolRendering,
    calls_as_text,
    content_text,
    features,
    for_template,
)
from reward_server.text.reasoning import DEFAULT_TAGS
from reward_server.text.rendering import Renderer

if TYPE_CHECKING:
    from reward_server.config import LoadOptions

__all__ = [
    "JUDGE_VARIABLES",
    "JudgePrompt",
    "JudgeRenderer",
    "JudgeTemplate",
    "fit_prompt",
    "is_template_file",
    "item_variables",
    "joined_prompt",
]

#: The variables a judge's template may use.
JUDGE_VARIABLES = ("prompt", "response", "label", "messages", "tool_calls", "tools")


@dataclass(frozen=True, slots=True)
class JudgePrompt:
    """What a judge's template reads of one item."""

    prompt: str
    response: str
    label: Any = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)


def joined_prompt(messages: Sequence[Mapping[str, Any]]) -> str:
    """The ``prompt`` of messages: their contents joined by a blank line."""
    return "\n\n".join(content_text(m.get("content")) for m in messages)


def fit_prompt(item: JudgePrompt, reads: frozenset[str], rendering: ToolRendering) -> JudgePrompt:
    """``item`` as a template that reads the variables ``reads`` sees all of it: the tool calls,
    tool results and tools it does not read written as text into ``response`` and ``prompt``
    (``rendering`` text), else UnrenderableError (the scoring pipeline names the judge)."""
    earlier = features(item.messages, None) - {"reasoning_content"}
    missing = []
    if item.tool_calls and "tool_calls" not in reads:
        missing.append("tool calls")
    if earlier and "messages" not in reads:
        missing.append("tool calls and results of earlier turns")
    if item.tools and "tools" not in reads:
        missing.append("tools")
    if not missing:
        return item
    if rendering == "template":
        raise UnrenderableError(
            f"cannot render {' and '.join(missing)}: its judge template does not read the "
            "variables that hold them (tool_calls, messages, tools). Use them in the template, "
            "or set tool_rendering: text in its models-file entry for the plain-text rendering"
        )
    response, prompt = item.response, item.prompt
    if item.tool_calls and "tool_calls" not in reads:
        response = "\n".join(part for part in (response, calls_as_text(item.tool_calls)) if part)
    if (earlier and "messages" not in reads) or (item.tools and "tools" not in reads):
        tools = item.tools if "tools" not in reads else None
        as_text, _ = for_template(
            item.messages or [{"role": "user", "content": prompt}],
            tools,
            support=Support(),
            rendering="text",
            reasoning_tags=DEFAULT_TAGS,
        )
        prompt = joined_prompt(as_text)
    return replace(item, prompt=prompt, response=response)


def item_variables(item: JudgePrompt) -> dict[str, Any]:
    """The template's variables of one item (:data:`JUDGE_VARIABLES`)."""
    return {
        "prompt": item.prompt,
        "response": item.response,
        "label": item.label,
        "messages": item.messages,
        "tool_calls": item.tool_calls,
        "tools": item.tools,
    }


def is_template_file(template: str) -> bool:
    """A ``template`` of one line ending in ``.jinja`` names a file; anything else is Jinja."""
    return "\n" not in template and template.strip().endswith(".jinja")


def _printed(value: Any) -> Any:
    """How ``{{ value }}`` prints: None as nothing, strings and numbers as they are, other
    values (lists, mappings, booleans) as JSON."""
    if value is None:
        return ""
    if isinstance(value, str) or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


class JudgeTemplate:
    """A judge's Jinja template, compiled once (ModelLoadError when it cannot be)."""

    def __init__(self, source: str, name: str, variables: Sequence[str] = JUDGE_VARIABLES) -> None:
        from jinja2 import StrictUndefined, TemplateSyntaxError, meta
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        self.name = name
        env = ImmutableSandboxedEnvironment(
            undefined=StrictUndefined, finalize=_printed, autoescape=False
        )
        try:
            parsed = env.parse(source)
        except TemplateSyntaxError as exc:
            raise ModelLoadError(f"judge template of {name!r}: {one_line(exc)}") from exc
        used = meta.find_undeclared_variables(parsed)
        #: The variables the template reads.
        self.reads = frozenset(used)
        unknown = used - set(variables) - set(env.globals)
        if unknown:
            raise ModelLoadError(
                f"judge template of {name!r} uses {', '.join(sorted(unknown))}; it knows "
                f"{', '.join(variables)}"
            )
        self._template = env.from_string(source)

    @classmethod
    def from_setting(
        cls, template: str, name: str, variables: Sequence[str] = JUDGE_VARIABLES
    ) -> JudgeTemplate:
        """The entry's ``template``: Jinja text, or a ``.jinja`` file (relative paths from the
        server's working directory) read now; ``variables``: the names it may use."""
        if not is_template_file(template):
            return cls(template, name, variables)
        path = Path(template.strip()).expanduser()
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelLoadError(f"cannot read judge template {template}: {one_line(exc)}") from exc
        return cls(source, name, variables)

    def render(
        self, items: Sequence[JudgePrompt], rendering: ToolRendering = "template"
    ) -> list[str]:
        """Each item's prompt text (ChatTemplateError naming the item that fails; tool calls,
        results and tools the template does not read: :func:`fit_prompt`)."""
        fitted = [fit_prompt(item, self.reads, rendering) for item in items]
        return self.render_variables([item_variables(item) for item in fitted], "item")

    def render_variables(self, each: Sequence[Mapping[str, Any]], what: str) -> list[str]:
        """The template rendered with each mapping of variables (ChatTemplateError naming
        the ``what`` (item, pair ...) that fails, by its index)."""
        from jinja2 import TemplateError

        out: list[str] = []
        for i, variables in enumerate(each):
            try:
                out.append(self._template.render(**variables))
            except (TemplateError, TypeError, ValueError, KeyError, IndexError) as exc:
                raise ChatTemplateError(
                    f"judge template of {self.name!r} failed on {what} {i}: {one_line(exc)}"
                ) from exc
        return out


class JudgeRenderer(Renderer):
    """A judge's :class:`~reward_server.text.rendering.Renderer`: its prompts end where the
    judge's answer begins, so nothing is added after a text (no EOS), and each rendered
    template is one user turn of the chat template with the generation prompt."""

    def __init__(self, tokenizer: Any, **options: Any) -> None:
        """``options``: :class:`Renderer`'s (name, max_length, truncation_side, messages)."""
        super().__init__(tokenizer, **options)
        self.suffix = []  # the next token after the prompt is the answer, not after an EOS

    @classmethod
    def for_model(cls, tokenizer: Any, options: LoadOptions, max_length: int) -> JudgeRenderer:
        """The renderer of the judge loaded with ``options`` (its tokenizer and max length)."""
        return cls(
            tokenizer,
            name=options.model,
            max_length=max_length,
            truncation_side=options.truncation_side,
            messages=MessageOptions.of(options),
        )

    def render_prompts(self, contents: Sequence[str]) -> list[str]:
        """Each content as the one user message of the chat template, with the generation
        prompt; as it is without a chat template."""
        if not self.has_chat_template or not contents:
            return list(contents)
        return self.render_chats([[{"role": "user", "content": content}] for content in contents])

    def render_chats(self, chats: Sequence[Sequence[Mapping[str, str]]]) -> list[str]:
        """Each list of messages through the chat template, with the generation prompt;
        without a chat template, ``role: content`` lines and ``assistant:`` to answer after."""
        if not chats:
            return []
        if not self.has_chat_template:
            return [
                "".join(f"{m['role']}: {m['content']}\n" for m in chat) + "assistant:"
                for chat in chats
            ]
        from jinja2 import TemplateError

        try:
            texts = self.tokenizer.apply_chat_template(
                chats, tokenize=False, add_generation_prompt=True
            )
        except (TemplateError, ValueError, KeyError, TypeError, IndexError) as exc:
            raise ChatTemplateError(
                f"chat template of judge {self.name!r} failed: {one_line(exc)}"
            ) from exc
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise ChatTemplateError(f"chat template of judge {self.name!r} returned no texts")
        return texts
