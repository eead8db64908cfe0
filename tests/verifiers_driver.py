"""Driver of tests/integration/test_verifiers_rubric.py, run in a subprocess whose PYTHONPATH
holds Prime Intellect's ``verifiers`` 0.4 (its own folder: it pins ``openai<3``;
:mod:`helpers.drivers`): a ``vf.Task`` whose rewards are this project's verifiers adapter
(:mod:`reward_client.integrations.verifiers`), scoring rollouts (``vf.Trace``) through a
real reward server by verifiers' own ``Task.score``.

``python tests/verifiers_driver.py CASE RESULT``: CASE holds the server's URL and the items
(prompt, reply, rubric); RESULT gets, per item and way of scoring, the trace's rewards,
metrics, reward and error.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import verifiers
import verifiers.v1 as vf

from reward_client.integrations.verifiers import MaskedReward, ServerReward, ServerRubric


class RubricData(vf.TaskData):
    rubric: list[dict[str, Any]] | None = None


def trace_of(data: RubricData, reply: str) -> vf.Trace:
    """A finished rollout whose answer is ``reply``."""
    return vf.Trace(
        task=vf.TraceTask(type="RubricTask", data=data),
        agent=vf.AgentInfo(config=vf.AgentConfig()),
        root_reply=reply,
    )


def seen(trace: vf.Trace, error: BaseException | None) -> dict[str, Any]:
    return {
        "rewards": {
            k: None if r is None else [r.score, r.weight] for k, r in trace.rewards.items()
        },
        "metrics": dict(trace.metrics),
        "reward": trace.reward,
        "error": None if error is None else f"{type(error).__name__}: {error}",
        "errors": [str(e) for e in trace.errors],
    }


async def main(case: dict[str, Any]) -> dict[str, Any]:
    url = case["url"]
    judged = ServerReward(url, model="rubric", name="rubric")
    parts = ServerRubric(url, weights={"rubric": 1.0, "plain": 0.5}, name="parts")
    strict = ServerReward(url, model="strict", name="strict")

    class RubricTask(vf.Task[RubricData, vf.State, vf.TaskConfig]):
        @vf.reward
        async def rubric(self, task: RubricData, trace: vf.Trace) -> float:
            return await judged(task, trace)

        @vf.reward(weight=2.0)
        async def parts(self, task: RubricData, trace: vf.Trace) -> dict[str, float]:
            return await parts(task, trace)

    class PlainTask(vf.Task[RubricData, vf.State, vf.TaskConfig]):
        """Rewards from its config only."""

    class StrictTask(vf.Task[RubricData, vf.State, vf.TaskConfig]):
        @vf.reward
        async def strict(self, task: RubricData, trace: vf.Trace) -> float:
            return await strict(task, trace)

    out: dict[str, Any] = {"version": verifiers.__version__, "items": []}
    datas = [RubricData(prompt=i["prompt"], rubric=i["rubric"]) for i in case["items"]]
    for data, item in zip(datas, case["items"], strict=True):
        row: dict[str, Any] = {}
        for name, cls, config in (
            ("task", RubricTask, None),
            ("strict", StrictTask, None),
            (
                "plugged",
                PlainTask,
                vf.TaskConfig(
                    rewards={
                        "plugged": {"fn": "reward_client.integrations.verifiers:rubric_reward"}
                    }
                ),
            ),
        ):
            trace = trace_of(data, item["reply"])
            error = None
            try:
                await cls(data, config).score(trace)
            except Exception as exc:  # a rollout whose scoring failed: verifiers' TaskError
                error = exc
            row[name] = seen(trace, error)
        out["items"].append(row)
    # One prompt's rollouts as a group.
    traces = [trace_of(datas[0], item["reply"]) for item in case["items"]]
    values = await judged.score_group([datas[0]] * len(traces), traces)
    out["group"] = {"values": values, "traces": [seen(t, None) for t in traces]}
    masked = await strict.score_group([datas[0]] * 2, traces[:2])
    out["group_masked"] = {"values": masked, "traces": [seen(t, None) for t in traces[:2]]}
    out["masked_reward_is"] = MaskedReward.__mro__[1].__name__
    out["env_model"] = os.environ.get("REWARD_MODEL")
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        case = json.load(f)
    result = asyncio.run(main(case))
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)
