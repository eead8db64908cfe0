"""Messages for the chat template (``reward_server.text.messages``) and reasoning removed
before scoring (``reward_server.text.reasoning``, ``scoring.items.without_reasoning``):
plain data, no model."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from reward_server.errors import UnrenderableError
from reward_server.scoring.items import (
    Conversations,
    Pairs,
    PolicyTexts,
    Sequences,
    Texts,
    tasks,
    without_reasoning,
)
from reward_server.text.messages import (
    Support,
    calls_as_text,
    features,
    for_template,
    parse_arguments,
    probe_support,
)
from reward_server.text.reasoning import answer

TAGS = ("<think>", "</think>")
ALL = Support(tool_calls=True, tool_results=True, tools=True, reasoning_content=True)
NONE = Support()
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def renderer(source: str) -> Any:
    env = ImmutableSandboxedEnvironment()
    env.filters["tojson"] = json.dumps
    template = env.from_string(source)
    return lambda messages, tools: template.render(messages=messages, tools=tools)


ROLES_ONLY = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
RAISES_ON_TOOL = (
    "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
    "{{ raise_exception('roles') }}{% endif %}{{ m.content }}{% endfor %}"
)
NAMES_ONLY = (
    "{% for m in messages %}{{ m.content }}{% for c in m.tool_calls or [] %}"
    "{{ c.function.name }}{% endfor %}{% endfor %}"
)
EVERYTHING = (
    "{% for t in tools or [] %}{{ t | tojson }}{% endfor %}"
    "{% for m in messages %}{{ m.role }}{{ m.reasoning_content or '' }}{{ m.content }}"
    "{% for c in m.tool_calls or [] %}{{ c.function.name }}{{ c.function.arguments | tojson }}"
    "{% endfor %}{% endfor %}"
)


@pytest.mark.parametrize(
    ("source", "support"),
    [
        (ROLES_ONLY, Support(tool_results=True)),
        # A template that raises on role tool does not render results (raise_exception is
        # undefined here: any failure counts as "does not render").
        (RAISES_ON_TOOL, NONE),
        # Names without arguments would score two calls that differ in an argument alike.
        (NAMES_ONLY, Support(tool_results=True)),
        (EVERYTHING, ALL),
    ],
)
def test_probe_finds_what_a_template_shows(source: str, support: Support) -> None:
    assert probe_support(renderer(source)) == support


def test_arguments_become_objects_and_content_never_none() -> None:
    conv = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
                {"id": "2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
                {"id": "3", "type": "function", "function": {"name": "h", "arguments": "[1]"}},
            ],
            "extra_key": "kept",
        },
    ]
    messages, tools = for_template(
        conv, [TOOL], support=ALL, rendering="template", reasoning_tags=TAGS
    )
    calls = messages[1]["tool_calls"]
    assert [c["function"]["arguments"] for c in calls] == [{"a": 1}, "not json", "[1]"]
    assert messages[1]["content"] == "" and messages[1]["extra_key"] == "kept"
    assert tools == [TOOL]
    assert conv[1]["content"] is None  # the input is not changed


def test_what_the_template_cannot_show_is_refused_naming_it() -> None:
    conv = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f"}}]},
    ]
    with pytest.raises(UnrenderableError, match="tool calls"):
        for_template(conv, None, support=NONE, rendering="template", reasoning_tags=TAGS)
    with pytest.raises(UnrenderableError, match="tool specs"):
        for_template(conv[:1], [TOOL], support=NONE, rendering="template", reasoning_tags=TAGS)


def test_the_plain_text_rendering() -> None:
    conv = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "Calling.",
            "tool_calls": [{"function": {"name": "f", "arguments": '{"a": 1}'}}],
        },
        {"role": "tool", "content": "r1"},
        {"role": "tool", "content": "r2"},
        {"role": "assistant", "content": "done", "reasoning_content": "kept thought"},
    ]
    messages, tools = for_template(
        conv, [TOOL], support=NONE, rendering="text", reasoning_tags=TAGS
    )
    assert tools is None
    assert messages == [
        {"role": "system", "content": f"# Tools\n\n<tools>\n{json.dumps(TOOL)}\n</tools>\nsys"},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": 'Calling.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
        },
        {
            "role": "user",
            "content": "<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response>",
        },
        # Kept reasoning the template does not show is written into the content, tagged.
        {"role": "assistant", "content": "<think>kept thought</think>done"},
    ]
    assert calls_as_text([{"function": {"name": "g", "arguments": {}}}]) == (
        '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>'
    )


def test_features_and_arguments() -> None:
    conv = [{"role": "tool", "content": "x"}, {"role": "assistant", "reasoning_content": "t"}]
    assert features(conv, [TOOL]) == {"tools", "tool_results", "reasoning_content"}
    assert features(conv[:1], []) == {"tool_results"}
    assert parse_arguments({"a": 1}) == {"a": 1}
    assert parse_arguments('{"a": [1]}') == {"a": [1]}
    assert parse_arguments("{bad") == "{bad"


@pytest.mark.parametrize(
    ("text", "response", "expected", "unclosed"),
    [
        ("<think>x</think>answer", True, "answer", False),
        ("<think>\nx\n</think>\n\nanswer", True, "answer", False),
        ("opened by the prompt</think>\nanswer", True, "answer", False),
        ("opened by the prompt</think>answer", False, "opened by the prompt</think>answer", False),
        ("a<think>x</think>b<think>y</think> c", True, "abc", False),
        ("<think>ran out", True, "", True),
        ("before <think>ran out", False, "before ", True),
        ("no thinking", True, "no thinking", False),
    ],
)
def test_answer_rules(text: str, response: bool, expected: str, unclosed: bool) -> None:
    found = answer(text, TAGS, response=response)
    assert (found.text, found.unclosed) == (expected, unclosed)


def test_without_reasoning_on_every_shape() -> None:
    pairs, cut = without_reasoning(Pairs(("q", "q"), ("<think>x</think>a", "<think>x")), TAGS)
    assert isinstance(pairs, Pairs) and pairs.responses == ("a", "") and cut == [False, True]
    texts, cut = without_reasoning(Texts(("p<think>x</think>a",)), TAGS)
    assert isinstance(texts, Texts) and texts.texts == ("pa",) and cut == [False]
    conv = (
        [
            {"role": "user", "content": "<think>user text is not touched</think>"},
            {"role": "assistant", "content": "<think>early</think>one", "reasoning_content": "r"},
            {"role": "assistant", "content": "<think>late"},
        ],
    )
    convs, cut = without_reasoning(Conversations(conv), TAGS)
    assert isinstance(convs, Conversations)
    assert [m["content"] for m in convs.conversations[0]] == [
        "<think>user text is not touched</think>",
        "one",
        "",
    ]
    assert "reasoning_content" not in convs.conversations[0][1] and cut == [True]
    policy, cut = without_reasoning(
        PolicyTexts(("P: q\nA: <think>t</think>a",), prompts=("P: q\nA: ",)), TAGS
    )
    assert isinstance(policy, PolicyTexts) and policy.texts == ("P: q\nA: a",)
    # A generation prompt that opened the thinking loses its opening tag.
    policy, _ = without_reasoning(
        PolicyTexts(("A: <think>\nt</think>a",), prompts=("A: <think>\n",)), TAGS
    )
    assert isinstance(policy, PolicyTexts) and policy.texts == ("A: a",)
    seqs, cut = without_reasoning(Sequences((("q", "<think>t</think>r"), ("<think>t",))), TAGS)
    assert isinstance(seqs, Sequences) and seqs.sequences == (("q", "r"), ("",))
    assert cut == [False, True]


def test_a_verifier_reads_the_answer_and_the_calls() -> None:
    conv = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}],
        },
    ]
    (task,) = tasks(Conversations((conv,), labels=("l",), tools=([TOOL],)), None)
    assert task.response == "" and task.label == "l" and task.tools == [TOOL]
    assert task.tool_calls == [{"function": {"name": "f", "arguments": "{}"}}]


def test_agent_trajectories_group_by_the_task_they_answer() -> None:
    from pydantic import ValidationError

    from reward_server.http.schemas import ScoreRequest

    def run(city: str, question: str = "Weather?") -> list[dict[str, Any]]:
        calling = {"function": {"name": "get_weather", "arguments": {"city": city}}}
        return [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": question},
            {"role": "assistant", "content": None, "tool_calls": [calling]},
            {"role": "tool", "content": "18C"},
            {"role": "assistant", "content": f"18C in {city}."},
        ]

    # Two rollouts of one task: their own calls and results differ, their prompt does not.
    body = {"conversations": [run("Paris"), run("Rome")], "groups": [[0, 1]]}
    assert ScoreRequest.model_validate(body).groups == [[0, 1]]
    other = {"conversations": [run("Paris"), run("Rome", "Time?")], "groups": [[0, 1]]}
    with pytest.raises(ValidationError, match="prompt differs"):
        ScoreRequest.model_validate(other)
