"""verl adapter: the reward server as verl's ``custom_reward_function``.

verl (checked against 0.9.1) imports ``custom_reward_function.name`` from
``custom_reward_function.path`` (``pkg://ppo_client.verl`` imports this module) and calls it
with keyword arguments only, merging ``custom_reward_function.reward_kwargs`` into them:

- the reward-loop managers of 0.9 (``naive``, ``dapo``, ``limited``, ``remote``) and the
  per-sample managers of earlier releases call
  ``compute_score(data_source=, solution_str=, ground_truth=, extra_info=)`` once per
  sample. The reward loop awaits it when it is a coroutine function
  (:func:`compute_score_async`, concurrent on verl's event loop) and runs it on a thread
  pool otherwise (:func:`compute_score`); ``remote`` takes only the sync one.
- the ``batch`` manager (before the reward loop) calls
  ``compute_score(data_sources=, solution_strs=, ground_truths=, extra_infos=)`` once per
  batch and wants a list (:func:`compute_score_batch`).

``solution_str`` is the policy's response decoded without special tokens; verl passes no
prompt, so the prompt comes from ``extra_info[prompt_key]``, written there by the data
preprocessing: a list of chat messages is scored as a conversation (the server renders it
with the reward model's own template), a string as a query/response pair, and without a
prompt the response alone is scored as a text. ``data_source`` and ``ground_truth`` are not
used. Each function returns the score as a float, or with ``reward_details`` a dict
``{"score", "tokens", "truncated"}`` whose other keys verl logs as extra reward info.

Settings come from keyword arguments (``reward_kwargs``) first, then the environment:
``reward_url`` / ``REWARD_URL`` (one URL, a comma-separated list or a list),
``reward_api_key`` / ``REWARD_API_KEY``, ``reward_timeout`` / ``REWARD_TIMEOUT`` (seconds,
default 60), ``prompt_key`` / ``REWARD_PROMPT_KEY`` (default ``"prompt"``),
``reward_details`` / ``REWARD_DETAILS`` and ``reward_client_options`` (a mapping of further
keyword arguments for the reward client, such as ``max_retries``). One client per setting
is kept for the whole process (per event loop for the async client), so calls reuse their
connections.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ppo_client.client import AsyncRewardClient, RewardClient, ScoreResult
from ppo_client.trl import _messages

__all__ = [
    "aclose_clients",
    "close_clients",
    "compute_score",
    "compute_score_async",
    "compute_score_batch",
]

logger = logging.getLogger(__name__)

#: Keyword arguments verl's reward loop adds when it runs its own reward model: not ours.
_VERL_KWARGS = frozenset({"reward_router_address", "reward_model_tokenizer"})
_OUR_KWARGS = frozenset(
    {
        "reward_url",
        "reward_api_key",
        "reward_timeout",
        "prompt_key",
        "reward_details",
        "reward_client_options",
    }
)
_TRUE = frozenset({"1", "true", "yes", "on"})

Score = float | dict[str, Any]


@dataclass(frozen=True)
class _Settings:
    """Where and how to score; ``client_key`` identifies one cached client."""

    urls: tuple[str, ...]
    api_key: str | None
    timeout: float
    options: tuple[tuple[str, Any], ...]
    prompt_key: str
    details: bool

    @property
    def client_key(self) -> tuple[Any, ...]:
        return (self.urls, self.api_key, self.timeout, self.options)

    def client_kwargs(self) -> dict[str, Any]:
        return {
            "base_urls": list(self.urls),
            "api_key": self.api_key,
            "timeout": self.timeout,
            **dict(self.options),
        }


_warned: set[str] = set()


def _warn_once(key: str, message: str, *args: object) -> None:
    """Log a warning the first time ``key`` comes up in this process."""
    if key not in _warned:
        _warned.add(key)
        logger.warning(message, *args)


def _urls(value: str | Iterable[object]) -> tuple[str, ...]:
    """Base URLs from a string (comma-separated allowed) or a list of strings."""
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    urls = tuple(u.strip() for u in items if u.strip())
    if not urls:
        raise ValueError(
            "no reward server URL: set REWARD_URL or custom_reward_function.reward_kwargs.reward_url"
        )
    return urls


def _settings(kwargs: Mapping[str, Any]) -> _Settings:
    """Settings from the call's keyword arguments, then the environment, then defaults."""
    for name in kwargs.keys() - _OUR_KWARGS - _VERL_KWARGS:
        _warn_once(f"kwarg:{name}", "ppo_client.verl ignores the keyword argument %r", name)
    env = os.environ
    details = kwargs.get("reward_details", env.get("REWARD_DETAILS", ""))
    if isinstance(details, str):
        details = details.strip().lower() in _TRUE
    options = kwargs.get("reward_client_options") or {}
    return _Settings(
        urls=_urls(kwargs.get("reward_url") or env.get("REWARD_URL") or ""),
        api_key=kwargs.get("reward_api_key") or env.get("REWARD_API_KEY") or None,
        timeout=float(kwargs.get("reward_timeout") or env.get("REWARD_TIMEOUT") or 60.0),
        # Sorted so that equal options give the same cached client.
        options=tuple(sorted((str(k), v) for k, v in dict(options).items())),
        prompt_key=str(kwargs.get("prompt_key") or env.get("REWARD_PROMPT_KEY") or "prompt"),
        details=bool(details),
    )


_lock = threading.Lock()
_sync_clients: dict[tuple[Any, ...], RewardClient] = {}
# An httpx.AsyncClient's connections belong to the event loop that opened them, so the
# async clients are kept per loop and forgotten with it.
_async_clients: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[Any, ...], AsyncRewardClient]
] = weakref.WeakKeyDictionary()


def _sync_client(settings: _Settings) -> RewardClient:
    with _lock:
        client = _sync_clients.get(settings.client_key)
        if client is None:
            client = RewardClient(**settings.client_kwargs())
            _sync_clients[settings.client_key] = client
        return client


def _async_client(settings: _Settings) -> AsyncRewardClient:
    loop = asyncio.get_running_loop()
    with _lock:
        clients = _async_clients.setdefault(loop, {})
        client = clients.get(settings.client_key)
        if client is None:
            client = AsyncRewardClient(**settings.client_kwargs())
            clients[settings.client_key] = client
        return client


def close_clients() -> None:
    """Close the cached blocking clients and forget every cached async client."""
    with _lock:
        clients = list(_sync_clients.values())
        _sync_clients.clear()
        _async_clients.clear()
    for client in clients:
        client.close()


async def aclose_clients() -> None:
    """Close the async clients cached for the running event loop."""
    with _lock:
        clients = _async_clients.pop(asyncio.get_running_loop(), {})
    for client in clients.values():
        await client.aclose()


def _prompt(extra_info: object, key: str) -> str | list[dict[str, str]] | None:
    """The prompt stored in ``extra_info[key]``: text, chat messages or None."""
    if not isinstance(extra_info, Mapping):
        return None
    value = extra_info.get(key)
    if value is None:
        return None
    if isinstance(value, str):
        return value
    # verl reads parquet columns into numpy object arrays: a message list arrives as one.
    if hasattr(value, "tolist"):
        value = value.tolist()
    return _messages(value, "user")


@dataclass
class _Group:
    """The items of one input form: their positions in the batch and the request columns."""

    positions: list[int]
    columns: dict[str, list[Any]]


def _groups(solution_strs: Sequence[str], extra_infos: Sequence[object], key: str) -> list[_Group]:
    """Split a batch into at most one request per input form, keeping each item's position."""
    groups: dict[str, _Group] = {}
    for i, (response, extra_info) in enumerate(zip(solution_strs, extra_infos, strict=True)):
        prompt = _prompt(extra_info, key)
        item: dict[str, Any]
        if prompt is None:
            _warn_once(
                f"prompt:{key}", "extra_info has no %r: scoring the response alone as a text", key
            )
            item = {"texts": response}
        elif isinstance(prompt, str):
            item = {"queries": prompt, "responses": response}
        else:
            item = {"conversations": [*prompt, {"role": "assistant", "content": response}]}
        group = groups.setdefault(",".join(item), _Group([], {name: [] for name in item}))
        group.positions.append(i)
        for name, value in item.items():
            group.columns[name].append(value)
    return list(groups.values())


def _prepare(
    solution_strs: Iterable[str], extra_infos: Iterable[object] | None, kwargs: Mapping[str, Any]
) -> tuple[_Settings, int, list[_Group]]:
    """Settings, batch size and per-form requests of one call."""
    settings = _settings(kwargs)
    responses = [str(s) for s in solution_strs]
    extras = [None] * len(responses) if extra_infos is None else list(extra_infos)
    if len(extras) != len(responses):
        raise ValueError(f"{len(responses)} solution_strs but {len(extras)} extra_infos")
    return settings, len(responses), _groups(responses, extras, settings.prompt_key)


def _assemble(
    size: int, groups: Sequence[_Group], results: Sequence[ScoreResult], details: bool
) -> list[Score]:
    """Per-item scores (or detail dicts) back in batch order."""
    out: list[Score] = [0.0] * size
    for group, result in zip(groups, results, strict=True):
        for j, position in enumerate(group.positions):
            score = result.scores[j]
            out[position] = (
                {"score": score, "tokens": result.tokens[j], "truncated": result.truncated[j]}
                if details
                else score
            )
    return out


def compute_score_batch(
    data_sources: Sequence[Any],
    solution_strs: Sequence[str],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[Score]:
    """Batched verl reward function (``reward_manager=batch``): one score per response."""
    settings, size, groups = _prepare(solution_strs, extra_infos, kwargs)
    client = _sync_client(settings)
    results = [client.score_detailed(**group.columns) for group in groups]
    return _assemble(size, groups, results, settings.details)


def compute_score(
    data_source: Any,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Score:
    """verl reward function for one response (thread-safe; verl runs it on a thread pool)."""
    return compute_score_batch(
        [data_source], [solution_str], [ground_truth], [extra_info], **kwargs
    )[0]


async def compute_score_async(
    data_source: Any,
    solution_str: str,
    ground_truth: Any,
    extra_info: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> Score:
    """Async verl reward function for one response; verl's reward loop awaits it concurrently."""
    settings, _, groups = _prepare([solution_str], [extra_info], kwargs)
    result = await _async_client(settings).score_detailed(**groups[0].columns)
    return _assemble(1, groups, [result], settings.details)[0]
