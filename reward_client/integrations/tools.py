"""Tools as the frameworks hold them (Python functions, or specs) made into OpenAI function
specs, the shape the reward server takes and hands to the chat template's ``tools``.

A spec (``{"type": "function", "function": {"name", "description", "parameters"}}``) is
sent as given; a callable is converted by ``transformers.utils.get_json_schema``, as
``apply_chat_template(tools=...)`` converts it when the policy's prompt is rendered (TRL's
``GRPOTrainer(tools=...)``), so the reward model is shown the same schemas the policy saw.
transformers is imported only when a callable is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from reward_client.inputs import Tool, plain_value

__all__ = ["tool_specs"]


def tool_specs(tools: Sequence[Callable[..., Any] | Tool]) -> list[dict[str, Any]]:
    """OpenAI function specs of ``tools``: a spec as given, a callable converted by
    ``transformers.utils.get_json_schema`` (it needs a Google-style docstring with an
    ``Args:`` entry per parameter and type hints)."""
    if isinstance(tools, (str, Mapping)) or not isinstance(tools, Sequence):
        raise TypeError(f"tools must be a list of callables or tool specs, not {type(tools)}")
    specs = []
    for i, tool in enumerate(tools):
        if isinstance(tool, Mapping):
            specs.append(plain_value(dict(tool)))
        elif callable(tool):
            from transformers.utils import get_json_schema  # only when a callable is given

            specs.append(get_json_schema(tool))
        else:
            raise TypeError(f"tools[{i}] is a {type(tool).__name__}, not a callable or a spec")
    return specs
