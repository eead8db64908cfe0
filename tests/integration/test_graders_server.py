"""OpenAI's graders on a real server (issue 50): the ``openai`` package itself as the client
of ``/v1/fine_tuning/alpha/graders/run`` and ``/validate`` (answers parse into its types,
each error flag set by a case that causes it, behind the API key), ``kind: grader`` entries
served through ``/score`` (masks named after OpenAI's flags, ``on_error: 0``, a slow python
grader cut at its limit and masked) and the endpoint-grader contract (``/v1/graders/NAME``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from helpers.servers import serve
from openai.types.fine_tuning.alpha import GraderRunResponse, GraderValidateResponse
from rapidfuzz import fuzz, utils
from server_proc import ServerProcess

KEY = "graders-test-key"
OUT, REF = "{{ sample.output_text }}", "{{ item.answer }}"
EXACT = {"type": "string_check", "name": "exact", "input": OUT, "reference": REF, "operation": "eq"}
HALF = {"type": "python", "name": "half", "source": "def grade(sample, item):\n    return 0.5\n"}
#: The guide's python grader, verbatim (developers.openai.com/api/docs/guides/graders).
GUIDE_PYTHON = """
from rapidfuzz import fuzz, utils

def grade(sample, item) -> float:
    output_text = sample["output_text"]
    reference_answer = item["reference_answer"]
    return fuzz.WRatio(output_text, reference_answer, processor=utils.default_process) / 100.0
"""
MULTI = {
    "type": "multi",
    "name": "both",
    "graders": {"exact": EXACT, "half": HALF},
    "calculate_output": "0.5 * exact + half",
}
SLOW = {
    "type": "python",
    "name": "slow",
    "source": "import time\n\ndef grade(s, i):\n    time.sleep(60)\n    return 1\n",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    entries = [
        {"name": "rft", "kind": "grader", "grader": MULTI},
        {"name": "zero", "kind": "grader", "grader": EXACT, "on_error": 0, "weight": 0},
        {"name": "slow", "kind": "grader", "grader": SLOW, "timeout_s": 2, "weight": 0},
    ]
    with serve(None, "--api-key", KEY, models=entries, folder=tmp_path_factory.mktemp("g")) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=60)


def run(client: openai.OpenAI, grader: dict[str, Any], sample: str, item: Any) -> GraderRunResponse:
    answer = client.fine_tuning.alpha.graders.run(grader=grader, model_sample=sample, item=item)  # type: ignore[arg-type]
    assert isinstance(answer, GraderRunResponse)
    return answer


def raised(answer: GraderRunResponse) -> set[str]:
    """The error flags set in an answer."""
    errors = answer.metadata.errors.model_dump(by_alias=True)
    return {flag for flag, value in errors.items() if value is True}


def test_run_answers_in_openais_types(client: openai.OpenAI) -> None:
    answer = run(client, MULTI, "Paris", {"answer": "Paris"})
    assert answer.reward == 1.0
    assert answer.sub_rewards == {"exact": 1.0, "half": 0.5}
    assert answer.metadata.name == "both" and answer.metadata.type == "multi"
    assert answer.metadata.scores == {"exact": 1.0, "half": 0.5}
    assert answer.metadata.execution_time >= 0
    assert answer.api_model_grader_token_usage_per_model == {}
    assert raised(answer) == set()
    assert run(client, MULTI, "Lyon", {"answer": "Paris"}).reward == 0.5


def test_the_guides_python_grader_runs_in_the_sandbox(client: openai.OpenAI) -> None:
    """The guide's payload, verbatim. The guide prints the answer without stating it; OpenAI's
    own API answered 0.7555555555555555 (eval-protocol/openai-rft-quickstart's README, the same
    grader run live), which rapidfuzz gives too."""
    grader = {"type": "python", "name": "fuzzy", "source": GUIDE_PYTHON, "image_tag": "2025-05-08"}
    item = {"reference_answer": "fuzzy wuzzy had no hair"}
    answer = run(client, grader, "fuzzy wuzzy was a bear", item)
    assert answer.reward == pytest.approx(0.7555555555555555)
    expected = fuzz.WRatio(
        "fuzzy wuzzy was a bear", item["reference_answer"], processor=utils.default_process
    )
    assert answer.reward == pytest.approx(expected / 100.0)
    assert raised(answer) == set()
    other = run(client, grader, "Fuzzy Wuzzy had no hair!", item)
    assert other.reward == 1.0


def test_the_api_references_validate_example(server: ServerProcess) -> None:
    """The API reference's graders/validate example: its request body, verbatim, answered
    with the grader it sent."""
    body = {
        "grader": {
            "type": "string_check",
            "name": "Example string check grader",
            "input": "{{sample.output_text}}",
            "reference": "{{item.label}}",
            "operation": "eq",
        }
    }
    headers = {"Authorization": f"Bearer {KEY}"}
    url = f"{server.url}/v1/fine_tuning/alpha/graders/validate"
    answer = httpx.post(url, json=body, headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json() == body


PY = "def grade(sample, item):\n    {}\n"
FLAG_CASES = [
    ("invalid_variable_error", {**EXACT, "reference": "{{ item.missing }}"}, "x", {"answer": "x"}),
    (
        "sample_parse_error",
        {**EXACT, "input": "{{ sample.output_json.answer }}"},
        "not json",
        {"answer": "x"},
    ),
    (
        "formula_parse_error",
        {**MULTI, "calculate_output": "half / (exact - 1)"},
        "x",
        {"answer": "x"},
    ),
    ("python_grader_runtime_error", {**HALF, "source": PY.format("return 1 / 0")}, "x", {}),
    (
        "python_grader_runtime_error",
        {**HALF, "source": PY.format("return 'high'")},
        "x",
        {},
    ),
    (
        "python_grader_server_error",
        {**HALF, "source": "import os\n\n" + PY.format("os._exit(3)")},
        "x",
        {},
    ),
    (
        "model_grader_server_error",
        {
            "type": "score_model",
            "name": "judge",
            "model": "gpt-4o-2024-08-06",
            "input": [{"role": "user", "content": "Grade: " + OUT}],
        },
        "x",
        {},
    ),
]


@pytest.mark.parametrize(("flag", "grader", "sample", "item"), FLAG_CASES)
def test_each_error_flag_is_set_by_a_case_causing_it(
    client: openai.OpenAI, flag: str, grader: dict[str, Any], sample: str, item: Any
) -> None:
    answer = run(client, grader, sample, item)
    assert answer.reward == 0.0
    assert raised(answer) == {flag}


def test_runtime_error_details_say_what_raised(client: openai.OpenAI) -> None:
    answer = run(client, {**HALF, "source": PY.format("return 1 / 0")}, "x", {})
    assert "ZeroDivisionError" in (answer.metadata.errors.python_grader_runtime_error_details or "")


def test_validate_parses_and_refuses_naming_the_field(client: openai.OpenAI) -> None:
    valid = client.fine_tuning.alpha.graders.validate(grader=MULTI)  # type: ignore[arg-type]
    assert isinstance(valid, GraderValidateResponse)
    assert valid.grader is not None and valid.grader.name == "both"
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.fine_tuning.alpha.graders.validate(grader={**EXACT, "operation": "contains"})  # type: ignore[arg-type]
    assert "grader.operation" in str(refused.value)
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.fine_tuning.alpha.graders.run(  # type: ignore[call-overload]
            grader={**MULTI, "calculate_output": "exact + __import__('os')"}, model_sample="x"
        )
    assert "calculate_output" in str(refused.value)


def test_the_api_is_behind_the_keys(server: ServerProcess) -> None:
    stranger = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.fine_tuning.alpha.graders.run(grader=EXACT, model_sample="x", item={"answer": "x"})  # type: ignore[arg-type]
    answer = httpx.post(
        f"{server.url}/v1/graders/rft", json={"sample": "x", "item": {}}, timeout=30
    )
    assert answer.status_code == 401


def score(server: ServerProcess, responses: list[str], labels: list[Any], **body: Any) -> Any:
    answer = httpx.post(
        f"{server.url}/score",
        json={"queries": ["q"] * len(responses), "responses": responses, "labels": labels, **body},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_models_file_grader_masks_with_openais_flags(server: ServerProcess) -> None:
    body = score(server, ["Paris", "Lyon", "Paris"], [{"answer": "Paris"}, {"answer": "Paris"}, {}])
    assert body["components"]["rft"] == [1.0, 0.5, None]
    assert body["masked"] == [None, None, "invalid_variable_error"]
    # on_error: 0, OpenAI's behaviour: the failed grade is 0, not masked.
    assert body["components"]["zero"] == [1.0, 0.0, 0.0]


def test_a_slow_python_grader_is_cut_at_its_limit_and_masked(server: ServerProcess) -> None:
    began = time.monotonic()
    body = score(server, ["a", "b"], [{}, {}], model="slow")
    assert body["scores"] == [None, None]
    assert body["masked"] == ["python_grader_server_error"] * 2
    assert time.monotonic() - began < 30  # two items of a 2 s limit, not two of 60 s


def test_endpoint_grader_contract(server: ServerProcess) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    url = f"{server.url}/v1/graders/rft"
    body = {"sample": {"output_text": "Paris"}, "item": {"answer": "Paris"}, "trace_id": "t-1"}
    assert httpx.post(url, json=body, headers=headers, timeout=30).json() == {
        "score": 1.0,
        "error": None,
    }
    failed = httpx.post(url, json={"sample": "x", "item": {}}, headers=headers, timeout=30).json()
    assert failed == {"score": None, "error": "invalid_variable_error"}
    missing = httpx.post(
        f"{server.url}/v1/graders/nope", json={"sample": "x"}, headers=headers, timeout=30
    )
    assert missing.status_code == 422  # as /score naming a model not served
    assert missing.json()["type"] == "unknown_model"
    bad = httpx.post(url, json={"sample": {"text": "x"}}, headers=headers, timeout=30)
    assert bad.status_code == 422
