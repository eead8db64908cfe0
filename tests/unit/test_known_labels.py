"""The label values each kind of model has series for from its start
(:class:`reward_server.scoring.known_labels.ModelSeries`): the reasons it can fail or mask
with, whether it runs passes, and the tenants in force."""

from __future__ import annotations

from typing import Any

import pytest

from reward_server.config.models_file import parse_models_file
from reward_server.config.tenants import TenantTable, hash_key, parse_tenants_file
from reward_server.scoring.known_labels import ModelSeries, tenant_names

VERIFIER = ("timeout", "crash", "error", "non_finite", "bad_result", "sandbox_error", "deadline")
#: A kind: grader's: OpenAI's error flags, and the deadline.
GRADER = (
    "invalid_variable_error",
    "sample_parse_error",
    "formula_parse_error",
    "python_grader_runtime_error",
    "python_grader_server_error",
    "model_grader_parse_error",
    "model_grader_server_error",
    "other_error",
    "deadline",
)
EXACT = {"type": "string_check", "name": "e", "input": "a", "reference": "b", "operation": "eq"}
JUDGE = {"kind": "judge", "model": "m", "template": "{{ response }}"}


def series(entry: dict[str, Any], cached: bool = False) -> ModelSeries:
    (spec,) = parse_models_file({"models": [{"name": "x", **entry}]}).models
    return ModelSeries.of(spec, cached=cached)


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"model": "m"}, ModelSeries("x", passes=True, masked=("deadline", "unclosed_reasoning"))),
        ({"model": "m", "kind": "process"}, ModelSeries("x", passes=True, masked=("deadline",))),
        (
            {"kind": "verifier", "verifier": "exact"},
            ModelSeries("x", verifier_errors=VERIFIER, masked=(*VERIFIER, "unclosed_reasoning")),
        ),
        (
            {"kind": "verifier", "verifier": "exact", "on_error": -1.0, "reasoning": "keep"},
            ModelSeries("x", verifier_errors=VERIFIER, masked=("deadline",)),
        ),
        (
            {"kind": "remote", "url": "http://127.0.0.1:1", "unclosed_reasoning": 0.0},
            ModelSeries(
                "x",
                remote_errors=("remote_error", "timeout", "parse_failure", "deadline"),
                masked=("remote_error", "timeout", "parse_failure", "deadline"),
            ),
        ),
        (
            {**JUDGE, "score_tokens": {"Yes": 1.0, "No": 0.0}},
            ModelSeries("x", passes=True, masked=("deadline", "unclosed_reasoning")),
        ),
        (
            {**JUDGE, "mode": "generate", "score_pattern": "([0-9]+)", "on_error": 0.0},
            ModelSeries(
                "x",
                passes=True,
                verifier_errors=("parse_failure",),
                masked=("deadline", "unclosed_reasoning"),
            ),
        ),
        (
            {**JUDGE, "mode": "pairwise", "answer_tokens": ["A", "B"]},
            ModelSeries(
                "x",
                passes=True,
                masked=("no_opponent", "non_finite", "deadline", "unclosed_reasoning"),
            ),
        ),
        (
            {"kind": "grader", "grader": EXACT},
            ModelSeries("x", verifier_errors=GRADER, masked=(*GRADER, "unclosed_reasoning")),
        ),
        (
            {"kind": "grader", "grader": EXACT, "on_error": 0},
            ModelSeries("x", verifier_errors=GRADER, masked=("deadline", "unclosed_reasoning")),
        ),
    ],
    ids=["sequence", "process", "verifier", "verifier-filled", "remote", "logprobs", "generate",
         "pairwise", "grader", "grader-zero"],
)  # fmt: skip
def test_each_kind_has_the_series_of_what_it_can_give(
    entry: dict[str, Any], expected: ModelSeries
) -> None:
    assert series(entry) == expected


def test_a_cached_model_has_the_cache_series() -> None:
    assert series({"model": "m"}, cached=True).cached


def test_the_tenants_in_force() -> None:
    table: TenantTable = parse_tenants_file(
        {"tenants": [{"name": n, "key_sha256": hash_key(n)} for n in ("alpha", "beta")]}
    )
    assert tenant_names(table) == ["alpha", "beta"]
    assert tenant_names(None) == ["default"]  # no key: every request is the default tenant
