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
chat template and the policy's template never reaches it. ``label_key`` names the dataset
column (one of those keyword arguments) sent as the items' labels, for the server's
verifiers and judges.

Tools: with ``GRPOTrainer(tools=[...])`` (TRL 1.16) a completion is the agent's trajectory,
a list of messages: assistant turns with ``tool_calls`` (arguments as objects), ``tool``
results and the final answer, sent whole after the prompt's messages, every key kept
(:mod:`~reward_client.integrations.messages`). TRL passes reward functions no tools: give
``RemoteReward`` the trainer's list (``tools=``), sent as specs with every request
(:func:`~reward_client.integrations.tools.tool_specs`; protocol ``remote-reward``).

A completion the server masked (its reward could not be computed: a verifier that timed
out or crashed, a judge answer that did not parse, the call's deadline...) gets None, which
TRL (1.16) takes from a reward function: it turns None into NaN, and a completion for which
every reward function gave None is left out of its group's baseline (the NaN-aware mean and
standard deviation), gets an advantage of 0 and is left out of the logged ``reward``; with
other reward functions beside this one, it is scored by those alone (TRL's ``nansum`` of
the weighted rewards). RLOOTrainer does the same. Each call with masked items logs one
warning (how many, why), and ``rewards/<name>/masked_frac`` when TRL passes ``log_metric``.

Groups: GRPOTrainer and RLOOTrainer (1.16) hand a reward function a process's whole slice of
the generation batch, ``num_generations`` consecutive completions per prompt (its
``RepeatSampler`` repeats each prompt; the slices are taken process by process, so a prompt's
completions are split between two processes when a process's slice is not a multiple of
``num_generations``). ``RemoteReward`` sends each run of consecutive completions of one
prompt as a group (``groups``, on by default with protocol ``remote-reward``), so that the
server's pairwise judges and ``normalize: group`` models see the completions of a prompt
together. A group split between processes is scored as two groups, one per process; keep
``per_device_train_batch_size * steps_per_generation`` a multiple of ``num_generations``
to keep groups whole. The same prompt drawn twice in a row makes one larger group (its
completions all answer that prompt). Completions of several messages (an agent's tool calls,
their results and its answer) group the same way: the server takes a conversation's messages
up to its last user or system message as the prompt a group shares, so an agent's own turns
may differ within a group.

TRL itself is never imported here: the module needs only the reward client (and
transformers, imported when ``tools=`` holds a callable).
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx

from reward_client.client import AsyncRewardClient, RewardClient
from reward_client.errors import RewardClientError
from reward_client.groups import cut, runs
from reward_client.inputs import Tool
from reward_client.integrations.masks import report_masked
from reward_client.integrations.messages import prompt_completion_inputs
from reward_client.integrations.tools import tool_specs
from reward_client.results import ScoreResult

__all__ = ["RemoteReward", "RewardComponent"]

logger = logging.getLogger(__name__)


class RemoteReward:
    """Async TRL reward function backed by a running reward server.

    >>> trainer = GRPOTrainer(model=..., reward_funcs=[RemoteReward("http://rm:8000")], ...)

    ``name`` becomes ``__name__``, which TRL uses in its logs (``rewards/<name>/mean``).
    When TRL passes ``log_metric``, the fraction of texts the server truncated is logged as
    ``rewards/<name>/truncated_frac`` and the fraction it masked (None rewards, which TRL
    leaves out) as ``rewards/<name>/masked_frac``. ``retry_timeout`` is how long, in seconds, a request
    is retried while the server is unreachable or busy (default 600, enough for a restart).
    ``protocol``: what the server speaks (``remote-reward``, ``vllm``, ``tei``, ``openrlhf``
    or ``auto``; see :mod:`reward_client.wire`). ``model``: score with this one model of a
    composite server. :meth:`components` gives one reward function per model instead.
    ``label_key``: the dataset column (TRL passes each as a keyword argument) sent as each
    completion's label, e.g. ``"answer"`` for a verifier that checks the final answer.
    ``groups``: send each run of consecutive completions of one prompt as a group (module
    docstring); None (the default) turns it on for protocol ``remote-reward``, the only
    one with groups, False turns it off.
    ``tools``: the tools given to ``GRPOTrainer(tools=...)`` (callables, or OpenAI function
    specs), sent with every request so that the reward model's template sees the tools
    the policy was offered (protocol ``remote-reward``; module docstring).
    Other keyword arguments (``timeout``, ``retry``, ``max_client_batch``,
    ``max_concurrency``, ``on_retry``, ``deadline``: seconds a reward call may take in all,
    ...; see :class:`~reward_client.ClientOptions`) go to
    :class:`~reward_client.AsyncRewardClient`.
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
        model: str | None = None,
        label_key: str | None = None,
        groups: bool | None = None,
        tools: Sequence[Callable[..., Any] | Tool] | None = None,
        **client_kwargs: Any,
    ) -> None:
        for given, what in ((groups, "groups=True"), (tools, "tools=")):
            if given and protocol not in ("remote-reward", "auto"):
                raise ValueError(f"{what} needs protocol remote-reward, not {protocol!r}")
        #: The tools' OpenAI function specs, sent with every request (None: no tools).
        self.tools = tool_specs(tools) if tools else None
        #: Whether completions of one prompt go to the server as a group.
        self.groups = protocol == "remote-reward" if groups is None else groups
        self._client_args: dict[str, Any] = {
            "base_urls": url_or_urls,
            "api_key": api_key,
            "retry_timeout": retry_timeout,
            "protocol": protocol,
            **client_kwargs,
        }
        self.__name__ = name
        self.__qualname__ = name
        self.truncate = truncate
        self.model = model
        self.label_key = label_key
        self._component_names: list[str] | None = None  # from /info, on first use
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
        self,
        prompts: Sequence[object],
        completions: Sequence[object],
        *,
        components: bool | None = None,
        labels: Sequence[Any] | None = None,
    ) -> ScoreResult:
        """Scores with token counts, truncation flags and (``components=True``) the
        per-model breakdown for TRL-style prompts and completions (and their labels)."""
        inputs = prompt_completion_inputs(prompts, completions)
        if not inputs:
            return ScoreResult([], [], [])
        return await self.client.score_detailed(
            **inputs,
            truncate=self.truncate,
            model=self.model,
            components=components,
            labels=labels,
            groups=(await self._groups(prompts, completions)) if self.groups else None,
            tools=self.tools,
        )

    async def _groups(
        self, prompts: Sequence[object], completions: Sequence[object]
    ) -> list[list[int]] | None:
        """The runs of one prompt, each cut to fit a request (a warning when one is cut:
        the same prompt many times in a row, or ``num_generations`` over the server's
        ``max_client_batch``); None when there are none."""
        groups = runs(list(prompts))
        if not groups:
            return None
        size = await self.client.request_items()
        if max(map(len, groups)) > size:
            logger.warning(
                "%s: %d completions of one prompt in a row, more than a request holds (%d, "
                "max_client_batch): scored as groups of at most %d",
                self.__name__,
                max(map(len, groups)),
                size,
                size,
            )
            groups = cut(groups, size)
        return groups

    def labels(self, kwargs: Mapping[str, Any]) -> list[Any] | None:
        """The ``label_key`` column among TRL's keyword arguments (None without a key);
        ValueError naming the columns TRL passed when it is not there."""
        if self.label_key is None:
            return None
        if self.label_key not in kwargs:
            columns = sorted(k for k in kwargs if k not in _TRL_ARGUMENTS)
            raise ValueError(
                f"{self.__name__}: label_key {self.label_key!r} is not a column TRL passed "
                f"(the dataset's columns here: {', '.join(columns) or 'none'})"
            )
        return list(kwargs[self.label_key])

    def component_names(self) -> list[str]:
        """The names of the server's models, from its ``/info`` (asked once, blocking)."""
        if self._component_names is None:
            # A blocking request of its own: TRL reads the names before its loop runs.
            with RewardClient(**self._client_args) as client:
                info = client.info()
            models = info.get("models")
            if not isinstance(models, list) or not models:
                raise RewardClientError(
                    f"{self._client_args['base_urls']!r}: /info lists no models (a server "
                    "from before composite rewards); pass names= to components()"
                )
            self._component_names = [str(m["name"]) for m in models]
        return list(self._component_names)

    def components(self, names: Sequence[str] | None = None) -> list[RewardComponent]:
        """One TRL reward function per model of the server, each named after its model.

        TRL logs each under its ``__name__`` (``rewards/<model>/mean``) and applies its own
        ``reward_weights`` to them. They share one ``components: true`` request per batch:
        the first one TRL calls sends it, the others take their column of the answer.
        ``names`` (default: every model in the server's ``/info``) picks the components.
        """
        chosen = list(names) if names is not None else self.component_names()
        if not chosen:
            raise ValueError("components() needs at least one component name")
        shared = _SharedRequest(self, len(chosen))
        return [RewardComponent(shared, name) for name in chosen]

    async def __call__(
        self, prompts: Sequence[object], completions: Sequence[object], **kwargs: Any
    ) -> list[float | None]:
        """One float per completion, in order (TRL's ``reward_funcs`` signature); None for
        a completion the server masked."""
        result = await self.score_detailed(prompts, completions, labels=self.labels(kwargs))
        _log_result(self.__name__, result, kwargs)
        return result.scores


#: Keyword arguments TRL passes that are not dataset columns.
_TRL_ARGUMENTS = frozenset({"completion_ids", "trainer_state", "log_extra", "log_metric"})

#: What TRL does with a None reward (the end of the warning for masked items).
_TRL_OUTCOME = "None for TRL, which leaves them out of their group's baseline"


def _log_result(
    name: str,
    result: ScoreResult,
    kwargs: Mapping[str, Any],
    scores: Sequence[float | None] | None = None,
) -> None:
    """``rewards/<name>/truncated_frac`` and ``rewards/<name>/masked_frac`` (of ``scores``,
    by default the result's) through TRL's ``log_metric`` when TRL passes it; a warning when
    some are masked."""
    scores = result.scores if scores is None else scores
    masked = sum(score is None for score in scores)
    log_metric: Callable[[str, float], None] | None = kwargs.get("log_metric")
    if callable(log_metric) and len(result):
        log_metric(f"rewards/{name}/truncated_frac", result.truncated_frac)
        log_metric(f"rewards/{name}/masked_frac", masked / len(scores))
    if masked and scores is result.scores:
        report_masked(logger, name, result, _TRL_OUTCOME)
    elif masked:
        logger.warning(
            "%s: the reward server masked this component for %d of %d item(s): %s",
            name,
            masked,
            len(scores),
            _TRL_OUTCOME,
        )


class _SharedRequest:
    """One ``components: true`` request per batch, shared by the component functions.

    The first component called for a batch starts the request; the others await the same
    task (TRL runs async reward functions concurrently on one loop) or, called later, find
    its result. An entry is dropped once every component took it; at most ``_KEEP``
    batches are kept for components that are never called.
    """

    _KEEP = 8

    def __init__(self, reward: RemoteReward, consumers: int) -> None:
        self.reward = reward
        self.consumers = consumers
        self._entries: dict[tuple[int, str], list[Any]] = {}

    async def result(
        self, prompts: Sequence[object], completions: Sequence[object], kwargs: Mapping[str, Any]
    ) -> ScoreResult:
        """The breakdown of this batch (``kwargs``: TRL's, holding the labels), requested
        once."""
        inputs = prompt_completion_inputs(prompts, completions)
        labels = self.reward.labels(kwargs)
        # The batch's inputs are its key, per event loop (a task belongs to its loop).
        batch = json.dumps([inputs, labels], sort_keys=True, default=repr)
        key = (id(asyncio.get_running_loop()), batch)
        entry = self._entries.get(key)
        if entry is None:
            coro = self.reward.score_detailed(prompts, completions, components=True, labels=labels)
            entry = self._entries[key] = [asyncio.ensure_future(coro), self.consumers]
            while len(self._entries) > self._KEEP:
                del self._entries[next(iter(self._entries))]
        entry[1] -= 1
        if entry[1] <= 0:
            self._entries.pop(key, None)
        # shield: one caller cancelled must not cancel the request the others wait for.
        return await asyncio.shield(entry[0])


class RewardComponent:
    """A TRL reward function giving one component (model) of a composite reward server's
    answer; made by :meth:`RemoteReward.components`."""

    def __init__(self, shared: _SharedRequest, name: str) -> None:
        self.__name__ = name
        self.__qualname__ = name
        self._shared = shared

    def __repr__(self) -> str:
        return f"{self._shared.reward!r}.components()[{self.__name__!r}]"

    async def __call__(
        self, prompts: Sequence[object], completions: Sequence[object], **kwargs: Any
    ) -> list[float | None]:
        """This component's score of each completion, in order (None where the server
        masked this component of the item)."""
        result = await self._shared.result(prompts, completions, kwargs)
        if not len(result):
            return []
        if result.components is None or self.__name__ not in result.components:
            known = sorted(result.components or {})
            raise RewardClientError(
                f"the reward server's answer has no component {self.__name__!r} "
                f"(components: {', '.join(known) or 'none'})"
            )
        scores = result.components[self.__name__]
        _log_result(self.__name__, result, kwargs, scores)
        return scores
