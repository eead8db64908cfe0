"""LLM judges on the vLLM engine (issue 21, part 3): ``kind: judge`` served by a real
``reward-server --engine vllm`` in both modes, each judge in its own vLLM engine.

- ``mode: logprobs``: a tiny random Llama-style causal LM with 64-wide heads (vLLM's CPU
  kernels need them), Yes/No score tokens and a chat template; every score is compared with
  the independent plain-transformers computation of ``tests/unit/test_judge.py`` within 1e-5 in
  float32, for pairs with labels, conversations, texts and a GRPO group (one prompt, many
  responses), whose shared prompt comes from vLLM's prefix cache
  (``reward_server_model_cached_tokens_total``).
- ``mode: generate``: the rubric-trained GPT-2 of ``tests/e2e/test_judge_generate.py``, with
  64-wide heads, answers ``Score: N``; the parsed scores, a parse failure scoring
  ``on_error`` (counted), and equality with plain transformers' greedy ``generate``.

Without vLLM these tests skip, unless ``REWARD_SERVER_TEST_VLLM=1`` (set by ``make test``)
makes the absence a failure.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from helpers.judges import (
    ATOL,
    CONVERSATIONS,
    LABELS,
    QUERIES,
    RESPONSES,
    TEMPLATE,
    TEXTS,
    YES_NO,
    contents,
    judge_entry,
    reference,
    save_judge,
)
from helpers.models_files import write_models
from helpers.rubric_judge import (
    ANSWERS,
    GARBAGE,
    ON_ERROR,
    parsed,
    random_response,
    reference_answers,
)
from helpers.rubric_judge import entry as generate_entry
from helpers.vllm import require_vllm, vllm_server
from server_proc import ServerProcess, metric

import tiny_models
from reward_server.config import ServerSettings
from reward_server.errors import ModelLoadError
from reward_server.http.app import create_app

require_vllm()

#: Eager mode: the same numbers, without the time torch.compile takes at start-up.


@pytest.fixture(scope="module")
def logprobs_judge(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_judge(tmp_path_factory.mktemp("vllm_judge"), "llama", wide=True)


@pytest.fixture(scope="module")
def server(
    logprobs_judge: Path, rubric_judge: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """One server, two judges (each its own vLLM engine)."""
    entries = [
        judge_entry(logprobs_judge),
        {**generate_entry(rubric_judge), "name": "grader", "weight": 0.0},
    ]
    path = write_models(tmp_path_factory.mktemp("vllm_judges"), entries)
    with vllm_server(None, "--models", str(path)) as proc:
        yield proc


def score(server: ServerProcess, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{server.url}/score", json={**body, "components": True}, timeout=120)
    assert r.status_code == 200, f"{r.text}\n{server.log()[-4000:]}"
    return dict(r.json())


def judge_scores(data: dict[str, Any], name: str) -> list[float]:
    return [float(v) for v in data["components"][name]]


def test_logprobs_scores_equal_transformers(server: ServerProcess, logprobs_judge: Path) -> None:
    pairs = score(server, {"queries": QUERIES, "responses": RESPONSES, "labels": LABELS})
    convs = score(server, {"conversations": CONVERSATIONS})
    texts = score(server, {"texts": TEXTS, "labels": [None, {"a": [1, 2]}, 3]})
    want_pairs = reference(logprobs_judge, contents(QUERIES, RESPONSES, LABELS), YES_NO)
    prompts = ["Be brief.\n\nhello", "What is 3 + 4?"]
    responses = [conv[-1]["content"] for conv in CONVERSATIONS]
    want_convs = reference(logprobs_judge, contents(prompts, responses, [None, None]), YES_NO)
    labels = [None, '{"a": [1, 2]}', 3]
    want_texts = reference(logprobs_judge, contents([""] * 3, TEXTS, labels), YES_NO)
    assert judge_scores(pairs, "judge") == pytest.approx(want_pairs, abs=ATOL)
    assert judge_scores(convs, "judge") == pytest.approx(want_convs, abs=ATOL)
    assert judge_scores(texts, "judge") == pytest.approx(want_texts, abs=ATOL)
    everything = want_pairs + want_convs + want_texts
    assert max(everything) - min(everything) > 0.05, everything  # the check can tell them apart
    # The grader weighs 0: the combined score is the judge's.
    assert pairs["scores"] == pytest.approx(want_pairs, abs=ATOL)


def test_a_grpo_group_shares_its_prompt_through_the_prefix_cache(
    server: ServerProcess, logprobs_judge: Path
) -> None:
    # About 270 tokens of the template's text before the response: two of vLLM's 128-token
    # CPU blocks (full blocks are what the prefix cache shares).
    question = "Explain slowly why the sky looks blue on a clear summer day, in detail. " * 5
    answers = tiny_models.make_corpus(8, seed=4, max_words=6)
    before = metric(server.url, "reward_server_model_cached_tokens_total", model="judge")
    data = score(server, {"queries": [question] * 8, "responses": answers})
    want = reference(logprobs_judge, contents([question] * 8, answers, [None] * 8), YES_NO)
    assert not any(data["truncated"]), data["tokens"]
    assert judge_scores(data, "judge") == pytest.approx(want, abs=ATOL)
    cached = metric(server.url, "reward_server_model_cached_tokens_total", model="judge") - before
    # The first row computes the shared blocks; the group's other seven read them.
    assert cached >= 7 * 2 * 128, cached


def test_generate_scores_are_parsed_and_a_parse_failure_scores_on_error(
    server: ServerProcess, rubric_judge: Path
) -> None:
    responses = ["great", "the film was very good", "plot bad", "so awful", "story odd", "good"]
    before = metric(
        server.url, "reward_server_verifier_errors_total", model="grader", reason="parse_failure"
    )
    data = score(server, {"texts": responses})
    assert judge_scores(data, "grader") == [9.0, 7.0, 2.0, 0.0, ON_ERROR, 7.0]
    assert data["verifier_errors"] == {"grader": [None, None, None, None, "parse_failure", None]}
    after = metric(
        server.url, "reward_server_verifier_errors_total", model="grader", reason="parse_failure"
    )
    assert after - before == 1.0
    # Many lengths at once, some the judge never saw: equal to plain greedy generate.
    rng = random.Random(1)
    words = [*ANSWERS, *GARBAGE, "movie", "it", "so"]
    mixed = [random_response(rng, rng.choice(words)) for _ in range(12)]
    want = parsed(reference_answers(rubric_judge, mixed, 8))
    assert judge_scores(score(server, {"texts": mixed}), "grader") == want


def test_info_lists_both_judges_on_vllm(server: ServerProcess) -> None:
    info = httpx.get(f"{server.url}/info", timeout=10).json()
    judge, grader = info["models"]
    for entry in (judge, grader):
        assert entry["kind"] == "judge" and entry["dtype"] == "float32"
        settings = entry["engine_settings"]
        assert settings["runner"] == "generate" and settings["enable_prefix_caching"] is True
    assert judge["mode"] == "logprobs" and judge["score_tokens"] == YES_NO
    assert judge["template"] == TEMPLATE
    assert grader["mode"] == "generate" and grader["max_new_tokens"] == 8


def test_a_model_that_is_not_a_causal_lm_stops_before_vllm_starts(tmp_path: Path) -> None:
    rm = tiny_models.save_wide_head_reward_model(tmp_path / "rm")
    path = write_models(tmp_path, [judge_entry(rm)])
    settings = ServerSettings(models=str(path), engine="vllm")
    with (
        pytest.raises(ModelLoadError, match="is not a causal language model"),
        TestClient(create_app(settings)),
    ):
        pass
