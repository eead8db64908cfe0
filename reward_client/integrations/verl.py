"""verl adapter: the reward server as verl's ``custom_reward_function``.

verl (checked against 0.9.1) imports ``custom_reward_function.name`` from
``custom_reward_function.path`` (``pkg://reward_client.integrations.verl`` imports this
module) and calls it with keyword arguments only, merging
``custom_reward_function.reward_kwargs`` into them:

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
prompt the response alone is scored as a text.

Agent trajectories: a multi-turn rollout's ``solution_str`` is its turns and tool results
run together as one text. Where ``extra_info[trajectory_key]`` (default
``"reward_trajectory"``) holds the trajectory, a list of chat messages or ``{"messages",
"tools"}``, that conversation is scored instead, tool calls, tool results and tools
included (``solution_str`` and the prompt are then not used; its group's prompt is its
messages up to the last user or system message, as the server groups them).
verl 0.9.1 records none; :mod:`reward_client.integrations.verl_agent`'s agent loop does, and
the reward loop's ``naive``, ``limited`` and ``remote`` managers pass it on in
``extra_info``. ``ground_truth`` is sent as the item's label
(for the server's verifiers and judges; left out, with a warning, for a protocol without
labels); ``data_source`` is not used. Each function returns the score as a float, or with ``reward_details`` a dict
``{"score", "tokens", "truncated", "masked"}`` whose other keys verl logs as extra reward
info.

Groups: :func:`compute_score_batch` (the ``batch`` manager) sees a whole batch, verl's ``n``
responses of each prompt among it. Items whose ``extra_info`` holds the same group key and
whose prompts are equal go to the server as a group (for its pairwise judges and ``normalize:
group`` models). The key is ``extra_info["uid"]`` (verl's id of a prompt's rollouts, where a
manager or the data puts it there: verl 0.9.1's managers do not) or else ``extra_info["index"]``
(the dataset row, which verl's preprocessing scripts write and ``n`` rollouts share);
``group_key`` / ``REWARD_GROUP_KEY`` names another, ``reward_groups`` /
``REWARD_GROUPS`` = false turns grouping off. The per-sample functions score one response at
a time: no groups.

verl has no notion of a sample without a reward: every manager puts the score it is given
into the reward tensor (None fails there, NaN would poison its group's mean and standard
deviation), and verl itself scores 0.0 when its own ``compute_score_timeout`` fires. So an
item the server masked (its reward could not be computed) gets a fill value,
``masked_score`` / ``REWARD_MASKED_SCORE`` (default 0.0), with one warning per call naming
how many and why; with ``reward_details`` its ``"masked"`` is 1.0 (0.0 for a scored item),
which verl logs with the other extra reward info, so the masked share can be watched.

Settings come from keyword arguments (``reward_kwargs``) first, then the environment:
``reward_url`` / ``REWARD_URL`` (one URL, a comma-separated list or a list),
``reward_api_key`` / ``REWARD_API_KEY``, ``reward_timeout`` / ``REWARD_TIMEOUT`` (seconds,
default 60), ``prompt_key`` / ``REWARD_PROMPT_KEY`` (default ``"prompt"``),
``reward_details`` / ``REWARD_DETAILS``, ``masked_score`` / ``REWARD_MASKED_SCORE``,
``reward_deadline`` / ``REWARD_DEADLINE`` (seconds one call may take in all, retries
included), ``reward_groups`` / ``REWARD_GROUPS``, ``group_key`` / ``REWARD_GROUP_KEY``,
``trajectory_key`` / ``REWARD_TRAJECTORY_KEY`` and
``reward_client_options`` (a mapping of further keyword arguments for the
reward client, such as ``max_retries``). One client per setting
is kept for the whole process (per event loop for the async client), so calls reuse their
connections (:mod:`reward_client.integrations.settings`).

verl itself is never imported here: the module needs only the reward client.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from reward_client.groups import groups_by
from reward_client.inputs import ScoreInputs, plain_value
from reward_client.integrations.masks import filled, masked_score, report_masked
from reward_client.integrations.messages import messages
from reward_client.integrations.settings import (
    CLIENT_KWARGS,
    ClientCache,
    ClientSettings,
    WarnOnce,
    flag,
)
from reward_client.integrations.tools import tool_specs
from reward_client.integrations.verl_agent import TRAJECTORY_KEY
from reward_client.results import ScoreResult, merge

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
_OUR_KWARGS = CLIENT_KWARGS | {
    "prompt_key",
    "trajectory_key",
    "reward_details",
    "masked_score",
    "reward_groups",
    "group_key",
}
#: The ``extra_info`` keys whose values name a prompt's group, tried in order.
_GROUP_KEYS = ("uid", "index")
_URL_HINT = "REWARD_URL or custom_reward_function.reward_kwargs.reward_url"

Score = float | dict[str, Any]

_warn_once = WarnOnce(logger)
_clients = ClientCache()


@dataclass(frozen=True)
class _Settings:
    """Where and how to score (``client``), where the prompt is, what to return (and for a
    masked item)."""

    client: ClientSettings
    prompt_key: str
    #: The ``extra_info`` key of an agent's trajectory.
    trajectory_key: str
    details: bool
    fill: float
    #: The ``extra_info`` keys tried for an item's group (none: no groups).
    group_keys: tuple[str, ...]


def _settings(kwargs: Mapping[str, Any]) -> _Settings:
    """Settings from the call's keyword arguments, then the environment, then defaults."""
    for name in kwargs.keys() - _OUR_KWARGS - _VERL_KWARGS:
        _warn_once(f"kwarg:{name}", "%s ignores the keyword argument %r", __name__, name)
    env = os.environ
    return _Settings(
        client=ClientSettings.read(kwargs, _URL_HINT),
        prompt_key=str(kwargs.get("prompt_key") or env.get("REWARD_PROMPT_KEY") or "prompt"),
        trajectory_key=str(
            kwargs.get("trajectory_key") or env.get("REWARD_TRAJECTORY_KEY") or TRAJECTORY_KEY
        ),
        details=flag(kwargs.get("reward_details", env.get("REWARD_DETAILS", ""))),
        fill=masked_score(kwargs),
        group_keys=_group_keys(kwargs, env),
    )


def _group_keys(kwargs: Mapping[str, Any], env: Mapping[str, str]) -> tuple[str, ...]:
    """The ``extra_info`` keys tried for an item's group; none when grouping is off (or
    the protocol has no groups)."""
    on = flag(kwargs.get("reward_groups", env.get("REWARD_GROUPS", "1")))
    protocol = dict(kwargs.get("reward_client_options") or {}).get("protocol", "remote-reward")
    if not on or protocol != "remote-reward":
        return ()
    key = kwargs.get("group_key") or env.get("REWARD_GROUP_KEY")
    return (str(key),) if key else _GROUP_KEYS


def _group_key(extra_info: object, keys: Sequence[str]) -> Hashable | None:
    """The value of the first of ``keys`` in ``extra_info`` (None: in no group)."""
    if not isinstance(extra_info, Mapping):
        return None
    for key in keys:
        value = extra_info.get(key)
        if value is not None:
            return json.dumps(plain_value(value), sort_keys=True, default=repr)
    return None


def close_clients() -> None:
    """Close the cached blocking clients and forget every cached async client."""
    _clients.close()


async def aclose_clients() -> None:
    """Close the async clients cached for the running event loop."""
    await _clients.aclose()


def _trajectory(extra_info: object, key: str) -> dict[str, Any] | None:
    """The agent's trajectory in ``extra_info[key]`` as a ``{"messages", "tools"}``
    conversation (no ``tools`` when it has none), or None."""
    value = extra_info.get(key) if isinstance(extra_info, Mapping) else None
    if value is None:
        return None
    value = plain_value(value)
    if not isinstance(value, Mapping):
        value = {"messages": value}
    conversation = {"messages": messages(value.get("messages"), "user")}
    if value.get("tools"):
        conversation["tools"] = tool_specs(value["tools"])
    return conversation


def _task(trajectory: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The prompt of a trajectory: its messages up to the last user or system message before
    its last (an agent's own turns are not part of the prompt its group shares)."""
    before = list(trajectory["messages"][:-1])
    roles = [m.get("role") for m in before]
    last = max((i for i, role in enumerate(roles) if role in ("user", "system")), default=-1)
    return before[: last + 1]


def _prompt(extra_info: object, key: str) -> str | list[dict[str, Any]] | None:
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
    return messages(value, "user")


@dataclass
class _Group:
    """The items of one input form: their positions in the batch and the request columns."""

    positions: list[int]
    columns: dict[str, list[Any]]
    #: Each item's group key with its prompt (None: in no group).
    keys: list[Hashable | None] = field(default_factory=list)

    def inputs(self) -> ScoreInputs:
        """The columns as the client's keyword arguments, with the items' groups (those
        of equal keys) when some items share one."""
        inputs = dict(self.columns)
        groups = groups_by(self.keys)
        if groups:
            inputs["groups"] = groups
        return cast("ScoreInputs", inputs)


def _groups(
    solution_strs: Sequence[str],
    extra_infos: Sequence[object],
    ground_truths: Sequence[Any] | None,
    settings: _Settings,
) -> list[_Group]:
    """Split a batch into at most one request per input form, keeping each item's position
    (and its ground truth as its label, unless ``ground_truths`` is None) and its group
    key (``settings.group_keys``' value in its ``extra_info``, with its prompt)."""
    groups: dict[str, _Group] = {}
    key = settings.prompt_key
    for i, (response, extra_info) in enumerate(zip(solution_strs, extra_infos, strict=True)):
        trajectory = _trajectory(extra_info, settings.trajectory_key)
        prompt = _task(trajectory) if trajectory is not None else _prompt(extra_info, key)
        item: dict[str, Any]
        if trajectory is not None:
            item = {"conversations": trajectory}
        elif prompt is None:
            _warn_once(
                f"prompt:{key}", "extra_info has no %r: scoring the response alone as a text", key
            )
            item = {"texts": response}
        elif isinstance(prompt, str):
            item = {"queries": prompt, "responses": response}
        else:
            item = {"conversations": [*prompt, {"role": "assistant", "content": response}]}
        if ground_truths is not None:
            item["labels"] = ground_truths[i]
        group = groups.setdefault(",".join(item), _Group([], {name: [] for name in item}))
        group.positions.append(i)
        for name, value in item.items():
            group.columns[name].append(value)
        shared = _group_key(extra_info, settings.group_keys) if prompt is not None else None
        group.keys.append(None if shared is None else (shared, json.dumps(prompt)))
    return list(groups.values())


def _prepare(
    solution_strs: Iterable[str],
    ground_truths: Iterable[Any],
    extra_infos: Iterable[object] | None,
    kwargs: Mapping[str, Any],
) -> tuple[_Settings, int, list[_Group]]:
    """Settings, batch size and per-form requests of one call."""
    settings = _settings(kwargs)
    responses = [str(s) for s in solution_strs]
    extras = [None] * len(responses) if extra_infos is None else list(extra_infos)
    truths = list(ground_truths)
    for name, values in (("extra_infos", extras), ("ground_truths", truths)):
        if len(values) != len(responses):
            raise ValueError(f"{len(responses)} solution_strs but {len(values)} {name}")
    labels = settings.client.labels(truths, _warn_once)
    return settings, len(responses), _groups(responses, extras, labels, settings)


def _assemble(
    size: int, groups: Sequence[_Group], results: Sequence[ScoreResult], settings: _Settings
) -> list[Score]:
    """Per-item scores (or detail dicts) back in batch order; a masked item gets the fill
    value (one warning per call)."""
    out: list[Score] = [0.0] * size
    report_masked(logger, __name__, merge(results), f"they score {settings.fill:g} for verl")
    for group, result in zip(groups, results, strict=True):
        scores = filled(result.scores, settings.fill)
        for j, position in enumerate(group.positions):
            out[position] = (
                {
                    "score": scores[j],
                    "tokens": result.tokens[j],
                    "truncated": result.truncated[j],
                    "masked": float(result.scores[j] is None),
                }
                if settings.details
                else scores[j]
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
    settings, size, groups = _prepare(solution_strs, ground_truths, extra_infos, kwargs)
    client = _clients.blocking(settings.client)
    results = [client.score_detailed(**group.inputs()) for group in groups]
    return _assemble(size, groups, results, settings)


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
    settings, _, groups = _prepare([solution_str], [ground_truth], [extra_info], kwargs)
    result = await _clients.for_loop(settings.client).score_detailed(**groups[0].inputs())
    return _assemble(1, groups, [result], settings)[0]
