"""Agent trajectories and reasoning through a real ``reward-server``: tool calls, tool results,
tools and thinking reach tiny Llama reward models whose chat templates render them in three
families' styles (``chat_templates.TOOL_FAMILIES``), and every score equals an independent
computation: the test renders each item with the template itself (arguments as objects, the
thinking removed by hand) and runs one unpadded forward pass per item (the trajectories and
that reference are :mod:`agent_trajectories`, shared with the vLLM engine's
``tests/e2e/test_vllm_agents.py``).

Also: a template that cannot render tool calls is a 422 naming the model; the plain-text
rendering (``tool_rendering: text``) is the documented text; ``<think>x</think>answer``
scores as ``answer``; a block that never closes is masked with its reason; reasoning: keep
reaches the template's own reasoning_content rendering."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_trajectories import (
    TIME,
    WEATHER,
    by_hand,
    longer,
    parallel,
    reference,
    rendered,
    trajectories,
    trajectory,
    variants,
)
from chat_templates import TOOL_FAMILIES
from helpers.posting import post, scores
from helpers.servers import serve

import tiny_models

TOL = 1e-5
FAMILIES = tuple(TOOL_FAMILIES)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny Llama reward model per tool-use template, and one whose template renders
    roles and contents only (tiny_models.CHAT_TEMPLATE)."""
    root = tmp_path_factory.mktemp("agents")
    out = {
        name: longer(
            tiny_models.save_llama_reward_model(
                root / name, seed=3, chat_template=TOOL_FAMILIES[name].template
            )
        )
        for name in FAMILIES
    }
    out["plain"] = longer(tiny_models.save_llama_reward_model(root / "plain", seed=3))
    return out


@pytest.fixture(scope="module")
def server(folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    entries: list[dict[str, Any]] = [{"name": n, "model": str(folders[n])} for n in FAMILIES]
    entries += [
        {"name": "plain", "model": str(folders["plain"])},
        {"name": "plain_text", "model": str(folders["plain"]), "tool_rendering": "text"},
        {"name": "keeps", "model": str(folders["hermes"]), "reasoning": "keep"},
        {
            "name": "masks_zero",
            "model": str(folders["plain"]),
            "unclosed_reasoning": -1.0,
            "reasoning_tags": ["<reason>", "</reason>"],
        },
    ]
    folder = tmp_path_factory.mktemp("agents_models")
    with serve(None, "--max-wait-ms", "1", models=entries, folder=folder) as proc:
        yield proc.url


@pytest.mark.parametrize("family", FAMILIES)
def test_trajectories_equal_the_template_rendered_by_hand(
    server: str, folders: dict[str, Path], family: str
) -> None:
    convs = trajectories(family)
    got = scores(server, model=family, conversations=convs, tools=[WEATHER, TIME])
    want = reference(
        folders[family], rendered(folders[family], [by_hand(c) for c in convs], [WEATHER, TIME])
    )
    assert got == pytest.approx(want, abs=TOL)
    assert len(set(got)) == len(got)  # Paris and London differ in one argument only


@pytest.mark.parametrize("family", FAMILIES)
def test_one_argument_one_result_one_tool_each_change_the_score(server: str, family: str) -> None:
    got = scores(server, model=family, conversations=variants())
    assert len(set(got)) == len(got), got


def test_per_item_tools_win_over_the_request_s(server: str, folders: dict[str, Path]) -> None:
    conv = trajectory("Paris")
    got = scores(
        server,
        model="hermes",
        conversations=[{"messages": conv, "tools": [TIME]}, conv],
        tools=[WEATHER],
    )
    texts = rendered(folders["hermes"], [by_hand(conv)], [TIME])
    texts += rendered(folders["hermes"], [by_hand(conv)], [WEATHER])
    assert got == pytest.approx(reference(folders["hermes"], texts), abs=TOL)


def test_pairs_take_the_request_s_tools(server: str, folders: dict[str, Path]) -> None:
    got = scores(
        server, model="mistral", queries=["Weather?"], responses=["Sunny."], tools=[WEATHER]
    )
    conv = [{"role": "user", "content": "Weather?"}, {"role": "assistant", "content": "Sunny."}]
    want = reference(folders["mistral"], rendered(folders["mistral"], [conv], [WEATHER]))
    assert got == pytest.approx(want, abs=TOL)


def test_content_parts_are_joined(server: str) -> None:
    parts = trajectory("Paris")
    parts[1]["content"] = [
        {"type": "text", "text": "What is the weather "},
        {"type": "text", "text": "in Paris?"},
    ]
    assert scores(server, model="hermes", conversations=[parts]) == pytest.approx(
        scores(server, model="hermes", conversations=[trajectory("Paris")]), abs=TOL
    )


def test_a_template_that_refuses_a_conversation_is_a_422(server: str) -> None:
    body = post(server, "/score", {"model": "llama31", "conversations": [parallel()]}, status=422)
    assert body["type"] == "chat_template"
    assert "single tool-calls" in body["error"]


def test_a_template_without_tool_calls_is_a_422_naming_the_model(server: str) -> None:
    body = post(
        server, "/score", {"model": "plain", "conversations": [trajectory("Paris")]}, status=422
    )
    assert body["type"] == "unrenderable"
    assert "'plain'" in body["error"] and "tool calls" in body["error"]
    assert "tool_rendering: text" in body["error"]
    # Tools alone (no call) are refused too: they would be dropped.
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    body = post(
        server,
        "/score",
        {"model": "plain", "conversations": [conv], "tools": [WEATHER]},
        status=422,
    )
    assert "tool specs" in body["error"]
    # Without tool calls or tools, the same model scores as ever.
    assert (
        post(server, "/score", {"model": "plain", "conversations": [conv]})["scores"][0] is not None
    )


def test_the_plain_text_rendering_is_the_documented_text(
    server: str, folders: dict[str, Path]
) -> None:
    conv = parallel()
    got = scores(server, model="plain_text", conversations=[conv], tools=[WEATHER])
    tools = json.dumps(WEATHER)
    written = [
        {
            "role": "user",
            "content": f"# Tools\n\n<tools>\n{tools}\n</tools>\nWeather and time in Rome?",
        },
        {
            "role": "assistant",
            "content": "Checking.\n<tool_call>\n"
            '{"name": "get_weather", "arguments": {"city": "Rome", "unit": "C"}}\n'
            "</tool_call>\n<tool_call>\n"
            '{"name": "get_time", "arguments": {"city": "Rome"}}\n</tool_call>',
        },
        # Its template shows any role's content: tool results stay role tool (probed).
        {"role": "tool", "content": "21C"},
        {"role": "tool", "content": "14:05"},
        {"role": "assistant", "content": "21C at 14:05."},
    ]
    want = reference(folders["plain"], rendered(folders["plain"], [written]))
    assert got == pytest.approx(want, abs=TOL)


def test_thinking_scores_as_the_answer_alone(server: str) -> None:
    for model in ("hermes", "plain"):
        with_think = scores(
            server,
            model=model,
            queries=["q", "q", "q"],
            responses=["<think>x</think>answer", "reasoning first</think>answer", "answer"],
        )
        assert with_think[0] == with_think[2] and with_think[1] == with_think[2]
        conv = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "answer"}]
        thought = [conv[0], {**conv[1], "reasoning_content": "long thought"}]
        tagged = [conv[0], {**conv[1], "content": "<think>\nlong thought\n</think>\n\nanswer"}]
        got = scores(server, model=model, conversations=[conv, thought, tagged])
        assert got[0] == got[1] == got[2]


def test_tokens_count_what_was_scored(server: str) -> None:
    thought = "<think>" + "many words of thinking " * 40 + "</think>answer"
    body = post(
        server,
        "/score",
        {"model": "plain", "queries": ["q", "q"], "responses": [thought, "answer"]},
    )
    assert body["tokens"][0] == body["tokens"][1]


def test_unclosed_thinking_is_masked_with_its_reason(server: str) -> None:
    body = post(
        server,
        "/score",
        {"model": "plain", "queries": ["q", "q"], "responses": ["<think>ran out of tok", "fine"]},
    )
    assert body["scores"][0] is None and body["scores"][1] is not None
    assert body["masked"] == ["unclosed_reasoning", None]
    # An entry may give such an item a score instead, with its own tags.
    body = post(
        server,
        "/score",
        {"model": "masks_zero", "queries": ["q"], "responses": ["<reason>ran out of tok"]},
    )
    assert body["scores"] == [-1.0]
    assert body["verifier_errors"] == {"masks_zero": ["unclosed_reasoning"]}


def test_keep_reaches_the_template_s_reasoning_content(
    server: str, folders: dict[str, Path]
) -> None:
    conv = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "answer", "reasoning_content": "my thought"},
    ]
    got = scores(server, model="keeps", conversations=[conv])
    want = reference(folders["hermes"], rendered(folders["hermes"], [conv]))
    assert got == pytest.approx(want, abs=TOL)
    assert got != scores(server, model="hermes", conversations=[conv])


def test_malformed_messages_are_422_naming_the_field(server: str) -> None:
    bad = [
        ([{"role": "user", "content": None}], "content is required"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "content[0]"),
        ([{"role": "user", "content": "q", "tool_calls": []}], "only an assistant"),
        (
            [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 1}}]}],
            "arguments",
        ),
    ]
    for conv, said in bad:
        body = post(server, "/score", {"model": "hermes", "conversations": [conv]}, status=422)
        assert body["type"] == "invalid_request"
        assert said in body["error"], body["error"]


def test_a_remote_component_forwards_the_trajectory(server: str, tmp_path: Path) -> None:
    """A second server whose remote component is the first: tool calls, tool results, tools
    and kept reasoning arrive there as sent (its hermes model's own score comes back); a
    protocol that cannot carry them is a 422 naming the component."""
    entries = [
        {"name": "far", "kind": "remote", "url": server, "remote_model": "hermes"},
        {"name": "far_tei", "kind": "remote", "url": server, "protocol": "tei"},
    ]
    convs = [trajectory("Paris"), parallel()]
    with serve(models=entries, folder=tmp_path) as proc:
        got = scores(proc.url, model="far", conversations=convs, tools=[WEATHER])
        body = post(proc.url, "/score", {"model": "far_tei", "conversations": convs}, status=422)
    assert got == pytest.approx(
        scores(server, model="hermes", conversations=convs, tools=[WEATHER])
    )
    assert body["type"] == "unrenderable" and "'far_tei'" in body["error"]
