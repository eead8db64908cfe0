"""LLM judges in ``mode: generate`` (issue 21, part 3): the judge answers in text and the
score is parsed from its answer by ``score_pattern``.

A tiny GPT-2 is trained here (350 steps, seconds on CPU; once per run, shared with
tests/e2e/test_vllm_judge.py) to answer ``Rate: <response>`` with
``Verdict: Score: N``, N set by the response's last word, or with garbage (``no idea``) for one last
word. Served as a judge, its parsed scores are the expected numbers; an answer without a
match scores ``on_error`` with the reason ``parse_failure`` (in ``verifier_errors`` and counted in
``reward_server_verifier_errors_total``); and every score equals the number parsed from an
independent, unpadded, greedy ``generate`` of plain transformers on the same prompt.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from helpers.rubric_judge import (
    ANSWERS,
    GARBAGE,
    ON_ERROR,
    PATTERN,
    entry,
    parsed,
    random_response,
    reference_answers,
)
from prometheus_client.parser import text_string_to_metric_families

from reward_server.config.models_file import ModelsFileError, parse_models_file


def parse_errors(client: TestClient) -> float:
    text = client.get("/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {"model": "judge", "reason": "parse_failure"}
            if sample.name == "reward_server_verifier_errors_total" and sample.labels == labels:
                return float(sample.value)
    return 0.0


RESPONSES = [
    "great",
    "the film and it was very really good",
    "plot bad",
    "the movie so awful",
    "story odd",
    "good",
]


def test_the_trained_judge_answers_the_rubric(rubric_judge: Path) -> None:
    answers = reference_answers(rubric_judge, RESPONSES, 8)
    want = [{**ANSWERS, **GARBAGE}[r.split()[-1]] for r in RESPONSES]
    assert [a.strip() for a in answers] == want


def test_scores_are_parsed_from_the_answers_and_a_parse_failure_scores_on_error(
    rubric_judge: Path, models_client: Any
) -> None:
    client = models_client([entry(rubric_judge)])
    r = client.post("/score", json={"texts": RESPONSES})
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["scores"] == [9.0, 7.0, 2.0, 0.0, ON_ERROR, 7.0]
    assert data["verifier_errors"] == {"judge": [None, None, None, None, "parse_failure", None]}
    assert parse_errors(client) == 1.0
    # A pair reads its response the same way (the template has no prompt).
    pairs = client.post("/score", json={"queries": ["q", "q"], "responses": ["it bad", "great"]})
    assert pairs.json()["scores"] == [2.0, 9.0] and pairs.json().get("verifier_errors") is None
    assert parse_errors(client) == 1.0


def test_scores_equal_a_plain_greedy_generate(rubric_judge: Path, models_client: Any) -> None:
    """Items of many lengths in one left-padded batch, some the judge never saw."""
    rng = random.Random(1)
    words = [*ANSWERS, *GARBAGE, "movie", "it", "so"]
    responses = [random_response(rng, rng.choice(words)) for _ in range(16)]
    for max_new in (3, 8):
        client = models_client([entry(rubric_judge, max_new_tokens=max_new)], max_batch_size=16)
        r = client.post("/score", json={"texts": responses})
        assert r.status_code == 200, r.text
        want = parsed(reference_answers(rubric_judge, responses, max_new))
        assert r.json()["scores"] == want
        assert len(set(r.json()["tokens"])) > 2
    # Repeated: the same numbers (greedy is deterministic).
    again = client.post("/score", json={"texts": responses})
    assert again.json()["scores"] == want


def test_a_pattern_that_never_matches_scores_on_error(
    rubric_judge: Path, models_client: Any
) -> None:
    client = models_client([entry(rubric_judge, score_pattern=r"Grade: (\d+)", on_error=0.5)])
    r = client.post("/score", json={"texts": RESPONSES[:3]})
    assert r.status_code == 200, r.text
    assert r.json()["scores"] == [0.5] * 3
    assert r.json()["verifier_errors"] == {"judge": ["parse_failure"] * 3}
    assert parse_errors(client) == 3.0


def test_sampling_runs_and_info_lists_the_settings(rubric_judge: Path, models_client: Any) -> None:
    client = models_client([entry(rubric_judge, temperature=0.7, top_p=0.9)])
    r = client.post("/score", json={"texts": RESPONSES})
    assert r.status_code == 200, r.text
    assert len(r.json()["scores"]) == len(RESPONSES)
    (info,) = client.get("/info").json()["models"]
    assert info["mode"] == "generate" and info["score_pattern"] == PATTERN
    assert info["max_new_tokens"] == 8 and info["temperature"] == 0.7 and info["top_p"] == 0.9
    assert info["on_error"] == ON_ERROR and "score_tokens" not in info


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"score_pattern": None}, "mode: generate needs 'score_pattern'"),
        ({"score_pattern": r"Score: \d+"}, "score_pattern needs exactly one group"),
        ({"score_pattern": r"Score: (\d+"}, "score_pattern 'Score: (\\\\d+'"),
        ({"score_tokens": {"Yes": 1.0, "No": 0.0}}, "score_tokens: only for mode: logprobs"),
        ({"top_p": 0.5}, "top_p samples: give a temperature above 0"),
        ({"max_new_tokens": 0}, "max_new_tokens: Input should be greater than or equal to 1"),
        (
            {"mode": "logprobs", "score_tokens": {"Yes": 1.0, "No": 0.0}},
            "score_pattern, max_new_tokens: only for mode: generate or rubric; "
            "on_error: only for mode: generate, pairwise or rubric",
        ),
    ],
)
def test_generate_keys_are_validated(extra: dict[str, Any], message: str) -> None:
    spec = {k: v for k, v in {**entry(Path("/m")), **extra}.items() if v is not None}
    with pytest.raises(ModelsFileError) as err:
        parse_models_file({"models": [spec]})
    assert message in str(err.value)


def test_max_new_tokens_leaves_room_for_the_prompt(rubric_judge: Path, models_client: Any) -> None:
    """The prompt is cut to max_length - max_new_tokens (here 64 - 8) tokens."""
    client = models_client([entry(rubric_judge)])
    long = "very " * 100 + "good"
    r = client.post("/score", json={"texts": [long]})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == [56] and r.json()["truncated"] == [True]
