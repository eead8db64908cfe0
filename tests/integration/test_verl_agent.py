"""verl's agent loop with tools, rewarded through ``reward_client.integrations.verl``: the
reward function receives each multi-turn trajectory (a tool call, its result, an answer)
and returns the server's score of it (issue 48, acceptance 5).

verl 0.9.1 gives a reward function only the response decoded as one text; the trajectory
reaches it through ``reward_client.integrations.verl_agent.TrajectoryToolAgentLoop``, which
records the messages in the loop's ``extra_fields``, merged into ``extra_info`` by the reward
loop's managers. ``verl_agent_driver.py`` runs verl's own ``AgentLoopWorker`` (its tool from
a function-tool file, the agent loop from an agent-loop config file, as a user sets them) and
its ``RewardLoopWorker`` with the ``naive`` manager, in a subprocess with verl on its path (as
``test_verl.py`` does); only the LLM server is scripted. verl's agent loop imports hydra, which
``make setup`` installs into verl's folder with it.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_models import (
    VERL_TOOL_SOURCE,
    WEATHER,
    answer_text,
    call_text,
    save_policy,
)
from helpers.drivers import VERL_DIR, require_verl, run_driver
from server_proc import ServerProcess, require_counterpart

DRIVER = Path(__file__).resolve().parents[1] / "verl_agent_driver.py"
PROMPTS = [
    [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Is it cold in London"},
    ],
    [{"role": "user", "content": "What is the weather in Paris"}],
    [{"role": "user", "content": "Tell me a joke"}],
    [{"role": "user", "content": "Check it again and again"}],
]
#: The policy's turns per sample (picked by the first of these words in its prompt): a call
#: and an answer; an answer alone; calls until verl's turn limit (4) ends the rollout.
SCRIPTS = {
    "again": [call_text("Paris")] * 4,
    "London": [call_text("London"), answer_text("London")],
    "Paris": [call_text("Paris"), answer_text("Paris")],
    "joke": ["No joke today."],
}


def call(city: str) -> list[dict[str, Any]]:
    """A turn calling get_weather for ``city`` and the tool's result, as verl records them."""
    function = {"name": "get_weather", "arguments": {"city": city}}
    return [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": function}],
        },
        {"role": "tool", "content": WEATHER[city]},
    ]


#: The policy's turns in each trajectory. The last call of the fourth ended the rollout (the
#: turn limit) before verl parsed it: it is there as the text the policy wrote.
TURNS = [
    [*call("London"), {"role": "assistant", "content": answer_text("London")}],
    [*call("Paris"), {"role": "assistant", "content": answer_text("Paris")}],
    [{"role": "assistant", "content": "No joke today."}],
    [*call("Paris") * 3, {"role": "assistant", "content": call_text("Paris")}],
]
FUNCTIONS = ("compute_score_async", "compute_score")


@pytest.fixture(scope="module")
def server(tool_server: ServerProcess) -> ServerProcess:
    """A real server with a tiny Llama reward model whose template renders tool use
    (shared)."""
    return tool_server


@pytest.fixture(scope="module")
def result(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What verl's agent loop worker returned for PROMPTS, per reward function."""
    path = require_verl()
    hydra = (VERL_DIR / "hydra").is_dir() or importlib.util.find_spec("hydra") is not None
    require_counterpart(hydra, "REWARD_SERVER_TEST_VERL", f"hydra-core in {VERL_DIR}")
    folder = tmp_path_factory.mktemp("verl_agent")
    case = {
        "url": server.url,
        "policy": str(save_policy(folder / "policy")),
        "tool_source": VERL_TOOL_SOURCE,
        "prompts": PROMPTS,
        "scripts": SCRIPTS,
    }
    out = run_driver(DRIVER, case, folder, path)
    assert out["verl"] == "0.9.1"
    return out


def check_trajectory(
    trajectory: dict[str, Any], prompt: list[dict[str, Any]], turns: list[dict[str, Any]]
) -> None:
    """The prompt's messages, then the policy's ``turns``; get_weather's spec as the tools."""
    (tool,) = trajectory["tools"]
    assert tool["function"]["name"] == "get_weather"
    assert tool["function"]["parameters"]["required"] == ["city"]
    assert trajectory["messages"] == [*prompt, *turns]


@pytest.mark.parametrize("function", FUNCTIONS)
def test_the_reward_function_scores_each_trajectory_as_the_server_does(
    result: dict[str, Any], server: ServerProcess, function: str
) -> None:
    got = result[function]
    trajectories = got["trajectories"]
    for trajectory, prompt, turns in zip(trajectories, PROMPTS, TURNS, strict=True):
        check_trajectory(trajectory, prompt, turns)
    # verl counts the policy's turns and the tool results, plus one.
    assert got["num_turns"] == [4, 4, 2, 8]
    # The server's own answer for those conversations, tools included.
    response = httpx.post(f"{server.url}/score", json={"conversations": trajectories}, timeout=60)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert got["rewards"] == pytest.approx(answer["scores"], abs=1e-5)
    assert got["details"]["score"] == pytest.approx(answer["scores"], abs=1e-5)
    assert got["details"]["tokens"] == answer["tokens"]
    assert got["details"]["truncated"] == [False] * len(PROMPTS)


def test_the_trajectory_is_what_is_scored(result: dict[str, Any], server: ServerProcess) -> None:
    """A call's argument changes the reward: the tool calls reach the reward model."""
    trajectory = result["compute_score"]["trajectories"][0]
    other = json.loads(json.dumps(trajectory))
    other["messages"][2]["tool_calls"][0]["function"]["arguments"]["city"] = "Paris"
    response = httpx.post(f"{server.url}/score", json={"conversations": [other]}, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["scores"][0] != pytest.approx(result["compute_score"]["rewards"][0])
