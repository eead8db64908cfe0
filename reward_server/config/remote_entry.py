"""``kind: remote`` entries of the models file: another HTTP reward service scored through
``reward_client`` (this project's protocol, vLLM's, TEI's), or an OpenAI-compatible chat
endpoint as a judge (``protocol: openai-chat``)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from reward_server.config.entries import _Fallible, one_group

__all__ = ["RemoteEntry", "RemoteProtocol"]

#: How a ``kind: remote`` entry talks to its service (the first three: reward_client's).
RemoteProtocol = Literal["remote-reward", "vllm", "tei", "openai-chat"]

#: Keys only an openai-chat remote reads.
_CHAT_KEYS = ("template", "score_pattern", "max_new_tokens", "temperature", "tool_rendering")


class RemoteEntry(_Fallible):
    """``kind: remote``: a service that scores the items (no model loaded here)."""

    kind: Literal["remote"]
    SELECTOR: ClassVar[str] = "kind: remote"
    RENAMED: ClassVar[dict[str, tuple[str, str]]] = {
        "model": ("remote_model", "the remote service's name of its model"),
        "timeout_s": ("call_timeout_s", "one call's time budget, its retries included"),
        "max_tokens": ("max_new_tokens", "most new tokens of an openai-chat judge's answer"),
    }

    url: str | list[str] | None = Field(default=None, min_length=1)
    """The service's base URL or a list (dns+http:// names as in reward_client)."""
    protocol: RemoteProtocol = "remote-reward"
    """What the service speaks."""
    remote_model: str | None = Field(default=None, min_length=1)
    """The remote model's name where the protocol needs one (openai-chat), or a model of a composite remote-reward server."""
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """The name of the environment variable holding the service's key (never the key)."""
    call_timeout_s: float | None = Field(default=None, gt=0, le=3600)
    """One call's time budget, its retries included, and one request's limit (default 30)."""
    max_concurrent: int = Field(default=8, ge=1, le=4096)
    """Requests in flight to the service at once."""
    max_rpm: int | None = Field(default=None, ge=1)
    """Request starts in any 60 s window."""
    template: str | None = Field(default=None, min_length=1)
    """protocol: openai-chat: the Jinja prompt (as a judge's) or a path to a .jinja file."""
    score_pattern: str | None = Field(default=None, min_length=1)
    """protocol: openai-chat: a regular expression with one group, the score."""
    max_new_tokens: int = Field(default=16, ge=1)
    """protocol: openai-chat: most tokens of the reply."""
    temperature: float = Field(default=0.0, ge=0)
    """protocol: openai-chat: sampling temperature (0: greedy)."""
    tool_rendering: Literal["template", "text"] | None = None
    """protocol: openai-chat: what its template does not read of tool calls and tools: refused (template) or written into response and prompt (text), as a judge's."""

    @model_validator(mode="after")
    def _fits_protocol(self) -> RemoteEntry:
        if self.url is None:
            raise ValueError("kind: remote needs 'url' (one base URL or a list)")
        chat = self.protocol == "openai-chat"
        if chat and (self.template is None or self.score_pattern is None):
            raise ValueError("protocol: openai-chat needs 'template' and 'score_pattern'")
        if chat and self.remote_model is None:
            raise ValueError("protocol: openai-chat needs 'remote_model' (the remote model's name)")
        if self.protocol in ("vllm", "tei") and self.remote_model is not None:
            raise ValueError(
                f"'remote_model': not for protocol: {self.protocol} (it serves one model)"
            )
        given = [key for key in _CHAT_KEYS if key in self.model_fields_set and not chat]
        if given:
            raise ValueError(f"{', '.join(given)}: only for protocol: openai-chat")
        one_group(self.score_pattern)
        return self
