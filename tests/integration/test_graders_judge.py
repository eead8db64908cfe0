"""OpenAI's model graders on a served judge (issue 50, item 1: score_model and label_model):
a multi grader of a ``python``, a ``string_check`` and a ``score_model`` leaf whose model is
a ``kind: judge`` entry (``mode: generate``, a tiny GPT-2 trained to answer OpenAI's
``{"result": N, "steps": []}`` and a label model's ``{"result": LABEL}``:
helpers.grader_judge), through ``/score`` and through the graders API with
the ``openai`` package, each value against an independent computation (the judge's answers
by plain transformers' greedy ``generate``, parsed here; the other leaves and the formula
by hand); ``sampling_params`` honoured (a ``max_completions_tokens`` too short to finish the
JSON is a ``model_grader_parse_error``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from helpers.grader_judge import (
    ITEMS,
    MULTI,
    RESPONSES,
    judge_entry,
    label_model,
    reference_answers,
    score_model,
)
from helpers.servers import serve
from server_proc import ServerProcess


@pytest.fixture(scope="module")
def server(grader_judge: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    entries = [judge_entry(grader_judge), {"name": "rft", "kind": "grader", "grader": MULTI}]
    with serve(None, models=entries, folder=tmp_path_factory.mktemp("gj")) as srv:
        yield srv


def judged(folder: Path, responses: list[str]) -> list[float | None]:
    """The judge's result for each response, by plain transformers, parsed here."""
    out: list[float | None] = []
    for answer in reference_answers(folder, responses, max_new_tokens=24):
        try:
            out.append(float(json.loads(answer)["result"]))
        except (json.JSONDecodeError, KeyError, TypeError):
            out.append(None)
    return out


def test_multi_of_python_string_check_and_score_model(
    server: ServerProcess, grader_judge: Path
) -> None:
    body = {"queries": ["q"] * 4, "responses": RESPONSES, "labels": ITEMS, "model": "rft"}
    answer = httpx.post(f"{server.url}/score", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    got = answer.json()
    judge = judged(grader_judge, RESPONSES)
    assert judge[:3] == [0.9, 0.2, 0.7] and judge[3] is None  # what it was trained to say
    for i, (response, item) in enumerate(zip(RESPONSES[:3], ITEMS[:3], strict=True)):
        exact = float(item["answer"].lower() in response.lower())
        py = len(response) / 100
        assert got["scores"][i] == pytest.approx((judge[i] + exact + py) / 3)
        assert got["objectives"]["sub:judge"][i] == judge[i]
    assert got["scores"][3] is None
    assert got["masked"] == [None, None, None, "model_grader_parse_error"]


def test_graders_api_with_a_served_judge(server: ServerProcess, grader_judge: Path) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    run = client.fine_tuning.alpha.graders.run(grader=score_model(), model_sample="it good")  # type: ignore[arg-type]
    assert run.reward == judged(grader_judge, ["it good"])[0] == 0.7
    assert run.metadata.token_usage is not None and run.metadata.token_usage > 0
    assert run.api_model_grader_token_usage_per_model == {
        "judge": {"total_tokens": run.metadata.token_usage}
    }
    clipped = client.fine_tuning.alpha.graders.run(
        grader=score_model(range=[0.8, 1.0]),  # type: ignore[arg-type]
        model_sample="it good",
    )
    assert clipped.reward == 0.8
    short = client.fine_tuning.alpha.graders.run(
        grader=score_model(sampling_params={"max_completions_tokens": 3}),  # type: ignore[arg-type]
        model_sample="it good",
    )
    assert short.reward == 0.0 and short.metadata.errors.api_model_grader_parse_error
    garbage = client.fine_tuning.alpha.graders.run(grader=score_model(), model_sample="so odd")  # type: ignore[arg-type]
    assert garbage.metadata.errors.api_model_grader_parse_error


def test_label_model_on_the_served_judge(server: ServerProcess, grader_judge: Path) -> None:
    """label_model: the judge's label, 1 when it passes, 0 when it does not, a parse error
    when the answer names no label (each answer checked against plain transformers)."""
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
    responses = ["it good", "plot bad", "so odd"]
    answers = reference_answers(grader_judge, responses, max_new_tokens=24, labelled=True)
    assert [a.strip() for a in answers] == [
        '{"result": "positive"}',
        '{"result": "negative"}',
        "no idea",
    ]
    runs = [
        client.fine_tuning.alpha.graders.run(grader=label_model(), model_sample=r)  # type: ignore[arg-type]
        for r in responses
    ]
    assert [run.reward for run in runs] == [1.0, 0.0, 0.0]
    assert [run.metadata.errors.api_model_grader_parse_error for run in runs] == [
        False,
        False,
        True,
    ]


def test_a_grader_whose_model_is_not_served_does_not_start(tmp_path: Path) -> None:
    entry = {"name": "rft", "kind": "grader", "grader": score_model(model="o3-mini")}
    refused = r"exited with code \d+ before it was ready(.|\n)*judge \(score_model\).*'o3-mini'"
    with pytest.raises(RuntimeError, match=refused), serve(None, models=[entry], folder=tmp_path):
        pass
