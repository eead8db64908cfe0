"""OpenAI chat messages as a chat template takes them, what a template can render of them, and
the plain-text rendering for what it cannot. Plain data only: no tokenizer, no torch, no HTTP.

A message is a dict in OpenAI's chat shape (checked at the HTTP edge): ``role``, ``content``
(a string or None; text parts were joined at the edge), an assistant's ``tool_calls``
(``[{"id", "type": "function", "function": {"name", "arguments"}}]``, arguments a JSON string
or an object), a tool result's ``tool_call_id`` and ``name``, an assistant's
``reasoning_content``, and any other key, which reaches the template as it is. ``tools`` are
OpenAI function specs (``{"type": "function", "function": {"name", "description",
"parameters"}}``).

:func:`for_template` gives a conversation as transformers' ``apply_chat_template(messages,
tools=...)`` documents it for tool-use templates: content never None (``""``), each call's
``arguments`` an object when they are a JSON object. What a template cannot render
(:class:`Support`, learned once per model by :func:`probe_support`) is never dropped: it is a
:class:`~reward_server.errors.UnrenderableError` naming the model and the part, unless the
model's entry asks for the plain-text rendering (``tool_rendering: text``), which writes it
into the contents the way Hermes-style templates (Qwen2.5's) do:

* each tool call, after the assistant's content, as ``<tool_call>\\n{"name": ..., "arguments":
  {...}}\\n</tool_call>`` (one block per call, newline-separated);
* tool results, as one ``user`` message holding each result as ``<tool_response>\\n...\\n
  </tool_response>`` (consecutive results merged, so roles still alternate);
* the tools, in front of the first system message's content (else the first message's) as
  ``# Tools\\n\\n<tools>\\n{spec}\\n...\\n</tools>`` (one JSON spec per line).

``reasoning_content`` (kept only where the entry says ``reasoning: keep``) that the template
does not render is written in front of the content between the entry's reasoning tags.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from reward_server.errors import UnrenderableError
from reward_server.text.reasoning import DEFAULT_TAGS

__all__ = [
    "FEATURES",
    "Feature",
    "MessageOptions",
    "Support",
    "ToolRendering",
    "calls_as_text",
    "content_text",
    "features",
    "for_template",
    "parse_arguments",
    "probe_support",
    "tool_call_list",
]

#: What a conversation may carry beyond roles and text that a chat template may not render.
Feature = Literal["tool_calls", "tool_results", "tools", "reasoning_content"]
FEATURES: tuple[Feature, ...] = ("tool_calls", "tool_results", "tools", "reasoning_content")
#: How a model renders what its template cannot: refuse (``template``, the default) or write
#: it into the contents as plain text (``text``).
ToolRendering = Literal["template", "text"]


@dataclass(frozen=True, slots=True)
class MessageOptions:
    """A model's choices for what its chat template cannot render: ``tool_rendering``, and
    the tags that enclose kept reasoning written into the content."""

    tool_rendering: ToolRendering = "template"
    reasoning_tags: tuple[str, str] = DEFAULT_TAGS

    @classmethod
    def of(cls, options: Any) -> MessageOptions:
        """The message options of a model's load options (``tool_rendering``,
        ``reasoning_tags``)."""
        return cls(options.tool_rendering, tuple(options.reasoning_tags))


#: What each feature is called in an error message.
_SAID: dict[Feature, str] = {
    "tool_calls": "tool calls",
    "tool_results": "tool results (role tool)",
    "tools": "tool specs (tools)",
    "reasoning_content": "reasoning_content",
}

#: Markers the probes look for in a rendered text: rare strings no template writes itself.
_NAME, _VALUE, _RESULT, _TOOL, _THOUGHT = (
    "probe_fn_q7x",
    "probe_value_q7x",
    "probe_result_q7x",
    "probe_tool_q7x",
    "probe_thought_q7x",
)
# Nine letters and digits: Mistral's templates refuse any other tool call id.
_CALL_ID = "q7x000001"


def content_text(content: Any) -> str:
    """A message's content as text: a string as it is, None as ``""``, text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content if isinstance(part, Mapping))


def parse_arguments(arguments: Any) -> Any:
    """A tool call's arguments as an object when they are a JSON object (a string of one is
    parsed); anything else as it is (a string that is not JSON stays the policy's text)."""
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
        return parsed if isinstance(parsed, dict) else arguments
    return arguments


def tool_call_list(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A message's tool calls (``[]`` for none)."""
    calls = message.get("tool_calls")
    return [dict(call) for call in calls] if isinstance(calls, list) else []


def features(
    conversation: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None
) -> set[Feature]:
    """The features a conversation (and its tools) carries."""
    found: set[Feature] = set()
    if tools:
        found.add("tools")
    for message in conversation:
        if tool_call_list(message):
            found.add("tool_calls")
        if message.get("role") == "tool":
            found.add("tool_results")
        if message.get("reasoning_content"):
            found.add("reasoning_content")
    return found


@dataclass(frozen=True, slots=True)
class Support:
    """Which features a chat template renders (each probed: its marker appears)."""

    tool_calls: bool = False
    tool_results: bool = False
    tools: bool = False
    reasoning_content: bool = False

    def renders(self, feature: Feature) -> bool:
        """Whether the template renders ``feature``."""
        return bool(getattr(self, feature))

    def missing(self) -> list[str]:
        """The features it does not render, as an error message names them."""
        return [_SAID[f] for f in FEATURES if not self.renders(f)]


#: Renders one conversation with optional tools into text; raises when the template fails.
Render = Callable[[list[dict[str, Any]], list[dict[str, Any]] | None], str]


def _probe_call() -> dict[str, Any]:
    arguments = {"probe_arg": _VALUE}
    return {"id": _CALL_ID, "type": "function", "function": {"name": _NAME, "arguments": arguments}}


def _probe_tool() -> dict[str, Any]:
    parameters = {"type": "object", "properties": {"probe_arg": {"type": "string"}}}
    function = {"name": _TOOL, "description": "A probe.", "parameters": parameters}
    return {"type": "function", "function": function}


def _shows(render: Render, conversation: list[dict[str, Any]], tools: Any, *marks: str) -> bool:
    try:
        text = render(conversation, tools)
    except Exception:  # any template failure means: it does not render this
        return False
    return all(mark in text for mark in marks)


def probe_support(render: Render) -> Support:
    """Which features the template behind ``render`` renders: each probed with a small
    conversation whose marker must appear in the text (a template that raises on it does
    not render it)."""
    user = {"role": "user", "content": "Probe."}
    calling = {"role": "assistant", "content": "", "tool_calls": [_probe_call()]}
    result = {"role": "tool", "tool_call_id": _CALL_ID, "name": _NAME, "content": _RESULT}
    answer = {"role": "assistant", "content": "Done."}
    thinking = {"role": "assistant", "content": "Done.", "reasoning_content": _THOUGHT}
    return Support(
        tool_calls=_shows(render, [user, calling], None, _NAME, _VALUE),
        tool_results=_shows(render, [user, calling, result, answer], None, _RESULT),
        tools=_shows(render, [user, answer], [_probe_tool()], _TOOL),
        reasoning_content=_shows(render, [user, thinking], None, _THOUGHT),
    )


def _call_json(call: Mapping[str, Any]) -> str:
    function = call.get("function") or {}
    plain = {"name": function.get("name"), "arguments": parse_arguments(function.get("arguments"))}
    return json.dumps(plain, ensure_ascii=False)


def calls_as_text(calls: Sequence[Mapping[str, Any]]) -> str:
    """Tool calls in the plain-text rendering: one ``<tool_call>`` block per call."""
    return "\n".join(f"<tool_call>\n{_call_json(call)}\n</tool_call>" for call in calls)


def _joined(*parts: str) -> str:
    return "\n".join(part for part in parts if part)


def _tools_text(tools: Sequence[Any]) -> str:
    lines = "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools)
    return f"# Tools\n\n<tools>\n{lines}\n</tools>"


@dataclass(frozen=True, slots=True)
class _Plan:
    """What :func:`for_template` writes as text rather than giving to the template."""

    calls: bool
    results: bool
    tools: bool
    reasoning: bool
    tags: tuple[str, str]


def _message(message: Mapping[str, Any], plan: _Plan) -> dict[str, Any]:
    """One message for the template (tool results as text are handled by the caller)."""
    out = dict(message)
    content = content_text(out.get("content"))
    reasoning = out.pop("reasoning_content", None) if plan.reasoning else None
    if reasoning:
        opening, closing = plan.tags
        content = f"{opening}{reasoning}{closing}{content}"
    calls = tool_call_list(out)
    if calls and plan.calls:
        del out["tool_calls"]
        content = _joined(content, calls_as_text(calls))
    elif calls:
        out["tool_calls"] = [_with_parsed_arguments(call) for call in calls]
    out["content"] = content
    return out


def _with_parsed_arguments(call: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(call)
    function = out.get("function")
    if isinstance(function, Mapping):
        out["function"] = {**function, "arguments": parse_arguments(function.get("arguments"))}
    return out


def _check(used: set[Feature], support: Support, rendering: ToolRendering) -> None:
    """UnrenderableError unless every used feature is rendered, or written as text."""
    unrendered = [f for f in FEATURES if f in used and not support.renders(f)]
    refused = [f for f in unrendered if f != "reasoning_content"]
    if refused and rendering == "template":
        what = " and ".join(_SAID[f] for f in refused)
        raise UnrenderableError(
            f"cannot render {what}: its chat template does not show them. Give it a template "
            "that does (--chat-template / chat_template), or set tool_rendering: text in its "
            "models-file entry (--tool-rendering text) for the plain-text rendering"
        )


def for_template(
    conversation: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    *,
    support: Support,
    rendering: ToolRendering,
    reasoning_tags: tuple[str, str],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The messages and tools to hand to the chat template (see the module's docstring);
    UnrenderableError when the template cannot render a feature used and ``rendering`` is
    ``template`` (its message says what; the scoring pipeline names the model)."""
    used = features(conversation, tools)
    _check(used, support, rendering)
    plan = _Plan(
        calls=not support.tool_calls,
        results=not support.tool_results,
        tools=not support.tools,
        reasoning=not support.reasoning_content,
        tags=reasoning_tags,
    )
    out: list[dict[str, Any]] = []
    merged: int | None = None  # where consecutive tool results written as text go
    for message in conversation:
        if message.get("role") == "tool" and plan.results:
            text = f"<tool_response>\n{content_text(message.get('content'))}\n</tool_response>"
            if merged is not None and merged == len(out) - 1:
                out[merged]["content"] = _joined(out[merged]["content"], text)
            else:
                merged = len(out)
                out.append({"role": "user", "content": text})
            continue
        out.append(_message(message, plan))
    if not tools:
        return out, None
    if not plan.tools:
        return out, [dict(tool) for tool in tools]
    return _with_tools_text(out, tools), None


def _with_tools_text(
    messages: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The tools written in front of the first system message's content (else the first
    message's)."""
    if not messages:
        return messages
    at = next((i for i, m in enumerate(messages) if m.get("role") == "system"), 0)
    first = messages[at]
    messages[at] = {**first, "content": _joined(_tools_text(tools), first.get("content", ""))}
    return messages
