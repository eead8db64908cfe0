"""A judge sent agent trajectories and reasoning: its template reads the response's
``tool_calls``, the ``tools`` and the earlier ``messages``; a template that reads none of them
makes such a request a 422 (or, with ``tool_rendering: text``, gets them written into
``response`` and ``prompt``); the thinking is removed before it reads the response. Scores
are compared with an independent computation (test_judge's reference: plain Jinja, plain
transformers, one forward pass per item)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2
import pytest
from helpers.judges import ATOL, YES_NO, judge_entry, reference, save_judge

CALLS_TEMPLATE = (  # short: the tiny judges read 128 tokens at most
    "{% for t in tools %}{{ t.function.name }}{% endfor %}\n{{ prompt }}\n"
    "{% for c in tool_calls %}{{ c.function.arguments }}{% endfor %}\n{{ response }}\nYes?"
)
PLAIN_TEMPLATE = "Question: {{ prompt }}\nAnswer: {{ response }}\nGood? Reply Yes or No.\n"
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def calling(city: str, content: Any = None) -> list[dict[str, Any]]:
    arguments = json.dumps({"city": city})
    return [
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": content,
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": arguments}}
            ],
        },
    ]


def test_a_template_reading_tool_calls_and_tools_sees_them(
    judges: dict[str, Path],
    models_client: Any,
) -> None:
    folder = judges["llama"]
    client = models_client([judge_entry(folder, template=CALLS_TEMPLATE)])
    body = {"conversations": [calling("Paris"), calling("London")], "tools": [TOOL]}
    r = client.post("/score", json=body)
    assert r.status_code == 200, r.text
    template = jinja2.Template(CALLS_TEMPLATE)
    texts = [
        template.render(
            tools=[TOOL],
            prompt="Weather?",
            tool_calls=conv[-1]["tool_calls"],
            response="",
        )
        for conv in body["conversations"]
    ]
    scores = r.json()["scores"]
    assert scores == pytest.approx(reference(folder, texts, YES_NO), abs=ATOL)
    assert scores[0] != scores[1]


def test_a_template_reading_none_of_them_is_a_422_naming_the_judge(
    judges: dict[str, Path],
    models_client: Any,
) -> None:
    client = models_client([judge_entry(judges["llama"], template=PLAIN_TEMPLATE)])
    r = client.post("/score", json={"conversations": [calling("Paris")]})
    assert r.status_code == 422, r.text
    assert r.json()["type"] == "unrenderable"
    assert "'judge'" in r.json()["error"] and "tool calls" in r.json()["error"]
    # Earlier turns' tool results too, when the template does not read messages.
    conv = [
        *calling("Paris"),
        {"role": "tool", "content": "18C"},
        {"role": "assistant", "content": "18C"},
    ]
    r = client.post("/score", json={"conversations": [conv]})
    assert r.status_code == 422 and "earlier turns" in r.json()["error"]


def test_the_plain_text_rendering_writes_them_into_response_and_prompt(
    tmp_path: Path,
    models_client: Any,
) -> None:
    folder = save_judge(tmp_path / "wide", "llama", wide=True)  # 512 positions
    client = models_client([judge_entry(folder, template=PLAIN_TEMPLATE, tool_rendering="text")])
    conv = [
        *calling("Paris", content="Let me check."),
        {"role": "tool", "content": "18C"},
        {"role": "assistant", "content": "It is 18C."},
    ]
    r = client.post("/score", json={"conversations": [calling("Paris", "Let me check."), conv]})
    assert r.status_code == 200, r.text
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    template = jinja2.Template(PLAIN_TEMPLATE)
    texts = [
        template.render(prompt="Weather?", response=f"Let me check.\n{call}"),
        template.render(
            prompt=f"Weather?\n\nLet me check.\n{call}\n\n<tool_response>\n18C\n</tool_response>",
            response="It is 18C.",
        ),
    ]
    tokens = r.json()["tokens"]
    assert max(tokens) < 512  # nothing cut: every word of the written text counts
    assert r.json()["scores"] == pytest.approx(reference(folder, texts, YES_NO), abs=ATOL)


def test_the_judge_reads_the_answer_after_the_thinking(
    judges: dict[str, Path],
    models_client: Any,
) -> None:
    client = models_client([judge_entry(judges["gpt2"], template=PLAIN_TEMPLATE)])
    body = {
        "queries": ["2 + 2?"] * 3,
        "responses": ["<think>two and two</think>4", "4", "<think>never ends"],
    }
    r = client.post("/score", json=body)
    assert r.status_code == 200, r.text
    scores = r.json()["scores"]
    assert scores[0] == scores[1] and scores[2] is None
    assert r.json()["masked"] == [None, None, "unclosed_reasoning"]


def test_a_pairwise_judge_refuses_a_group_of_differing_trajectories(
    judges: dict[str, Path],
    models_client: Any,
) -> None:
    template = "{{ prompt }}\nA: {{ response_a }}\nB: {{ response_b }}\nA better?"
    entry = {
        "name": "pairs",
        "kind": "judge",
        "model": str(judges["gpt2"]),
        "mode": "pairwise",
        "template": template,
        "answer_tokens": ["Yes", "No"],
        "tool_rendering": "text",
    }
    client = models_client([entry])
    paris = [
        *calling("Paris"),
        {"role": "tool", "content": "18C"},
        {"role": "assistant", "content": "18C"},
    ]
    rome = [
        *calling("Rome"),
        {"role": "tool", "content": "20C"},
        {"role": "assistant", "content": "20C"},
    ]
    r = client.post("/score", json={"conversations": [paris, rome], "groups": [[0, 1]]})
    assert r.status_code == 422, r.text
    assert r.json()["type"] == "bad_groups" and "'pairs'" in r.json()["error"]
    # Final answers to one prompt compare as ever.
    plain = [{"role": "user", "content": "Weather?"}]
    answers = [[*plain, {"role": "assistant", "content": a}] for a in ("18C", "It is warm.")]
    r = client.post("/score", json={"conversations": answers, "groups": [[0, 1]]})
    assert r.status_code == 200, r.text
