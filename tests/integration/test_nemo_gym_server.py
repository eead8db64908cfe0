"""NeMo Gym's /verify against real server processes: the requests of tests/data/nemo_gym
(NeMo Gym's shapes) get answers in its shape with the right reward, and an item whose reward
could not be computed gets mask_sample.

One server holds the built-in ``math`` verifier alone: the math rows' rewards are what
math-verify decides, and a row whose label is not a reference answer (a tool-call row's
label object) is masked. A second server sums two python verifiers that read the
conversation a rollout became: ``call`` (the row's ``expected_call``, its label, among the
trajectory's tool calls, answered by a tool result) and ``answered`` (the final turn has text); its
``components`` hold both, and a row without ``expected_call`` is masked.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.models_files import python_verifier
from helpers.servers import serve
from server_proc import ServerProcess, metric

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "nemo_gym"

FUNCTIONS = '''
import json


def expected_call(prompt, response, label):
    """1.0 when the expected call (the row's expected_call, the label) was made and a tool
    result answered it."""
    want = {"name": label["name"], "arguments": label["arguments"]}  # else an error: masked
    answered = {m.get("tool_call_id") for m in prompt if m.get("role") == "tool"}
    for message in prompt:
        for call in message.get("tool_calls") or []:
            function = call["function"]
            arguments = function["arguments"]
            if isinstance(arguments, str):
                arguments = json.loads(arguments)
            if (function["name"], arguments) == (want["name"], want["arguments"]):
                return 1.0 if call["id"] in answered else 0.0
    return 0.0


def answered(prompt, response, label):
    """1.0 when the final turn says something."""
    return 1.0 if response.strip() else 0.0
'''


def cases(name: str) -> dict[str, dict[str, Any]]:
    data = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    return {case["name"]: case for case in data["cases"]}


@pytest.fixture(scope="module")
def math_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("nemo_gym_math")
    with serve(
        models=[{"name": "correct", "kind": "verifier", "verifier": "math"}], folder=folder
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def agent_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("nemo_gym_agent")
    functions = folder / "nemo_gym_functions.py"
    functions.write_text(FUNCTIONS, encoding="utf-8")

    call = python_verifier("call", f"{functions}:expected_call")
    answered = python_verifier("answered", f"{functions}:answered")
    with serve(models=[call, answered], folder=folder) as srv:
        yield srv


def verify(server: ServerProcess, request: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{server.url}/verify", json=request, timeout=60)
    assert r.status_code == 200, r.text
    answer = r.json()
    # NeMo Gym's shape: the request as sent, and the verify response's own fields.
    assert {key: answer[key] for key in request} == request
    assert isinstance(answer["reward"], float)
    assert isinstance(answer["mask_sample"], bool)
    assert answer["instance_config"]["mask_sample"] is answer["mask_sample"]
    return answer


@pytest.mark.parametrize("name", list(cases("math_with_judge")))
def test_math_rows_get_math_verifys_reward(math_server: ServerProcess, name: str) -> None:
    case = cases("math_with_judge")[name]
    answer = verify(math_server, case["request"])
    assert answer["reward"] == case["reward"]
    assert answer["mask_sample"] is False
    assert answer["failure_kind"] is None and answer["failure_reason"] is None
    assert "components" not in answer


def test_a_label_the_verifier_cannot_read_masks_the_sample(math_server: ServerProcess) -> None:
    request = cases("example_tool_call_multireward")["expected_call"]["request"]
    answer = verify(math_server, request)
    assert (answer["reward"], answer["mask_sample"]) == (0.0, True)
    assert answer["failure_kind"] == "verifier_error"
    assert answer["failure_reason"].startswith("error (model 'correct')")
    assert answer["verifier_errors"] == {"correct": "error"}
    r = httpx.post(f"{math_server.url}/verify", json=request, timeout=60)
    assert r.headers["X-Reward-Masked"] == "0"
    assert metric(math_server.url, "reward_server_requests_total", endpoint="/verify", status="200")


def test_seed_session_then_verify_as_simple_agent_does(math_server: ServerProcess) -> None:
    request = cases("math_with_judge")["correct_number"]["request"]
    seeded = httpx.post(f"{math_server.url}/seed_session", json=request, timeout=30)
    assert (seeded.status_code, seeded.json()) == (200, {})
    assert verify(math_server, request)["reward"] == 1.0


@pytest.mark.parametrize(("name", "reward"), [("expected_call", 2.0), ("other_city", 1.0)])
def test_tool_call_rollouts_reach_the_verifiers_as_conversations(
    agent_server: ServerProcess, name: str, reward: float
) -> None:
    answer = verify(agent_server, cases("example_tool_call_multireward")[name]["request"])
    assert answer["reward"] == reward
    assert answer["components"] == {"call": reward - 1.0, "answered": 1.0}
    assert answer["mask_sample"] is False and answer["failure_kind"] is None


def test_an_output_without_a_final_answer_and_a_row_without_the_label(
    agent_server: ServerProcess,
) -> None:
    # circle_click: the output ends with a tool result (an empty final turn), and the row's
    # label has no expected_call: the call verifier fails, and the item is masked.
    request = cases("circle_click")["output_ends_with_a_tool_result"]["request"]
    answer = verify(agent_server, request)
    assert (answer["reward"], answer["mask_sample"]) == (0.0, True)
    assert answer["failure_kind"] == "verifier_error"
    assert answer["components"] == {"call": None, "answered": 0.0}
    assert answer["instance_config"] == {"mask_sample": True}


def test_items_without_a_chat_form_are_refused(agent_server: ServerProcess) -> None:
    case = cases("circle_click")["image_part"]
    r = httpx.post(f"{agent_server.url}/verify", json=case["request"], timeout=30)
    assert r.status_code == 422, r.text
    assert case["error"] in r.json()["error"]


@pytest.fixture(scope="module")
def calls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("nemo_gym_calls")
    entry = {"name": "calls", "kind": "verifier", "verifier": "tool_call", "calls": "trajectory"}
    with serve(models=[entry], folder=folder) as srv:
        yield srv


@pytest.mark.parametrize(
    ("data", "name", "reward"),
    [
        ("example_tool_call_multireward", "expected_call", 1.0),
        ("example_tool_call_multireward", "other_city", 0.0),
        ("xlam_fc", "parallel_calls_with_reasoning_summaries", 1.0),
        ("xlam_fc", "reasoning_text_content", 1.0),  # no call expected, none made
        ("single_step_tool_use", "one_call_after_a_conversation", 1.0),
    ],
)
def test_the_tool_call_verifier_reads_a_rollout_s_calls(
    calls_server: ServerProcess, data: str, name: str, reward: float
) -> None:
    """verifier: tool_call with calls: trajectory on NeMo Gym's tool-calling rows: the calls
    the rollout made (before its final answer) against the row's expected_* field."""
    answer = verify(calls_server, cases(data)[name]["request"])
    assert answer["reward"] == reward and answer["mask_sample"] is False
    if reward == 0.0:
        assert answer["verifier_errors"] == {"calls": "wrong_value"}  # a score, not a mask
