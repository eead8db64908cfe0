"""TRL adapter: the reward server as a ``reward_funcs`` entry of GRPOTrainer or RLOOTrainer.

``RemoteReward`` is an async callable. TRL (checked against 1.16) detects async reward
functions, including callable instances whose ``__call__`` is a coroutine function, and
awaits them on its own daemon event loop, concurrently with its other async reward
functions; it passes ``prompts``, ``completions``, ``completion_ids``, the dataset's other
columns, ``trainer_state``, ``log_extra`` and ``log_metric`` as keyword arguments.

Plain-text data (``prompts`` and ``completions`` are strings) is sent as
``queries``/``responses``; conversational data (``prompts`` are message lists and each
completion is a message list such as ``[{"role": "assistant", "content": "..."}]``) is
sent as ``conversations``, so the reward server renders it with the reward model's own
chat template and the policy's template never reaches it.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from ppo_client.client import AsyncRewardClient, ScoreResult

__all__ = ["RemoteReward"]

logger = logging.getLogger(__name__)


def _content_text(content: object) -> str:
    """Message content as text; the text parts of multimodal content joined, others dropped."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "".join(parts)
    return str(content)


def _messages(value: object, default_role: str) -> list[dict[str, str]]:
    """Chat messages reduced to ``role`` and text ``content`` (tool calls etc. are dropped)."""
    if isinstance(value, str):
        return [{"role": default_role, "content": value}]
    if isinstance(value, Mapping):
        value = [value]
    if not isinstance(value, Sequence):
        raise TypeError(f"expected a string or a list of chat messages, got {type(value).__name__}")
    messages = []
    for message in value:
        if not isinstance(message, Mapping) or "role" not in message:
            raise TypeError(f"expected chat messages with a 'role', got {message!r}")
        content = _content_text(message.get("content"))
        messages.append({"role": str(message["role"]), "content": content})
    return messages


def _completion_text(completion: object) -> str:
    """A plain completion, or the concatenated contents of a message-list completion."""
    if isinstance(completion, str):
        return completion
    return "".join(m["content"] for m in _messages(completion, "assistant"))


class RemoteReward:
    """Async TRL reward function backed by a running reward server.

    >>> trainer = GRPOTrainer(model=..., reward_funcs=[RemoteReward("http://rm:8000")], ...)

    ``name`` becomes ``__name__``, which TRL uses in its logs (``rewards/<name>/mean``).
    When TRL passes ``log_metric``, the fraction of texts the server truncated is logged as
    ``rewards/<name>/truncated_frac``. ``retry_timeout`` is how long, in seconds, a request
    is retried while the server is unreachable or busy (default 600, enough for a restart).
    ``protocol``: what the server speaks (``remote-reward``, ``vllm``, ``tei``, ``openrlhf``
    or ``auto``; see :mod:`ppo_client.protocols`).
    Other keyword arguments (``timeout``, ``retry``, ``max_client_batch``,
    ``max_concurrency``, ``on_retry``, ...; see :class:`~ppo_client.client.ClientOptions`)
    go to :class:`~ppo_client.client.AsyncRewardClient`.
    """

    def __init__(
        self,
        url_or_urls: str | Sequence[str],
        api_key: str | None = None,
        *,
        name: str = "remote_reward",
        truncate: bool | None = None,
        http_client: httpx.AsyncClient | None = None,
        retry_timeout: float | None = None,
        protocol: str = "remote-reward",
        **client_kwargs: Any,
    ) -> None:
        self.__name__ = name
        self.__qualname__ = name
        self.truncate = truncate
        self._client_args: dict[str, Any] = {
            "base_urls": url_or_urls,
            "api_key": api_key,
            "retry_timeout": retry_timeout,
            "protocol": protocol,
            **client_kwargs,
        }
        # Built now so that bad arguments fail here, not in the first training step.
        self._shared = http_client is not None
        self._unclaimed: AsyncRewardClient | None = AsyncRewardClient(
            **self._client_args, http_client=http_client
        )
        # An httpx.AsyncClient's connections belong to the event loop that opened them.
        # TRL awaits reward functions on one daemon loop, but a user may call us from
        # several loops (asyncio.run per call), so each loop gets its own client.
        self._per_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncRewardClient]
        self._per_loop = weakref.WeakKeyDictionary()

    def __repr__(self) -> str:
        return f"RemoteReward({self._client_args['base_urls']!r}, name={self.__name__!r})"

    @property
    def client(self) -> AsyncRewardClient:
        """The client for the running event loop (created on first use in that loop)."""
        if self._shared:
            assert self._unclaimed is not None
            return self._unclaimed
        loop = asyncio.get_running_loop()
        client = self._per_loop.get(loop)
        if client is None:
            client, self._unclaimed = self._unclaimed, None
            client = client or AsyncRewardClient(**self._client_args)
            self._per_loop[loop] = client
        return client

    async def aclose(self) -> None:
        """Close the running loop's client (a passed-in ``http_client`` stays open)."""
        if self._shared:
            return
        client = self._per_loop.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    async def score_detailed(
        self, prompts: Sequence[object], completions: Sequence[object]
    ) -> ScoreResult:
        """Scores with token counts and truncation flags for TRL-style prompts and completions."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        if not prompts:
            return ScoreResult([], [], [])
        # TRL decides per batch from the first prompt whether data is conversational.
        if isinstance(prompts[0], str):
            queries = [str(p) for p in prompts]
            responses = [_completion_text(c) for c in completions]
            return await self.client.score_detailed(
                queries=queries, responses=responses, truncate=self.truncate
            )
        conversations = [
            _messages(p, "user") + _messages(c, "assistant")
            for p, c in zip(prompts, completions, strict=True)
        ]
        return await self.client.score_detailed(conversations=conversations, truncate=self.truncate)

    async def __call__(
        self, prompts: Sequence[object], completions: Sequence[object], **kwargs: Any
    ) -> list[float]:
        """One float per completion, in order (TRL's ``reward_funcs`` signature)."""
        result = await self.score_detailed(prompts, completions)
        log_metric: Callable[[str, float], None] | None = kwargs.get("log_metric")
        if callable(log_metric) and len(result):
            log_metric(f"rewards/{self.__name__}/truncated_frac", result.truncated_frac)
        return result.scores
