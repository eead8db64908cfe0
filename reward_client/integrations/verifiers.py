"""Prime Intellect's ``verifiers`` (0.4, ``verifiers.v1``): its rollouts scored by the reward
server, a rubric judge's included.

In verifiers 0.4 a task scores a rollout (a ``vf.Trace``) with its ``@vf.reward`` methods and
the functions plugged into its config (``rewards.<name>.fn``), each called with the names it
asks for (``task``: the row, a ``vf.TaskData``; ``trace``) and returning a float or named
floats; the trace keeps each as a weighted ``vf.Reward``. An exception inside scoring errors
the rollout (``vf.TaskError``), which the trainer leaves out, as verifiers' own
``RubricJudge`` does with a malformed verdict.

- :class:`ServerReward`: one reward function: the task's prompt (``prompt_text``), the
  trace's reply (``last_reply``) and the task's ``label_field`` (a rubric judge's rubric, a
  reference answer) as one ``/score`` item; its value is the server's combined reward, or one
  model's (``model=``). A rubric judge's verdicts are recorded as the trace's metrics
  ``<name>/<model>/<j>`` (criterion ``j``'s probability of yes), like ``RubricJudge``'s
  ``<judge>/<criterion>``.
- :class:`ServerRubric`: a rubric made of the server's models: one ``/score`` call for all of
  them (``components``), returning ``{"<name>/<model>": weight * score}``, which the trace
  records as one reward each (their sum is the rollout's reward); criteria metrics as above.
- :func:`rubric_reward`: a :class:`ServerReward` configured by the environment
  (``REWARD_URL``, ``REWARD_MODEL``, ``REWARD_LABEL_FIELD``, ``REWARD_DEADLINE`` ...), for a
  task config's ``rewards.<name>.fn = "reward_client.integrations.verifiers:rubric_reward"``.

Masks: an item the server masked (its reward could not be computed: a judge's verdict that
did not parse, a verifier's timeout, the deadline) raises :class:`MaskedReward` naming the
reason: verifiers errors that rollout (there is no reward to give it, and 0 would be a
false one). Deadlines: ``deadline=`` (or ``REWARD_DEADLINE``) bounds each call, retries
included; past it the server masks what it could not finish. Groups: ``score_group(tasks,
traces)`` scores one prompt's rollouts in one request as a group, so that the server's
pairwise judges and ``normalize: group`` models see them together (an ``Env``'s
``finalize`` sees a group's traces), recording each trace's reward as a call would.

verifiers itself is never imported: the functions read the row and the trace by their
attributes (``prompt_text``, ``last_reply``, ``record_metric``), so this module needs only the
reward client.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from reward_client.errors import RewardClientError
from reward_client.integrations.settings import ClientCache, ClientSettings
from reward_client.results import ScoreResult

__all__ = ["MaskedReward", "ServerReward", "ServerRubric", "rubric_reward"]

logger = logging.getLogger(__name__)

_CLIENTS = ClientCache()


class MaskedReward(RewardClientError):
    """The server masked a rollout: its reward could not be computed (``reason``)."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"reward {name!r}: the reward server masked the rollout ({reason})")
        self.reason = reason


def _prompt(task: Any) -> str:
    """The row's prompt as text (``TaskData.prompt_text``; a plain string prompt as is)."""
    text = getattr(task, "prompt_text", None)
    if isinstance(text, str):
        return text
    prompt = getattr(task, "prompt", None)
    return prompt if isinstance(prompt, str) else ""


def _reply(trace: Any) -> str:
    """The rollout's answer (``Trace.last_reply``)."""
    reply = getattr(trace, "last_reply", None)
    return reply if isinstance(reply, str) else ""


class ServerReward:
    """A verifiers reward function ``(task, trace) -> float`` backed by the reward server.

    >>> reward = ServerReward("http://rm:8000", model="rubric", label_field="rubric")
    >>> class MyTask(vf.Task[MyData, vf.State, vf.TaskConfig]):
    ...     @vf.reward
    ...     async def rubric(self, task, trace) -> float:
    ...         return await reward(task, trace)

    ``url``: the server (else ``REWARD_URL``); ``model``: one model of a composite server
    (None: the combined reward); ``label_field``: the row's field sent as the item's label
    (None: no label); ``name``: the prefix of the metrics it records; ``deadline``: seconds
    per call, retries included; ``api_key``, ``timeout`` and ``client_options`` as the
    other adapters take them (``reward_client_options``).
    """

    def __init__(
        self,
        url: str | Sequence[str] | None = None,
        *,
        model: str | None = None,
        label_field: str | None = "rubric",
        name: str = "server",
        deadline: float | None = None,
        api_key: str | None = None,
        timeout: float | None = None,
        client_options: Mapping[str, Any] | None = None,
    ) -> None:
        kwargs = {
            "reward_url": url,
            "reward_api_key": api_key,
            "reward_timeout": timeout,
            "reward_deadline": deadline,
            "reward_client_options": dict(client_options or {}),
        }
        self.settings = ClientSettings.read(kwargs, "url= or REWARD_URL")
        self.model = model
        self.label_field = label_field
        self.name = name
        self.__name__ = name  # verifiers names a plugged or decorated reward by it

    def _label(self, task: Any) -> Any:
        if self.label_field is None:
            return None
        if isinstance(task, Mapping):
            return task.get(self.label_field)
        return getattr(task, self.label_field, None)

    async def _score(self, tasks: Sequence[Any], traces: Sequence[Any], group: bool) -> ScoreResult:
        if len(tasks) != len(traces):
            raise ValueError(f"{len(tasks)} tasks for {len(traces)} traces")
        client = _CLIENTS.for_loop(self.settings)
        labels = [self._label(task) for task in tasks]
        options: dict[str, Any] = {"components": True}
        if self.model is not None:
            options["model"] = self.model
        if self.label_field is not None:
            options["labels"] = labels
        if group and len(tasks) > 1:
            options["groups"] = [list(range(len(tasks)))]
        return await client.score_detailed(
            queries=[_prompt(task) for task in tasks],
            responses=[_reply(trace) for trace in traces],
            **options,
        )

    def _record(self, result: ScoreResult, traces: Sequence[Any]) -> None:
        """Each rubric judge's criteria on each trace as metrics (probability of yes)."""
        for model, rows in (result.criteria or {}).items():
            for trace, row in zip(traces, rows, strict=True):
                for j, criterion in enumerate(row or ()):
                    trace.record_metric(f"{self.name}/{model}/{j}", criterion["probability"])

    def _value(self, result: ScoreResult, i: int) -> float:
        score = result.scores[i]
        if self.model is not None and result.components and self.model in result.components:
            score = result.components[self.model][i]
        if score is None:
            reason = (result.masked or [None] * len(result))[i] or "unknown"
            raise MaskedReward(self.name, reason)
        return float(score)

    async def __call__(self, task: Any, trace: Any) -> float:
        """The rollout's reward (raises :class:`MaskedReward` for a masked one)."""
        result = await self._score([task], [trace], group=False)
        self._record(result, [trace])
        return self._value(result, 0)

    async def score_group(
        self, tasks: Sequence[Any], traces: Sequence[Any], weight: float = 1.0
    ) -> list[float | None]:
        """One prompt's rollouts scored as one group; each trace's reward recorded under
        ``name`` with ``weight`` (a masked one: its error recorded, no reward); the values
        in order (None for a masked one)."""
        result = await self._score(tasks, traces, group=True)
        self._record(result, traces)
        values: list[float | None] = []
        for i, trace in enumerate(traces):
            try:
                value: float | None = self._value(result, i)
            except MaskedReward as exc:
                logger.warning("%s", exc)
                trace.record_error(exc)
                value = None
            else:
                trace.record_reward(self.name, value, weight)
            values.append(value)
        return values


class ServerRubric(ServerReward):
    """A rubric made of the reward server's models: one ``/score`` call scores the rollout
    with every model in ``weights`` and returns ``{"<name>/<model>": weight * score}`` (the
    trace keeps each as a reward; their sum is the rollout's). Raises :class:`MaskedReward` when any of
    them masked it.

    >>> rubric = ServerRubric("http://rm:8000", weights={"rubric": 1.0, "exact": 0.5})
    >>> class MyTask(vf.Task[MyData, vf.State, vf.TaskConfig]):
    ...     @vf.reward
    ...     async def server(self, task, trace) -> dict[str, float]:
    ...         return await rubric(task, trace)
    """

    def __init__(
        self, url: str | Sequence[str] | None = None, *, weights: Mapping[str, float], **kwargs: Any
    ) -> None:
        if not weights:
            raise ValueError("ServerRubric needs the weights of one model at least")
        super().__init__(url, **kwargs)
        self.weights = dict(weights)

    def _parts(self, result: ScoreResult, i: int) -> dict[str, float]:
        components = result.components or {}
        missing = [m for m in self.weights if m not in components]
        if missing:
            raise RewardClientError(
                f"rubric {self.name!r}: the server scored no model named {', '.join(missing)} "
                f"(it has {', '.join(components) or 'none'})"
            )
        out = {}
        for model, weight in self.weights.items():
            score = components[model][i]
            if score is None:
                reason = (result.masked or [None] * len(result))[i] or "unknown"
                raise MaskedReward(f"{self.name}/{model}", reason)
            out[f"{self.name}/{model}"] = weight * float(score)
        return out

    async def __call__(self, task: Any, trace: Any) -> dict[str, float]:  # type: ignore[override]
        """Each model's weighted score of the rollout."""
        result = await self._score([task], [trace], group=False)
        self._record(result, [trace])
        return self._parts(result, 0)


def rubric_reward_settings(env: Mapping[str, str] | None = None) -> ServerReward:
    """A :class:`ServerReward` from the environment: ``REWARD_URL`` (and the other
    adapters' ``REWARD_API_KEY``, ``REWARD_TIMEOUT``, ``REWARD_DEADLINE``), ``REWARD_MODEL``
    (one model of the server; default: the combined reward), ``REWARD_LABEL_FIELD`` (default
    ``rubric``; empty: no label)."""
    env = os.environ if env is None else env
    field = env.get("REWARD_LABEL_FIELD", "rubric")
    return ServerReward(
        model=env.get("REWARD_MODEL") or None, label_field=field or None, name="rubric_reward"
    )


async def rubric_reward(task: Any, trace: Any) -> float:
    """A task's reward through the server configured by the environment
    (:func:`rubric_reward_settings`), for ``rewards.<name>.fn`` in a verifiers task config."""
    return await rubric_reward_settings()(task, trace)
