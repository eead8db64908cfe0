"""The format verifier (reward_server.verifiers.formats): the shapes a GRPO format reward
accepts and the reason for each it refuses."""

from __future__ import annotations

import pickle

import pytest

from reward_server.verifiers.formats import REASONS, FormatOptions, format_score

DEFAULT = FormatOptions()
TAGGED = FormatOptions(answer_tags=("<answer>", "</answer>"))
OPTIONAL = FormatOptions(require_reasoning=False)
BOXED = FormatOptions(pattern=r"\\boxed\{[^}]+\}")
TAGGED_NUMBER = FormatOptions(answer_tags=("<answer>", "</answer>"), pattern=r"^\s*-?\d+\s*$")
QWEN = "<think>\nThe user wants 2+2.\n</think>\n\n"

#: (name, response, options, reason): reason None means 1.0.
CASES: list[tuple[str, str, FormatOptions, str | None]] = [
    ("thinking_then_answer", QWEN + "4", DEFAULT, None),
    ("leading_whitespace", "\n <think>a</think>4", DEFAULT, None),
    ("opened_by_the_prompt", "The user wants 2+2.\n</think>\n\n4", DEFAULT, None),
    ("no_thinking", "4", DEFAULT, "no_reasoning"),
    ("no_thinking_allowed", "4", OPTIONAL, None),
    ("thinking_optional_but_given", QWEN + "4", OPTIONAL, None),
    ("thinking_optional_but_unclosed", "<think>2+2", OPTIONAL, "unclosed_reasoning"),
    ("unclosed", "<think>2+2 is", DEFAULT, "unclosed_reasoning"),
    ("two_blocks", "<think>a</think>4<think>b</think>4", DEFAULT, "several_reasoning_blocks"),
    ("nested", "<think>a<think>b</think>4", DEFAULT, "several_reasoning_blocks"),
    ("stray_close", "<think>a</think>4</think>", DEFAULT, "several_reasoning_blocks"),
    ("prompt_opened_then_unclosed", "a</think>4<think>b", DEFAULT, "several_reasoning_blocks"),
    ("answer_before_thinking", "4 <think>a</think>4", DEFAULT, "text_before_reasoning"),
    ("empty_thinking", "<think>\n\n</think>\n\n4", DEFAULT, "empty_reasoning"),
    ("empty_thinking_optional", "<think>\n\n</think>\n\n4", OPTIONAL, None),
    ("prompt_opened_empty", "\n</think>4", DEFAULT, "empty_reasoning"),
    ("nothing_after_thinking", "<think>a</think>\n", DEFAULT, "no_answer"),
    ("tagged", QWEN + "<answer>4</answer>", TAGGED, None),
    ("tagged_whitespace_around", QWEN + "\n<answer>\n4\n</answer>\n", TAGGED, None),
    ("tagged_missing", QWEN + "4", TAGGED, "no_answer"),
    ("tagged_empty", QWEN + "<answer> </answer>", TAGGED, "no_answer"),
    ("tagged_twice", QWEN + "<answer>4</answer><answer>5</answer>", TAGGED, "several_answers"),
    ("tagged_unclosed", QWEN + "<answer>4", TAGGED, "unclosed_answer"),
    ("tagged_closed_first", QWEN + "</answer>4<answer>", TAGGED, "unclosed_answer"),
    (
        "tagged_text_after",
        QWEN + "<answer>4</answer> hope this helps",
        TAGGED,
        "text_outside_answer",
    ),
    ("tagged_text_before", QWEN + "So: <answer>4</answer>", TAGGED, "text_outside_answer"),
    ("answer_tag_only_in_thinking", "<think><answer>4</answer></think>4", TAGGED, "no_answer"),
    ("pattern_found", QWEN + "So \\boxed{4}.", BOXED, None),
    ("pattern_only_in_thinking", "<think>\\boxed{4}</think>four", BOXED, "pattern_mismatch"),
    ("pattern_in_tagged_answer", QWEN + "<answer> 4 </answer>", TAGGED_NUMBER, None),
    (
        "pattern_not_in_tagged_answer",
        QWEN + "<answer>four</answer>",
        TAGGED_NUMBER,
        "pattern_mismatch",
    ),
    (
        "custom_reasoning_tags",
        "<reasoning>a</reasoning>4",
        FormatOptions(reasoning_tags=("<reasoning>", "</reasoning>")),
        None,
    ),
    (
        "other_tags_are_not_thinking",
        "<think>a</think>4",
        FormatOptions(reasoning_tags=("<reasoning>", "</reasoning>")),
        "no_reasoning",
    ),
]


@pytest.mark.parametrize(
    ("name", "response", "options", "reason"), CASES, ids=[c[0] for c in CASES]
)
def test_format_score(name: str, response: str, options: FormatOptions, reason: str | None) -> None:
    assert format_score(response, options) == ((1.0 if reason is None else 0.0), reason)


def test_every_reason_has_a_case() -> None:
    assert not set(REASONS) - {case[3] for case in CASES}


def test_default_options() -> None:
    assert format_score(QWEN + "4") == (1.0, None)
    assert format_score("4") == (0.0, "no_reasoning")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"reasoning_tags": ("<think>", "")}, "reasoning_tags"),
        ({"reasoning_tags": ("<t>", "<t>")}, "reasoning_tags"),
        ({"answer_tags": ("<answer>",)}, "answer_tags"),
        ({"pattern": "(unclosed"}, "not a regular expression"),
    ],
)
def test_options_are_checked(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FormatOptions(**fields)  # type: ignore[arg-type]


def test_options_are_picklable() -> None:
    options = FormatOptions(answer_tags=("<a>", "</a>"), require_reasoning=False, pattern="x")
    assert pickle.loads(pickle.dumps(options)) == options
