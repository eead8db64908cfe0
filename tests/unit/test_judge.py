"""LLM judges, ``kind: judge`` in ``mode: logprobs`` on the transformers engine (issue 21,
part 3).

A tiny random causal LM (GPT-2 without BOS, Llama with a BOS its tokenizer adds) with a chat
template, whose vocabulary holds the score tokens, is served as a judge; every score is
compared with an independent computation: the same folder loaded with plain transformers,
the template rendered with plain Jinja and the chat template with the generation prompt,
one unpadded forward pass per item, a softmax over the score tokens' logits and the expected
value. Items of different lengths share a request (padding must not move a score), as pairs,
conversations and texts, with and without labels.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
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
)
from helpers.models_files import write_models
from helpers.posting import assert_error

from reward_server import cli
from reward_server.config.models_file import ModelsFileError, parse_models_file
from reward_server.errors import ChatTemplateError, ModelLoadError
from reward_server.scoring.items import Conversations, Pairs, Texts, judge_prompts
from reward_server.text.judge_prompt import JudgePrompt, JudgeTemplate

FIVE = {str(i): float(i) for i in range(1, 6)}  # single bytes: one token each


# --------------------------------------------------------------------------- equal to transformers


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_scores_equal_transformers_for_pairs_conversations_and_texts(
    family: str, judges: dict[str, Path], models_client: Any
) -> None:
    folder = judges[family]
    client = models_client([judge_entry(folder)])
    pairs = client.post(
        "/score", json={"queries": QUERIES, "responses": RESPONSES, "labels": LABELS}
    )
    convs = client.post("/score", json={"conversations": CONVERSATIONS})
    texts = client.post("/score", json={"texts": TEXTS, "labels": [None, {"a": [1, 2]}, 3]})
    for r in (pairs, convs, texts):
        assert r.status_code == 200, r.text
    want_pairs = reference(folder, contents(QUERIES, RESPONSES, LABELS), YES_NO)
    # A conversation's prompt: its messages before the response, contents joined by a blank line.
    prompts = ["Be brief.\n\nhello", "What is 3 + 4?"]
    responses = [conv[-1]["content"] for conv in CONVERSATIONS]
    want_convs = reference(folder, contents(prompts, responses, [None, None]), YES_NO)
    # A text has no prompt; a label that is not a string is printed as JSON.
    labels = [None, '{"a": [1, 2]}', 3]
    want_texts = reference(folder, contents([""] * 3, TEXTS, labels), YES_NO)
    assert pairs.json()["scores"] == pytest.approx(want_pairs, abs=ATOL)
    assert convs.json()["scores"] == pytest.approx(want_convs, abs=ATOL)
    assert texts.json()["scores"] == pytest.approx(want_texts, abs=ATOL)
    everything = want_pairs + want_convs + want_texts
    assert max(everything) - min(everything) > 0.05, everything  # the check can tell them apart
    # Alone, each item scores what it scored beside the others.
    alone = client.post("/score", json={"queries": QUERIES[1:2], "responses": RESPONSES[1:2]})
    want_alone = reference(folder, contents(QUERIES[1:2], RESPONSES[1:2], [None]), YES_NO)
    assert alone.json()["scores"] == pytest.approx(want_alone, abs=ATOL)
    tokens = pairs.json()["tokens"]
    assert len(set(tokens)) == 3, tokens  # three lengths padded into one pass


def test_several_score_tokens_without_a_chat_template(
    judges: dict[str, Path], models_client: Any
) -> None:
    """A 1..5 scale; ``chat_template: none``: the rendered template is the prompt as it is."""
    folder = judges["gpt2"]
    client = models_client([judge_entry(folder, score_tokens=FIVE, chat_template="none")])
    r = client.post("/score", json={"queries": QUERIES, "responses": RESPONSES})
    assert r.status_code == 200, r.text
    want = reference(folder, contents(QUERIES, RESPONSES, [None] * 3), FIVE, chat=False)
    assert r.json()["scores"] == pytest.approx(want, abs=ATOL)
    assert all(1.0 < s < 5.0 for s in r.json()["scores"])


def test_long_prompts_are_cut_on_the_left_or_refused(
    judges: dict[str, Path], models_client: Any
) -> None:
    folder = judges["llama"]
    client = models_client([judge_entry(folder, max_length=48)])
    body = {"queries": QUERIES, "responses": RESPONSES}
    r = client.post("/score", json=body)
    assert r.status_code == 200, r.text
    want = reference(folder, contents(QUERIES, RESPONSES, [None] * 3), YES_NO, max_length=48)
    assert r.json()["scores"] == pytest.approx(want, abs=ATOL)
    assert len(set(want)) == 3, want
    assert r.json()["truncated"] == [True] * 3 and r.json()["tokens"] == [48] * 3
    assert_error(client.post("/score", json={**body, "truncate": False}), 413, "text_too_long")


def test_info_lists_the_judge(judges: dict[str, Path], models_client: Any) -> None:
    client = models_client([judge_entry(judges["gpt2"], weight=0.5)])
    (entry,) = client.get("/info").json()["models"]
    assert entry["name"] == "judge" and entry["kind"] == "judge" and entry["weight"] == 0.5
    assert entry["mode"] == "logprobs" and entry["score_tokens"] == YES_NO
    assert entry["template"] == TEMPLATE and entry["model"] == str(judges["gpt2"])
    assert entry["labels"] == ["score"] and entry["dtype"] == "float32"


def test_a_template_that_fails_on_an_item_is_a_422(
    judges: dict[str, Path], models_client: Any
) -> None:
    client = models_client([judge_entry(judges["gpt2"], template="Is {{ label.answer }} right?")])
    ok = client.post("/score", json={"texts": ["x"], "labels": [{"answer": "4"}]})
    assert ok.status_code == 200, ok.text
    body = assert_error(client.post("/score", json={"texts": ["x"]}), 422, "chat_template")
    assert "judge template of 'judge' failed on item 0" in body["error"]


# --------------------------------------------------------------------------- refused at start


def _start_line(path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any, status: int = 1) -> str:
    """The one error line of ``reward-server --models path`` (run in process), which exits
    with ``status`` (2: the command line's models file is refused before anything loads)."""
    monkeypatch.setattr(cli, "_configure_logging", lambda level: None)  # pytest owns logging
    try:
        code = cli.main(["--models", str(path), "--port", "1", "--log-level", "warning"])
    except SystemExit as exc:
        code = exc.code
    assert code == status
    stderr = capsys.readouterr().err
    lines = [ln for ln in stderr.splitlines() if ln.startswith("reward-server: error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_a_score_token_of_several_tokens_is_refused_at_start(
    judges: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    tokens = {"Yes": 1.0, "Maybe so": 0.5, "No": 0.0}
    path = write_models(tmp_path, [judge_entry(judges["gpt2"], score_tokens=tokens)])
    line = _start_line(path, monkeypatch, capsys)
    assert "model 'judge'" in line and "score token 'Maybe so' is" in line, line
    assert "exactly one token" in line


def test_generate_mode_without_a_pattern_is_refused_at_start(
    judges: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """(mode: generate itself: tests/e2e/test_judge_generate.py)"""
    entry = {k: v for k, v in judge_entry(judges["gpt2"], mode="generate").items()}
    del entry["score_tokens"]
    line = _start_line(write_models(tmp_path, [entry]), monkeypatch, capsys, status=2)
    assert "models[0]: mode: generate needs 'score_pattern'" in line, line


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"template": None}, "kind: judge needs 'template'"),
        ({"score_tokens": None}, "kind: judge needs 'score_tokens'"),
        ({"score_tokens": {"Yes": 1.0}}, "score_tokens: Dictionary should have at least 2"),
        ({"score_tokens": {"Yes": 1.0, "No": float("nan")}}, "must be finite numbers (No)"),
        ({"mode": "vote"}, "mode: Input should be 'logprobs', 'generate', 'pairwise' or 'rubric'"),
        ({"label_index": 1}, "label_index: only for kind: sequence or process"),
        ({"adapter": "/a"}, "adapter: only for kind: sequence or process"),
        (
            {"kind": "sequence"},
            "template: only for kind: judge or remote; score_tokens: only for kind: judge",
        ),
        ({"model": None}, "'model' is required"),
    ],
)
def test_judge_keys_are_validated(entry: dict[str, Any], message: str) -> None:
    spec = {**judge_entry(Path("/m")), **entry}
    spec = {k: v for k, v in spec.items() if v is not None}
    with pytest.raises(ModelsFileError) as err:
        parse_models_file({"models": [spec]})
    assert message in str(err.value)


def test_a_judge_of_another_kind_of_model_or_template_does_not_load(
    judges: dict[str, Path], gpt2_rm: Path, tmp_path: Path, models_client: Any
) -> None:
    with pytest.raises(ModelLoadError, match="is not a causal language model"):
        models_client([judge_entry(gpt2_rm)])
    with pytest.raises(ModelLoadError, match=r"uses answer; it knows prompt, response"):
        models_client([judge_entry(judges["gpt2"], template="{{ answer }}")])
    missing = tmp_path / "gone.jinja"
    with pytest.raises(ModelLoadError, match="cannot read judge template"):
        models_client([judge_entry(judges["gpt2"], template=str(missing))])


# --------------------------------------------------------------------------- the template's view


def test_what_the_template_reads_of_each_shape() -> None:
    pairs = judge_prompts(Pairs(("q",), ("r",), ({"x": 1},)))
    assert pairs == [JudgePrompt("q", "r", {"x": 1}, [{"role": "user", "content": "q"}])]
    (conv,) = judge_prompts(Conversations((CONVERSATIONS[0],)))
    assert (conv.prompt, conv.response, conv.label) == ("Be brief.\n\nhello", "hello world", None)
    assert conv.messages == CONVERSATIONS[0][:2]
    assert judge_prompts(Texts(("t",))) == [JudgePrompt("", "t")]
    template = JudgeTemplate("{{ prompt }}|{{ response }}|{{ label }}|{{ messages | length }}", "j")
    more = [JudgePrompt("", "t", [1, "a"]), JudgePrompt("", "t", True), JudgePrompt("", "t", 2.5)]
    printed = template.render([*pairs, conv, *more])
    assert printed == [
        'q|r|{"x": 1}|1',
        "Be brief.\n\nhello|hello world||2",
        '|t|[1, "a"]|0',
        "|t|true|0",
        "|t|2.5|0",
    ]
    with pytest.raises(ChatTemplateError):
        JudgeTemplate("{{ label.x }}", "j").render([JudgePrompt("", "t", "a string")])


def test_a_template_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "judge.jinja"
    path.write_text("Q: {{ prompt }}\n", encoding="utf-8")
    template = JudgeTemplate.from_setting(str(path), "j")
    assert template.render([JudgePrompt("hi", "r")]) == ["Q: hi"]


# --------------------------------------------------------------------------- with other kinds


def test_the_judge_logs_what_it_loaded(
    judges: dict[str, Path], models_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="reward_server"):
        models_client([judge_entry(judges["gpt2"])])
    assert any("loaded judge" in rec.getMessage() for rec in caplog.records)
