"""Rubric judges on the vLLM engine (issue 51): a real ``reward-server --engine vllm`` serving
a ``mode: rubric`` judge (a tiny random Llama-style causal LM with 64-wide heads, as vLLM's
CPU kernels need), its scores and per-criterion probabilities equal to the independent
plain-transformers computation of :mod:`helpers.rubrics` within 1e-5 (weights, categories,
pitfalls, required criteria, an empty rubric, pitfalls only), and the rows of one item
sharing their head (chat template, template head, prompt, response) through vLLM's prefix
cache, which ``reward_server_model_cached_tokens_total`` counts; and implicit aggregation (the
judge trained to answer ``Score: N``, :mod:`helpers.rubric_judge`) parsed, normalised and
masked as on transformers.

Without vLLM these tests skip, unless ``REWARD_SERVER_TEST_VLLM=1`` (set by ``make test``)
makes the absence a failure.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import rubrics
from helpers.judges import ATOL, save_judge
from helpers.models_files import write_models
from helpers.vllm import require_vllm, vllm_server
from server_proc import ServerProcess, metric

require_vllm()

#: About 270 tokens of the template's text before the criterion: two of vLLM's 128-token CPU
#: blocks (full blocks are what the prefix cache shares).
LONG_QUESTION = "Explain slowly why the sky looks blue on a clear summer day, in detail. " * 5


@pytest.fixture(scope="module")
def judge(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_judge(tmp_path_factory.mktemp("vllm_rubric"), "llama", wide=True)


@pytest.fixture(scope="module")
def threshold(judge: Path) -> float:
    """A verdict threshold at which some required criterion of the test's rubrics fails."""
    labels = rubrics.RUBRICS
    probs = rubrics.probabilities(judge, rubrics.QUERIES, rubrics.RESPONSES, labels)
    return rubrics.mixed_threshold(probs)


#: The trained judge reads "Rate: <response>\nVerdict:"; this template reads the rubric
#: without printing it, so that it answers as trained (``Score: N``).
IMPLICIT_TEMPLATE = "{% for c in rubric %}{% endfor %}Rate: {{ response }}\nVerdict:"


@pytest.fixture(scope="module")
def server(
    judge: Path,
    threshold: float,
    rubric_judge: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ServerProcess]:
    """The random rubric judge (explicit), and the judge trained to answer ``Score: N`` as
    an implicit one (weight 0; its own vLLM engine)."""
    entry = rubrics.entry(judge, verdict_threshold=threshold)
    implicit = {
        "name": "rated",
        "kind": "judge",
        "mode": "rubric",
        "model": str(rubric_judge),
        "template": IMPLICIT_TEMPLATE,
        "aggregation": "implicit",
        "score_pattern": "Score: (\\d+)",
        "rating_range": [1, 8],
        "chat_template": "none",
        "max_new_tokens": 8,
        "weight": 0.0,
    }
    path = write_models(tmp_path_factory.mktemp("vllm_rubric_models"), [entry, implicit])
    with vllm_server(None, "--models", str(path)) as proc:
        yield proc


def score(server: ServerProcess, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{server.url}/score", json={**body, "cache": False}, timeout=300)
    assert r.status_code == 200, f"{r.text}\n{server.log()[-4000:]}"
    return dict(r.json())


def test_rubric_scores_equal_the_independent_computation(
    server: ServerProcess, judge: Path, threshold: float
) -> None:
    labels = rubrics.RUBRICS
    probs = rubrics.probabilities(judge, rubrics.QUERIES, rubrics.RESPONSES, labels)
    want = [
        rubrics.aggregate(label, ps, threshold) for label, ps in zip(labels, probs, strict=True)
    ]
    assert any(g for _, g in want) and not all(g for _, g in want)
    body = {"queries": rubrics.QUERIES, "responses": rubrics.RESPONSES, "labels": labels}
    data = score(server, body)
    assert data["components"]["rubric"] == pytest.approx([s for s, _ in want], abs=ATOL)
    assert data["scores"] == pytest.approx([s for s, _ in want], abs=ATOL)  # rated weighs 0
    assert data["scores"][3] == 1.0
    for ps, got in zip(probs, data["criteria"]["rubric"], strict=True):
        assert [c["probability"] for c in got] == pytest.approx(ps, abs=ATOL)
        assert [c["verdict"] for c in got] == [p >= threshold for p in ps]


def test_the_prefix_cache_serves_the_shared_head_of_an_items_rows(
    server: ServerProcess, judge: Path, threshold: float
) -> None:
    rubric: list[dict[str, Any]] = [
        {"text": "Mentions scattering", "category": "essential"},
        {"text": "Mentions wavelength", "category": "important"},
        {"text": "Mentions the sun", "category": "optional"},
        {"text": "Mentions air molecules", "weight": 2},
        {"text": "Says the sky reflects the sea", "category": "pitfall"},
        {"text": "Is polite", "weight": 0.5},
    ]
    response = "Sunlight scatters off air molecules; blue scatters most."
    before = metric(server.url, "reward_server_model_cached_tokens_total", model="rubric")
    body = {"queries": [LONG_QUESTION], "responses": [response], "labels": [rubric]}
    data = score(server, {**body, "model": "rubric"})
    cached = metric(server.url, "reward_server_model_cached_tokens_total", model="rubric") - before
    probs = rubrics.probabilities(judge, [LONG_QUESTION], [response], [rubric])
    assert data["scores"] == pytest.approx(
        [rubrics.aggregate(rubric, probs[0], threshold)[0]], abs=ATOL
    )
    assert not data["truncated"][0] and data["tokens"][0] > 6 * 2 * 128, data["tokens"]
    # The first row computes the two shared blocks; the item's other five rows read them.
    assert cached >= 5 * 2 * 128, cached


def test_implicit_ratings_are_parsed_and_normalised(server: ServerProcess) -> None:
    """aggregation: implicit on vLLM, as on transformers (test_rubric_judge.py): the rating
    x scores (x - 1) / 7; no number is masked parse_failure, one outside [1, 8]
    out_of_range; an empty rubric scores 1 without a row."""
    responses = ["so great", "bad", "it was good", "odd", "awful", "great"]
    rubric = [{"text": "Is positive", "category": "essential"}]
    labels = [rubric] * 5 + [[]]
    body = {"queries": ["q"] * 6, "responses": responses, "labels": labels, "model": "rated"}
    data = score(server, body)
    assert data["scores"][1:3] == pytest.approx([1 / 7, 6 / 7], abs=1e-12)
    assert data["scores"][5] == 1.0
    assert data["masked"] == ["out_of_range", None, None, "parse_failure", "out_of_range", None]
    assert "criteria" not in data
