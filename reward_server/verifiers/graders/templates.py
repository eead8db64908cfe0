"""OpenAI's grader templating: ``{{ item.x }}`` and ``{{ sample.y }}`` in a template string
are replaced by the value at that path (a string as it is, anything else as JSON).

``item`` is the dataset row (the request's label, an object); ``sample`` is built from the
response (:func:`build_sample`): ``output_text``, ``output_json`` (the text parsed as JSON;
reading it from a response that is not JSON is a ``sample_parse_error``), ``output_tools``
(the response's tool calls, OpenAI's shape, ``function.arguments`` a JSON string) and
``choices`` (one chat completion choice holding the message). A path the namespace lacks is
an ``invalid_variable_error``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from reward_server.config.graders import parse_path
from reward_server.verifiers.graders.errors import GradeFailure

__all__ = ["build_sample", "lookup", "render"]

_VARIABLE = re.compile(r"\{\{\s*(.*?)\s*\}\}")
#: Marks a sample whose text is not JSON (its output_json cannot be read).
_NOT_JSON = object()


def _tool_call(call: Mapping[str, Any], index: int) -> dict[str, Any]:
    """A tool call in OpenAI's shape, its arguments a JSON string."""
    function = dict(call.get("function") or {})
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        function["arguments"] = json.dumps(arguments if arguments is not None else {})
    return {"id": call.get("id") or f"call_{index}", "type": "function", "function": function}


def build_sample(
    output_text: str, tool_calls: Sequence[Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """The ``sample`` namespace of a response: its text, its JSON, its tool calls, its choice."""
    try:
        output_json: Any = json.loads(output_text)
    except (json.JSONDecodeError, RecursionError):
        output_json = _NOT_JSON
    tools = [_tool_call(call, i) for i, call in enumerate(tool_calls or [])]
    message: dict[str, Any] = {"role": "assistant", "content": output_text}
    if tools:
        message["tool_calls"] = tools
    return {
        "output_text": output_text,
        "output_json": output_json,
        "output_tools": tools,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": "tool_calls" if tools else "stop",
            }
        ],
    }


def public_sample(sample: Mapping[str, Any]) -> dict[str, Any]:
    """The sample as a python grader receives it (``output_json`` None when not JSON)."""
    out = dict(sample)
    if out.get("output_json") is _NOT_JSON:
        out["output_json"] = None
    return out


def lookup(path: tuple[str | int, ...], namespaces: Mapping[str, Any]) -> Any:
    """The value at ``path`` (its first step a namespace); GradeFailure when it is not there."""
    shown = ".".join(str(step) for step in path)
    value: Any = namespaces
    for i, step in enumerate(path):
        if i == 2 and path[:2] == ("sample", "output_json") and value is _NOT_JSON:
            raise GradeFailure("sample_parse_error", f"{{{{ {shown} }}}}: the sample is not JSON")
        try:
            keyed = isinstance(value, Mapping) and isinstance(step, str)
            if not keyed and not (isinstance(value, list) and isinstance(step, int)):
                raise KeyError(step)
            value = value[step]
        except (KeyError, IndexError):
            raise GradeFailure(
                "invalid_variable_error", f"{{{{ {shown} }}}}: no {step!r} there"
            ) from None
    if value is _NOT_JSON:
        raise GradeFailure("sample_parse_error", f"{{{{ {shown} }}}}: the sample is not JSON")
    return value


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def render(template: str, sample: Mapping[str, Any], item: Any) -> str:
    """``template`` with each variable replaced by its value; GradeFailure for a variable
    that is not there."""
    namespaces = {"sample": sample, "item": item}
    return _VARIABLE.sub(lambda m: _text(lookup(parse_path(m.group(1)), namespaces)), template)
