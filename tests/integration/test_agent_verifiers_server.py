"""The agent verifiers served, in a real server process: ``verifier: tool_call`` gives every
case of the hand-written table (``tool_call_cases``) the score and reason it must get, as an
all-or-nothing and as a partial-credit entry, from calls sent as ``tool_calls`` or written
in the text; ``calls: trajectory`` reads the calls of every assistant turn after the last user
message; ``verifier: format`` checks the thinking and the answer tags; a math verifier reads
the answer after the thinking; a python function is handed ``tools`` and ``tool_calls`` when
it names them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.posting import score
from helpers.servers import serve
from tool_call_cases import CASES, PARIS, WEATHER, Case, call

FUNCTION = """
def count_calls(prompt, response, label, *, tools, tool_calls):
    return {"score": float(len(tool_calls or [])), "tools": float(len(tools or []))}
"""

#: Cases whose verifier options the served entries do not set (tags, check_schema).
SERVED = [case for case in CASES if not set(case.options) - {"credit"}]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("agent_verifiers")
    (folder / "agent_functions.py").write_text(FUNCTION, encoding="utf-8")
    entries: list[dict[str, Any]] = [
        {"name": "calls", "kind": "verifier", "verifier": "tool_call"},
        {"name": "partial", "kind": "verifier", "verifier": "tool_call", "credit": "partial"},
        {"name": "trajectory", "kind": "verifier", "verifier": "tool_call", "calls": "trajectory"},
        {
            "name": "shape",
            "kind": "verifier",
            "verifier": "format",
            "answer_tags": ["<answer>", "</answer>"],
        },
        {"name": "math", "kind": "verifier", "verifier": "math"},
        {
            "name": "counts",
            "kind": "verifier",
            "verifier": "python",
            "function": f"{folder / 'agent_functions.py'}:count_calls",
        },
    ]
    with serve(models=entries, folder=folder) as server:
        yield server.url


def conversation(case: Case) -> dict[str, Any]:
    response: dict[str, Any] = {"role": "assistant", "content": case.text}
    if case.calls:
        response["tool_calls"] = case.calls
    item: dict[str, Any] = {"messages": [{"role": "user", "content": "Do it."}, response]}
    if case.tools:
        item["tools"] = case.tools
    return item


@pytest.mark.parametrize("model", ["calls", "partial"])
def test_every_case_of_the_table_gets_its_verdict(url: str, model: str) -> None:
    body = score(
        url,
        model=model,
        conversations=[conversation(c) for c in SERVED],
        labels=[c.label for c in SERVED],
    )
    notes = (body.get("verifier_errors") or {}).get(model, [None] * len(SERVED))
    for case, got, note in zip(SERVED, body["scores"], notes, strict=True):
        want = case.partial_score if model == "partial" else float(case.valid)
        assert (got, note) == (pytest.approx(want), case.reason), case.name
    assert len(SERVED) >= 30
    assert body.get("masked") is None  # a wrong call is a score, not a failure


def test_an_unusable_label_is_an_item_error(url: str) -> None:
    body = score(
        url, model="calls", conversations=[conversation(SERVED[0])], labels=[{"not": "calls"}]
    )
    assert body["scores"] == [None] and body["masked"] == ["error"]


def test_the_trajectory_s_calls_after_the_last_user_message(url: str) -> None:
    first = {
        "role": "assistant",
        "content": None,
        "tool_calls": [call("get_weather", {"city": "Paris"})],
    }
    earlier = {
        "role": "assistant",
        "content": None,
        "tool_calls": [call("get_weather", {"city": "Rome"})],
    }
    trajectory = [
        {"role": "user", "content": "Rome?"},
        earlier,
        {"role": "tool", "content": "20C"},
        {"role": "user", "content": "And Paris?"},
        first,
        {"role": "tool", "content": "18C"},
        {"role": "assistant", "content": "18C in Paris."},
    ]
    labels = [[PARIS]] * 2
    items = [{"messages": trajectory, "tools": [WEATHER]}] * 2
    assert score(url, model="trajectory", conversations=items[:1], labels=labels[:1])["scores"] == [
        1.0
    ]
    # The response alone makes no call.
    body = score(url, model="calls", conversations=items[:1], labels=labels[:1])
    assert body["scores"] == [0.0] and body["verifier_errors"] == {"calls": ["no_call"]}


def test_format_checks_the_thinking_and_the_answer(url: str) -> None:
    responses = [
        "<think>ok</think><answer>42</answer>",
        "<answer>42</answer>",
        "<think>ok</think>42",
        "<think>never closed",
        "opened by the prompt</think>\n<answer>42</answer>",
    ]
    body = score(url, model="shape", queries=["q"] * 5, responses=responses)
    assert body["scores"] == [1.0, 0.0, 0.0, 0.0, 1.0]
    assert body["verifier_errors"]["shape"] == [
        None,
        "no_reasoning",
        "no_answer",
        "unclosed_reasoning",
        None,
    ]
    # reasoning_content (kept: format's default) is the thinking block in front.
    conv = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<answer>42</answer>", "reasoning_content": "ok"},
    ]
    assert score(url, model="shape", conversations=[conv])["scores"] == [1.0]


def test_math_reads_the_answer_after_the_thinking(url: str) -> None:
    responses = [
        "<think>maybe \\boxed{7}</think>So it is \\boxed{7}.",
        "<think>it is \\boxed{7}</think>I am not sure.",
        "<think>\\boxed{7} and then the tokens ran out",
    ]
    body = score(url, model="math", queries=["3 + 4?"] * 3, responses=responses, labels=["7"] * 3)
    assert body["scores"] == [1.0, 0.0, None]
    assert body["masked"] == [None, None, "unclosed_reasoning"]


def test_a_python_function_naming_tools_and_tool_calls_gets_them(url: str) -> None:
    calls = [call("get_weather", {"city": c}) for c in ("Paris", "Rome")]
    conv = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": calls},
    ]
    body = score(url, model="counts", conversations=[conv], tools=[WEATHER, WEATHER])
    assert body["scores"] == [2.0]
    assert body["objectives"]["tools"] == [2.0]
    assert json.loads(json.dumps(body["objectives"]))  # plain JSON numbers
