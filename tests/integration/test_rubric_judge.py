"""Rubric judges (issue 51) on the transformers engine, in process: each item's label its
rubric, one row per criterion through the model's scheduler, and the score by the documented
formula; compared with the independent computation of :mod:`helpers.rubrics` (each row
rendered by the test, one unpadded forward pass per row) within 1e-5, for weights,
categories, pitfalls, required criteria, an empty rubric and a rubric of pitfalls only.
Generated verdicts and implicit ratings: the judge trained to answer ``Score: N``
(:mod:`helpers.rubric_judge`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from helpers import rubrics
from helpers.apps import models_app
from helpers.judges import ATOL
from helpers.posting import assert_error
from helpers.rubric_judge import ANSWERS
from helpers.rubric_judge import reference_answers as generated


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_rubric_scores_equal_the_independent_computation(
    judges: dict[str, Path], tmp_path: Path, family: str
) -> None:
    folder = judges[family]
    labels = rubrics.RUBRICS
    probs = rubrics.probabilities(folder, rubrics.QUERIES, rubrics.RESPONSES, labels)
    threshold = rubrics.mixed_threshold(probs)
    want = [
        rubrics.aggregate(label, ps, threshold) for label, ps in zip(labels, probs, strict=True)
    ]
    assert any(g for _, g in want) and not all(g for _, g in want)
    app = models_app(
        tmp_path, [rubrics.entry(folder, verdict_threshold=threshold)], max_batch_size=4
    )
    body = {"queries": rubrics.QUERIES, "responses": rubrics.RESPONSES, "labels": labels}
    with TestClient(app) as client:
        r = client.post("/score", json={**body, "cache": False})
        assert r.status_code == 200, r.text
        answer = r.json()
        metrics = client.get("/metrics").text
    assert answer["scores"] == pytest.approx([s for s, _ in want], abs=ATOL)
    assert answer["scores"][3] == 1.0  # the empty rubric
    criteria = answer["criteria"]["rubric"]
    for label, ps, got in zip(labels, probs, criteria, strict=True):
        assert [c["probability"] for c in got] == pytest.approx(ps, abs=ATOL)
        assert [c["weight"] for c in got] == [
            rubrics.weight_of(c) for c in rubrics.criteria_of(label)
        ]
        assert [c["verdict"] for c in got] == [p >= threshold for p in ps]
        assert [c.get("category") for c in got] == [
            c.get("category") for c in rubrics.criteria_of(label)
        ]
        assert [c["required"] for c in got] == [
            bool(c.get("required")) for c in rubrics.criteria_of(label)
        ]
    # tokens: the sum of an item's rows; the empty rubric has none.
    assert answer["tokens"][3] == 0 and min(answer["tokens"][:3]) > 0
    # One row per criterion went through the scheduler.
    rows = sum(len(rubrics.criteria_of(label)) for label in labels)
    assert f'reward_server_model_batch_rows_sum{{model="rubric"}} {float(rows)}' in metrics


def test_categories_failed_are_counted(judges: dict[str, Path], tmp_path: Path) -> None:
    """/metrics: per category, the items whose rubric has it and those failing it, and the
    reward signals' share failing it."""
    folder = judges["gpt2"]
    labels = rubrics.RUBRICS
    probs = rubrics.probabilities(folder, rubrics.QUERIES, rubrics.RESPONSES, labels)
    app = models_app(tmp_path, [rubrics.entry(folder)])
    body = {"queries": rubrics.QUERIES, "responses": rubrics.RESPONSES, "labels": labels}
    items: dict[str, int] = {}
    failed: dict[str, int] = {}
    for label, ps in zip(labels, probs, strict=True):
        seen: dict[str, bool] = {}
        for c, p in zip(rubrics.criteria_of(label), ps, strict=True):
            name = c.get("category", "uncategorised")
            fails = p >= 0.5 if rubrics.weight_of(c) < 0 else p < 0.5
            seen[name] = seen.get(name, False) or fails
        for name, fail in seen.items():
            items[name] = items.get(name, 0) + 1
            failed[name] = failed.get(name, 0) + fail
    with TestClient(app) as client:
        assert client.post("/score", json=body).status_code == 200
        text = client.get("/metrics").text
    for name in [*rubrics.CATEGORIES, "uncategorised"]:
        labels_ = f'{{category="{name}",model="rubric"}}'
        assert f"reward_server_rubric_items_total{labels_} {float(items.get(name, 0))}" in text
        assert (
            f"reward_server_rubric_failed_items_total{labels_} {float(failed.get(name, 0))}" in text
        )
    # The reward signals: the share of the window's items failing each category they have.
    for name, n in items.items():
        labels_ = f'{{category="{name}",model="rubric",tenant="default"}}'
        assert f"reward_server_reward_rubric_failed_ratio{labels_} {failed[name] / n}" in text


BAD_RUBRICS: list[tuple[Any, str]] = [
    (None, "item 1: no label"),
    ({"criteria": []}, "item 1: the label has no 'rubric' key"),
    ("be nice", "item 1: the rubric is a str"),
    ([{"text": "", "weight": 1}], "item 1, criterion 0: 'text' must be a non-empty string"),
    ([{"text": "ok", "weight": 1}, {"text": "x"}], "item 1, criterion 1: give a 'weight' or"),
    ([{"text": "x", "category": "vital"}], "criterion 0: unknown category 'vital'"),
    ([{"text": "x", "weight": "1"}], "criterion 0: 'weight' must be a number"),
    ([{"text": "x", "weight": 1, "why": 2}], "criterion 0: unknown key(s) why"),
    ([{"text": "x", "weight": 1, "required": "yes"}], "'required' must be true or false"),
    (["just text"], "criterion 0: a str, not a mapping"),
]


@pytest.mark.parametrize(("label", "message"), BAD_RUBRICS)
def test_a_malformed_rubric_is_a_422_naming_the_item(
    judges: dict[str, Path], tmp_path: Path, label: Any, message: str
) -> None:
    app = models_app(tmp_path, [rubrics.entry(judges["gpt2"])])
    body = {"queries": ["q", "q"], "responses": ["a", "b"], "labels": [[], label]}
    with TestClient(app) as client:
        error = assert_error(client.post("/score", json=body), 422, "bad_label")["error"]
    assert error.startswith("model 'rubric', item 1"), error
    assert message in error, error


def test_templates_that_cannot_judge_a_rubric_do_not_load(
    judges: dict[str, Path], tmp_path: Path
) -> None:
    folder = judges["gpt2"]
    cases = [
        ({"template": "Q: {{ prompt }} A: {{ response }}"}, "does not read criterion"),
        (
            {"template": rubrics.TEMPLATE, "aggregation": "implicit"},
            "with aggregation: implicit one row sees the whole rubric",
        ),
        ({"verdict_tokens": ["Maybe", "No"]}, "verdict token 'Maybe'"),
    ]
    for extra, message in cases:
        app = models_app(tmp_path, [rubrics.entry(folder, **extra)])
        with pytest.raises(Exception, match=message), TestClient(app):
            pass
    with pytest.raises(ValueError, match="score_pattern is for aggregation: implicit"):
        models_app(tmp_path, [rubrics.entry(folder, score_pattern="(\\d)")])


# --------------------------------------------------------------- generated verdicts, implicit

#: The trained judge reads "Rate: <response>\nVerdict:"; these templates read the criterion
#: (or the rubric) without printing it, so that it answers as trained.
VERDICT_TEMPLATE = "{% if criterion %}{% endif %}Rate: {{ response }}\nVerdict:"
IMPLICIT_TEMPLATE = "{% for c in rubric %}{% endfor %}Rate: {{ response }}\nVerdict:"


def _generating(folder: Path, **extra: Any) -> dict[str, Any]:
    return {
        "name": "rubric",
        "kind": "judge",
        "mode": "rubric",
        "model": str(folder),
        "chat_template": "none",
        "max_new_tokens": 8,
        **extra,
    }


def test_generated_verdicts(rubric_judge: Path, tmp_path: Path) -> None:
    """verdict: generate: "Score: 9" reads yes, "Score: 2" no (the verdict tokens), another
    answer is a parse failure: the item is masked with its reason, and counted."""
    responses = ["the film was great", "it was bad", "really good", "odd"]
    answers = generated(rubric_judge, responses, max_new_tokens=8)
    assert [a.strip() for a in answers[:3]] == [ANSWERS["great"], ANSWERS["bad"], ANSWERS["good"]]
    entry = _generating(
        rubric_judge,
        template=VERDICT_TEMPLATE,
        verdict="generate",
        verdict_tokens=["9", "2"],
        verdict_pattern="Score: (\\d+)",
    )
    rubric = [{"text": "Is positive", "weight": 2.0}, {"text": "Is mean", "weight": -1.0}]
    body = {"queries": ["q"] * 4, "responses": responses, "labels": [rubric] * 4}
    with TestClient(models_app(tmp_path, [entry])) as client:
        r = client.post("/score", json=body)
        text = client.get("/metrics").text
    assert r.status_code == 200, r.text
    answer = r.json()
    # Both rows of an item see the same text (the template prints no criterion): each
    # criterion's verdict is the answer's. great: (2 * 1 - 1 * 1) / 2; bad: 0.
    assert answer["scores"] == [0.5, 0.0, None, None]
    assert answer["masked"] == [None, None, "parse_failure", "parse_failure"]
    assert answer["criteria"]["rubric"][0] == [
        {"verdict": True, "probability": 1.0, "weight": 2.0, "required": False},
        {"verdict": True, "probability": 1.0, "weight": -1.0, "required": False},
    ]
    assert answer["criteria"]["rubric"][2] is None
    assert 'reward_server_verifier_errors_total{model="rubric",reason="parse_failure"} 2.0' in text


def test_implicit_ratings_are_parsed_and_normalised(rubric_judge: Path, tmp_path: Path) -> None:
    """aggregation: implicit: one generated row per item that sees the whole rubric; the
    rating x scores (x - low) / (high - low); no number is masked parse_failure, a number
    outside rating_range out_of_range; an empty rubric scores 1 without a row."""
    responses = ["so great", "bad", "it was good", "odd", "awful", "great"]
    entry = _generating(
        rubric_judge,
        template=IMPLICIT_TEMPLATE,
        aggregation="implicit",
        score_pattern="Score: (\\d+)",
        rating_range=[1, 8],
    )
    rubric = [{"text": "Is positive", "category": "essential"}]
    labels = [rubric] * 5 + [[]]
    body = {"queries": ["q"] * 6, "responses": responses, "labels": labels}
    with TestClient(models_app(tmp_path, [entry])) as client:
        r = client.post("/score", json=body)
        text = client.get("/metrics").text
    assert r.status_code == 200, r.text
    answer = r.json()
    # great 9 > 8: out of range; bad 2 -> 1/7; good 7 -> 6/7; odd: no number; awful 0 < 1.
    assert answer["scores"][1:3] == pytest.approx([1 / 7, 6 / 7], abs=1e-12)
    assert answer["scores"][5] == 1.0
    assert answer["masked"] == ["out_of_range", None, None, "parse_failure", "out_of_range", None]
    assert "criteria" not in answer
    assert answer["tokens"][5] == 0
    for reason, n in (("parse_failure", 1.0), ("out_of_range", 2.0)):
        assert (
            f'reward_server_verifier_errors_total{{model="rubric",reason="{reason}"}} {n}' in text
        )
