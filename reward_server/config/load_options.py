"""What to load and how: the model-related settings, as engines take them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reward_server.config.settings import ServerSettings

__all__ = ["LoadOptions"]


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """What to load and how: the model-related server settings (same names and meaning)."""

    model: str
    adapter: str | None = None
    merge_adapter: bool = False
    dtype: str = "auto"
    device: str = "auto"
    max_length: int | None = None
    truncation_side: str = "left"
    label_index: int = 0
    chat_template: str = "auto"
    trust_remote_code: bool = False
    # What the chat template cannot render of tool calls and tools (template: refused;
    # text: written into the messages), and the tags of kept reasoning written into them.
    tool_rendering: str = "template"
    reasoning_tags: tuple[str, str] = ("<think>", "</think>")
    # Settings of engines that run the model elsewhere (vLLM); the transformers engine
    # ignores them.
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    engine_arg: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> LoadOptions:
        """The options named by the server's settings."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = settings.model_dump(include=names)
        values["engine_arg"] = tuple(values.get("engine_arg", ()))
        return cls(**values)
