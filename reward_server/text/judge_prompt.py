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
  a pair, ``[]`` for a bare text), for templates that want the roles.

A pairwise judge's template (``mode: pairwise``) compares two responses to one prompt: it
reads ``prompt``, ``messages`` and ``label`` as above and ``response_a``, ``response_b`` (the
two responses, in the order shown) instead of ``response``
(:data:`reward_server.scoring.pairwise_model.PAIRWISE_VARIABLES`,
:meth:`JudgeTemplate.render_variables`).

The template runs in Jinja's sandbox with strict undefined variables: a name it does not know
is refused at load, an attribute an item lacks fails that request (ChatTemplateError, 422).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reward_server.errors import ChatTemplateError, ModelLoadError, one_line
from reward_server.text.rendering import Renderer

if TYPE_CHECKING:
    from reward_server.config import LoadOptions

__all__ = ["JUDGE_VARIABLES", "JudgePrompt", "JudgeRenderer", "JudgeTemplate", "is_template_file"]

#: The variables a judge's template may use.
JUDGE_VARIABLES = ("prompt", "response", "label", "messages")


@dataclass(frozen=True, slots=True)
class JudgePrompt:
    """What a judge's template reads of one item."""

    prompt: str
    response: str
    label: Any = None
    messages: list[dict[str, str]] = field(default_factory=list)


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
        unknown = meta.find_undeclared_variables(parsed) - set(variables) - set(env.globals)
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

    def render(self, items: Sequence[JudgePrompt]) -> list[str]:
        """Each item's prompt text (ChatTemplateError naming the item that fails)."""
        return self.render_variables(
            [
                {
                    "prompt": item.prompt,
                    "response": item.response,
                    "label": item.label,
                    "messages": item.messages,
                }
                for item in items
            ],
            "item",
        )

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

    def __init__(self, tokenizer: Any, *, name: str, max_length: int, truncation_side: str) -> None:
        super().__init__(
            tokenizer, name=name, max_length=max_length, truncation_side=truncation_side
        )
        self.suffix = []  # the next token after the prompt is the answer, not after an EOS

    @classmethod
    def for_model(cls, tokenizer: Any, options: LoadOptions, max_length: int) -> JudgeRenderer:
        """The renderer of the judge loaded with ``options`` (its tokenizer and max length)."""
        return cls(
            tokenizer,
            name=options.model,
            max_length=max_length,
            truncation_side=options.truncation_side,
        )

    def render_prompts(self, contents: Sequence[str]) -> list[str]:
        """Each content as the one user message of the chat template, with the generation
        prompt; as it is without a chat template."""
        if not self.has_chat_template or not contents:
            return list(contents)
        from jinja2 import TemplateError

        chats: list[list[Mapping[str, str]]] = [
            [{"role": "user", "content": content}] for content in contents
        ]
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
