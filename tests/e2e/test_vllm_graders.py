"""OpenAI's model graders on a judge served by the vLLM engine (issue 50, item 1: "a served
model, kind: judge on either engine"): the tiny GPT-2 trained to answer OpenAI's
``{"result": N, "steps": []}`` (helpers.grader_judge; 64-wide heads, as vLLM's CPU kernels
need) in a real ``reward-server --engine vllm``; a multi grader of python + string_check +
score_model through ``/score`` and the graders API, each value against plain transformers'
greedy ``generate`` parsed here; a ``max_completions_tokens`` too short for the JSON is a
``model_grader_parse_error`` (the row's own sampling parameters reach vLLM).

Without vLLM these tests skip, unless ``REWARD_SERVER_TEST_VLLM=1`` (set by ``make test``)
makes the absence a failure.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers.grader_judge import (
    ITEMS,
    MULTI,
    RESPONSES,
    judge_entry,
    reference_answers,
    score_model,
)
from helpers.models_files import write_models
from helpers.vllm import require_vllm, vllm_server
from server_proc import ServerProcess

require_vllm()


@pytest.fixture(scope="module")
def server(grader_judge: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    entries = [judge_entry(grader_judge), {"name": "rft", "kind": "grader", "grader": MULTI}]
    path = write_models(tmp_path_factory.mktemp("vllm_graders"), entries)
    with vllm_server(None, "--models", str(path)) as proc:
        yield proc


@pytest.mark.timeout(900)
def test_model_graders_on_a_vllm_judge(server: ServerProcess, grader_judge: Path) -> None:
    body = {"queries": ["q"] * 4, "responses": RESPONSES, "labels": ITEMS, "model": "rft"}
    answer = httpx.post(f"{server.url}/score", json=body, timeout=300)
    assert answer.status_code == 200, answer.text
    got = answer.json()
    answers = reference_answers(grader_judge, RESPONSES, max_new_tokens=24)
    judged = [json.loads(a)["result"] if a.strip().startswith("{") else None for a in answers]
    assert judged[:3] == [0.9, 0.2, 0.7] and judged[3] is None
    for i, (response, item) in enumerate(zip(RESPONSES[:3], ITEMS[:3], strict=True)):
        exact = float(item["answer"].lower() in response.lower())
        assert got["scores"][i] == pytest.approx((judged[i] + exact + len(response) / 100) / 3)
    assert got["masked"] == [None, None, None, "model_grader_parse_error"]

    run = f"{server.url}/v1/fine_tuning/alpha/graders/run"
    one = httpx.post(run, json={"grader": score_model(), "model_sample": "it good"}, timeout=300)
    assert one.json()["reward"] == 0.7
    short = score_model(sampling_params={"max_completions_tokens": 3})
    cut = httpx.post(run, json={"grader": short, "model_sample": "it good"}, timeout=300).json()
    assert cut["reward"] == 0.0 and cut["metadata"]["errors"]["model_grader_parse_error"]
