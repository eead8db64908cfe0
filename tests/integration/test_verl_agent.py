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
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_models import (
    REWARD_TEMPLATE,
    VERL_TOOL_SOURCE,
    WEATHER,
    answer_text,
    call_text,
    save_policy,
)
from server_proc import ServerProcess, require_counterpart, running_server
from test_verl import VERL_DIR, verl_pythonpath

import tiny_models

DRIVER = Path(__file__).resolve().parents[1] / "verl_agent_driver.py"
PROMPTS = [
    [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Is it cold in London"},
    ],
    [{"role": "user", "content": "What is the weather in Paris"}],
    [{"role": "user", "content": "Tell me a joke"}],
]
#: The policy's turns per sample (picked by a word of its prompt): a call, then an answer.
SCRIPTS = {
    "London": [call_text("London"), answer_text("London")],
    "Paris": [call_text("Paris"), answer_text("Paris")],
    "joke": ["No joke today."],
}
FUNCTIONS = ("compute_score_async", "compute_score")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A real server with a tiny Llama reward model whose template renders tool use."""
    path = tmp_path_factory.mktemp("tool_rm")
    tiny_models.save_llama_reward_model(path, chat_template=REWARD_TEMPLATE)
    with running_server(path) as srv:
        yield srv


@pytest.fixture(scope="module")
def result(server: ServerProcess, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What verl's agent loop worker returned for PROMPTS, per reward function."""
    path = verl_pythonpath()
    require_counterpart(
        path is not None,
        "REWARD_SERVER_TEST_VERL",
        f"verl 0.9.1 (make setup puts it in {VERL_DIR})",
    )
    assert path is not None
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
    (folder / "case.json").write_text(json.dumps(case))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (path, os.environ.get("PYTHONPATH", "")) if p),
    }
    done = subprocess.run(
        [sys.executable, str(DRIVER), str(folder / "case.json"), str(folder / "result.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    out = json.loads((folder / "result.json").read_text())
    assert out["verl"] == "0.9.1"
    return out


def check_trajectory(trajectory: dict[str, Any], prompt: list[dict[str, Any]]) -> None:
    """The prompt's messages, then the policy's call of get_weather for the prompt's city, the
    tool's result and the answer (or, without a city, its one answer); the tool's spec."""
    (tool,) = trajectory["tools"]
    assert tool["function"]["name"] == "get_weather"
    assert tool["function"]["parameters"]["required"] == ["city"]
    messages = trajectory["messages"]
    assert messages[: len(prompt)] == prompt
    turns = messages[len(prompt) :]
    city = next((c for c in WEATHER if c in prompt[-1]["content"]), None)
    if city is None:
        assert turns == [{"role": "assistant", "content": "No joke today."}]
        return
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
    assert turns == [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": WEATHER[city]},
        {"role": "assistant", "content": answer_text(city)},
    ]


@pytest.mark.parametrize("function", FUNCTIONS)
def test_the_reward_function_scores_each_trajectory_as_the_server_does(
    result: dict[str, Any], server: ServerProcess, function: str
) -> None:
    got = result[function]
    trajectories = got["trajectories"]
    for trajectory, prompt in zip(trajectories, PROMPTS, strict=True):
        check_trajectory(trajectory, prompt)
    assert got["num_turns"] == [4, 4, 2]  # user, call, result, answer (+1, verl counts so)
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
