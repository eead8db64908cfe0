"""The tool_call verifier (reward_server.verifiers.tool_calls) against the hand-written table
of tests/tool_call_cases.py, both credits, and its errors for labels and tools it cannot use.

tests/integration/test_bfcl_agreement.py gives the same table to BFCL's own checker.
"""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from tool_call_cases import CASES, DIVERGENCES, Case, block, call, tool

from reward_server.verifiers.tool_calls import (
    REASONS,
    Expected,
    ToolCallOptions,
    expected_calls,
    score_tool_calls,
)

CATEGORIES = {
    "simple",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
    "types",
    "optional",
    "strings",
    "invalid_json",
    "schema",
}
WEATHER = tool("get_weather", {"city": {"type": "string"}}, ["city"])


def score(case: Case, credit: str) -> tuple[float, str | None]:
    options = ToolCallOptions(credit=credit, **case.options)  # type: ignore[arg-type]
    return score_tool_calls(case.calls, case.text, case.label, case.tools, options)


def test_the_table_covers_the_categories_and_the_reasons() -> None:
    assert len(CASES) >= 30
    assert not CATEGORIES - {case.category for case in CASES}
    assert not set(REASONS) - {case.reason for case in CASES}
    assert len({case.name for case in CASES + DIVERGENCES}) == len(CASES + DIVERGENCES)
    decided = [case for case in CASES if case.bfcl]
    assert len(decided) >= 30
    assert sum(not case.valid for case in decided) >= 10


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_all_or_nothing(case: Case) -> None:
    assert score(case, "all") == ((1.0 if case.valid else 0.0), case.reason)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_partial_credit(case: Case) -> None:
    value, reason = score(case, "partial")
    assert value == pytest.approx(case.partial_score)
    assert reason == case.reason


@pytest.mark.parametrize("case", DIVERGENCES, ids=lambda case: case.name)
def test_where_bfcl_is_stricter_full_marks(case: Case) -> None:
    assert score(case, "all") == (1.0, None)


def test_partial_credit_counts_surplus_and_missing_calls() -> None:
    label = [{"get_weather": {"city": [c]}} for c in ("Paris", "London", "Rome", "Oslo")]
    calls = [call("get_weather", {"city": c}) for c in ("Oslo", "Paris", "Lima")]
    options = ToolCallOptions(credit="partial")
    assert score_tool_calls(calls, None, label, [WEATHER], options) == (0.5, "wrong_count")
    surplus = [*calls, call("get_weather", {"city": "Rome"}), call("get_weather", {"city": "X"})]
    assert score_tool_calls(surplus, None, label, [WEATHER], options) == (0.6, "wrong_count")
    assert score_tool_calls(None, "", [], [WEATHER], options) == (1.0, None)
    assert score_tool_calls(calls[:1], None, [], None, options) == (0.0, "unexpected_call")


def test_calls_given_are_read_and_the_text_ignored() -> None:
    text = block("get_weather", {"city": "London"})
    calls = [call("get_weather", {"city": "Paris"})]
    assert score_tool_calls(calls, text, [{"get_weather": {"city": ["Paris"]}}], None) == (
        1.0,
        None,
    )


@pytest.mark.parametrize(
    "item",
    [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "get_weather", "parameters": {"city": "Paris"}},
        {"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
    ],
)
def test_a_call_in_any_common_shape(item: dict[str, Any]) -> None:
    label = [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    assert score_tool_calls([item], None, label, [WEATHER]) == (1.0, None)


def test_empty_arguments_are_no_arguments() -> None:
    ping = tool("ping", {}, [])
    for arguments in ("", "  ", None, "{}"):
        calls = [{"type": "function", "function": {"name": "ping", "arguments": arguments}}]
        assert score_tool_calls(calls, None, [{"ping": {}}], [ping]) == (1.0, None)
    calls = [call("ping", {"host": "x"})]
    assert score_tool_calls(calls, None, [{"ping": {}}], [ping]) == (0.0, "unexpected_argument")


@pytest.mark.parametrize(
    ("label", "expected"),
    [
        ([], []),
        ('[{"f": {"x": [1, ""]}}]', [Expected("f", {"x": [1, ""]})]),
        ({"id": "simple_0", "ground_truth": '[{"f": {"x": [1]}}]'}, [Expected("f", {"x": [1]})]),
        ({"f": {"x": [1]}}, [Expected("f", {"x": [1]})]),
        ({"name": "f", "arguments": '{"x": 1}'}, [Expected("f", {"x": [1]})]),
        (
            [{"type": "function", "function": {"name": "f", "arguments": {"o": {"a": "b"}}}}],
            [Expected("f", {"o": [{"a": ["b"]}]})],
        ),
        (
            [{"name": "f", "arguments": {"l": [{"a": 1}], "m": [1, 2]}}],
            [Expected("f", {"l": [[{"a": [1]}]], "m": [[1, 2]]})],
        ),
    ],
)
def test_label_forms(label: Any, expected: list[Expected]) -> None:
    assert expected_calls(label) == expected


def test_a_plain_label_takes_exact_values_objects_included() -> None:
    flight = tool(
        "book",
        {"who": {"type": "object", "properties": {"name": {"type": "string"}}}},
        ["who"],
    )
    label = [{"name": "book", "arguments": {"who": {"name": "Ann Lee"}}}]
    good = [call("book", {"who": {"name": "ann lee"}})]
    assert score_tool_calls(good, None, label, [flight]) == (1.0, None)
    bad = [call("book", {"who": {"name": "Ann", "age": 3}})]
    assert score_tool_calls(bad, None, label, [flight]) == (0.0, "wrong_value")


@pytest.mark.parametrize(
    ("label", "message"),
    [
        ("not json", "not valid JSON"),
        (5, "list of expected calls"),
        (None, "list of expected calls"),
        ([5], "not an object"),
        ([{"f": {"x": 1}}], "list of allowed values"),
        ([{"f": [1]}], "not an object"),
        ([{"f": {}, "g": {}}], "neither"),
        ([{"name": "f", "arguments": "{oops"}], "not valid JSON"),
        ([{"name": "f", "arguments": [1]}], "not an object"),
    ],
)
def test_an_unusable_label_raises(label: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        score_tool_calls([call("f", {"x": 1})], None, label, None)


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ({"type": "function"}, "list of function specs"),
        ([{"type": "function", "function": {"parameters": {}}}], "with a name"),
        ([tool("f", {"x": {"type": "strin"}}, ["x"])], "not a valid JSON schema"),
    ],
)
def test_unusable_tools_raise(tools: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        score_tool_calls([call("f", {"x": 1})], None, [{"f": {"x": [1]}}], tools)


def test_a_broken_schema_is_not_read_with_the_schema_check_off() -> None:
    tools = [tool("f", {"x": {"type": "strin"}}, ["x"])]
    options = ToolCallOptions(check_schema=False)
    assert score_tool_calls([call("f", {"x": 1})], None, [{"f": {"x": [1]}}], tools, options) == (
        1.0,
        None,
    )


def test_a_label_function_missing_from_the_tools_is_checked_without_a_schema() -> None:
    calls = [call("get_time", {"zone": "UTC"})]
    assert score_tool_calls(calls, None, [{"get_time": {"zone": ["utc"]}}], [WEATHER]) == (
        1.0,
        None,
    )


def test_bfcl_variables_a_value_of_the_labels_type_passes_the_type_check() -> None:
    # BFCL's rule for variables: the schema says integer, the label holds a name; the value
    # is then compared as it is. The JSON schema still rejects it when it is checked.
    tools = [tool("f", {"n": {"type": "integer"}}, ["n"])]
    label = [{"f": {"n": ["count"]}}]
    rules_only = ToolCallOptions(check_schema=False)
    assert score_tool_calls([call("f", {"n": "count"})], None, label, tools, rules_only) == (
        1.0,
        None,
    )
    wrong = score_tool_calls([call("f", {"n": "Count"})], None, label, tools, rules_only)
    assert wrong == (0.0, "wrong_value")
    schema = score_tool_calls([call("f", {"n": "count"})], None, label, tools)
    assert schema == (0.0, "schema_violation")


def test_options_are_checked_and_picklable() -> None:
    options = ToolCallOptions(credit="partial", tags=("<call>", "</call>"), check_schema=False)
    assert pickle.loads(pickle.dumps(options)) == options
    with pytest.raises(ValueError, match="credit"):
        ToolCallOptions(credit="some")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tags"):
        ToolCallOptions(tags=("", "</call>"))
