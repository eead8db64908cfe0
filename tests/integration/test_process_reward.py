"""Process reward models: steps of a response, the token each step is read at, step scores
against the model run directly, aggregates, truncation and batch invariance."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModel, AutoModelForTokenClassification, AutoTokenizer

import tiny_models
from reward_server.config import LoadOptions
from reward_server.engines import load_process_scorer
from reward_server.engines._process_reward import ProcessRewardModel, _auto_class, load
from reward_server.errors import (
    ModelLoadError,
    ResponseNotFoundError,
    StepsTruncatedError,
    TextTooLongError,
)
from reward_server.text.steps import (
    STEP_AGGREGATES,
    StepOptions,
    aggregate_steps,
    split_steps,
    step_results,
    tagged_response,
)

TAG = tiny_models.STEP_TAG
#: A chat template that trims the content, as Llama 3's does.
TRIM_TEMPLATE = tiny_models.CHAT_TEMPLATE.replace("message['content']", "message['content'] | trim")
UPPER_TEMPLATE = tiny_models.CHAT_TEMPLATE.replace(
    "message['content']", "message['content'] | upper"
)

#: (response, step ends): ASCII, multi-byte characters (2-byte, CJK, a 4-byte emoji), no
#: separator, empty, separators at both ends and doubled.
RESPONSES = [
    ("the plot was good\n\nthe actor was bad\n\nso i liked it", [19, 38, 51]),
    ("é\n\n日本\n\n🙂", [3, 7, 8]),
    ("a film with no separator", [24]),
    ("", [0]),
    ("\n\nthe end\n\n\n\nagain\n\n", [13, 20]),
    ("\n\n", [2]),
]
QUERY = "what did you think of the movie? "


def cpu_options(model: str, **kwargs: object) -> LoadOptions:
    """Load options on the CPU in float32 (the references below run there)."""
    return LoadOptions(model=model, device="cpu", **kwargs)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def prm_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny GPT-2 token classifier, two labels, byte-level BPE with the step tag."""
    return tiny_models.save_process_reward_model(tmp_path_factory.mktemp("prm"))


@pytest.fixture(scope="module")
def chat_prm_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same with a Zephyr-style chat template."""
    return tiny_models.save_process_reward_model(
        tmp_path_factory.mktemp("chat_prm"), chat_template=tiny_models.CHAT_TEMPLATE
    )


@pytest.fixture(scope="module")
def bert_prm_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT token classifier: WordPiece tokens never cover white space."""
    return tiny_models.save_process_reward_model(tmp_path_factory.mktemp("bert_prm"), arch="bert")


@pytest.fixture(scope="module")
def prm(prm_path: Path) -> ProcessRewardModel:
    return load(cpu_options(str(prm_path)))


@pytest.fixture(scope="module")
def tagged_prm(prm_path: Path) -> ProcessRewardModel:
    return load(cpu_options(str(prm_path)), StepOptions(tag=TAG))


# ---------------------------------------------------------------------- the reference


@functools.cache
def _reference_model(path: Path) -> AutoModelForTokenClassification:
    return AutoModelForTokenClassification.from_pretrained(path).eval()


def reference_scores(path: Path, ids: list[int]) -> list[float]:
    """Every token's step score, from the model run directly on one row."""
    with torch.no_grad():
        logits = _reference_model(path)(input_ids=torch.tensor([ids])).logits[0].float()
    if logits.shape[-1] == 2:
        return logits.softmax(-1)[:, 1].tolist()
    return logits[:, 0].tolist()


def tokens_with_offsets(path: Path, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    enc = AutoTokenizer.from_pretrained(path)(text, return_offsets_mapping=True)
    return enc["input_ids"], enc["offset_mapping"]


def token_holding(offsets: list[tuple[int, int]], char: int) -> int:
    """The last token whose span holds character ``char``."""
    return max(i for i, (start, end) in enumerate(offsets) if start <= char < end)


# ---------------------------------------------------------------------- text only


@pytest.mark.parametrize(("response", "ends"), RESPONSES)
def test_split_steps_ends_are_code_point_offsets(response: str, ends: list[int]) -> None:
    steps = split_steps(response)
    assert [s.end for s in steps] == ends
    # The steps cover the response, each with the separators that follow it.
    assert "".join(response[s.start : s.end] for s in steps) == response


def test_split_steps_custom_separator_and_contents() -> None:
    steps = split_steps("a. b. c", ". ")
    assert [s.end for s in steps] == [3, 6, 7]
    assert [("a. b. c")[s.start : s.content_end] for s in steps] == ["a", "b", "c"]


def test_tagged_response_replaces_separators_with_the_tag() -> None:
    response = "one\n\ntwo\n\n\n\nthree"
    text, ends = tagged_response(response, split_steps(response), "<t>")
    assert text == "one<t>two<t>three<t>"
    assert [text[:e] for e in ends] == ["one<t>", "one<t>two<t>", text]
    assert tagged_response("", split_steps(""), "<t>") == ("<t>", [3])


def test_every_step_aggregate() -> None:
    scores = [0.5, 0.2, 0.8]
    expected = {"min": 0.2, "mean": 0.5, "last": 0.8, "prod": 0.5 * 0.2 * 0.8}
    assert set(expected) == set(STEP_AGGREGATES)
    for how, value in expected.items():
        assert aggregate_steps(scores, how) == pytest.approx(value, abs=1e-12)
    with pytest.raises(ValueError, match="no step scores"):
        aggregate_steps([], "min")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"separator": ""}, "step_separator"),
        ({"tag": ""}, "step_tag"),
        ({"aggregate": "max"}, "step_aggregate must be one of min, mean, last, prod"),
    ],
)
def test_step_options_are_checked(kwargs: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StepOptions(**kwargs)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- step scores


def test_step_scores_at_the_last_token_of_each_step(
    prm: ProcessRewardModel, prm_path: Path
) -> None:
    responses = [r for r, _ in RESPONSES]
    items = prm.rendering.encode_pairs([QUERY] * len(responses), responses, truncate=True)
    results = prm.score_steps(items)
    for (response, ends), item, result in zip(RESPONSES, items, results, strict=True):
        ids, offsets = tokens_with_offsets(prm_path, QUERY + response)
        assert item.encoded.input_ids == ids
        # The step's last character; an empty response is read at the query's last token.
        expected = [token_holding(offsets, len(QUERY) + end - 1) for end in ends]
        assert item.positions == expected, response
        reference = reference_scores(prm_path, ids)
        assert result.step_ends == ends
        assert result.step_scores == pytest.approx([reference[p] for p in expected], abs=1e-5)
        assert result.score == pytest.approx(min(result.step_scores), abs=1e-12)
        assert result.steps_dropped == 0 and not item.encoded.truncated


def test_a_multi_byte_character_is_read_at_its_last_byte_token(prm: ProcessRewardModel) -> None:
    # "日" is three bytes the BPE never merged: three tokens with the character's span.
    item = prm.rendering.encode_pairs(["q "], ["日\n\n日"], truncate=True)[0]
    assert item.step_ends == [3, 4]
    assert item.positions == [len(item.encoded.input_ids) - 4, len(item.encoded.input_ids) - 1]


def test_step_scores_at_the_step_tags(tagged_prm: ProcessRewardModel, prm_path: Path) -> None:
    responses = [r for r, _ in RESPONSES]
    items = tagged_prm.rendering.encode_pairs([QUERY] * len(responses), responses, truncate=True)
    results = tagged_prm.score_steps(items)
    tag_id = AutoTokenizer.from_pretrained(prm_path).convert_tokens_to_ids(TAG)
    for (response, ends), item, result in zip(RESPONSES, items, results, strict=True):
        steps = split_steps(response)
        shown = "".join(response[s.start : s.content_end] + TAG for s in steps)
        ids, _ = tokens_with_offsets(prm_path, QUERY + shown)
        assert item.encoded.input_ids == ids
        expected = [i for i, t in enumerate(ids) if t == tag_id]
        assert item.positions == expected and len(expected) == len(ends)
        reference = reference_scores(prm_path, ids)
        assert result.step_ends == ends
        assert result.step_scores == pytest.approx([reference[p] for p in expected], abs=1e-5)


def test_a_tag_inside_the_query_or_response_text_is_not_a_step(
    tagged_prm: ProcessRewardModel,
) -> None:
    item = tagged_prm.rendering.encode_pairs([f"q {TAG} "], [f"a {TAG} b\n\nc"], truncate=True)[0]
    assert item.step_ends == [15, 16]
    assert len(item.positions) == 2
    ids = item.encoded.input_ids
    # Read at the tag after each step: the last token, and the tag before "c".
    assert item.positions[-1] == len(ids) - 1
    assert ids[item.positions[0] + 1 :] == ids[-2:]  # "c" then the last tag


def test_one_label_gives_the_raw_logit(tmp_path: Path) -> None:
    path = tiny_models.save_process_reward_model(tmp_path, num_labels=1)
    model = load(cpu_options(str(path)))
    assert model.num_labels == 1
    item = model.rendering.encode_pairs(["q "], ["a\n\nb"], truncate=True)[0]
    result = model.score_steps([item])[0]
    reference = reference_scores(path, item.encoded.input_ids)
    assert result.step_scores == pytest.approx([reference[p] for p in item.positions], abs=1e-5)
    assert any(not 0.0 <= s <= 1.0 for s in reference)  # logits, not probabilities


def test_every_step_aggregate_on_the_model(prm_path: Path, prm: ProcessRewardModel) -> None:
    item = prm.rendering.encode_pairs(["q "], ["one\n\ntwo\n\nthree\n\nfour"], truncate=True)[0]
    rows = prm.token_scores([item.encoded.input_ids])
    steps = step_results(rows, [item], "min")[0].step_scores
    assert len(steps) == 4
    expected = {
        "min": min(steps),
        "mean": sum(steps) / 4,
        "last": steps[-1],
        "prod": math.prod(steps),
    }
    for how, value in expected.items():
        assert step_results(rows, [item], how)[0].score == pytest.approx(value, abs=1e-12)
        loaded = load(cpu_options(str(prm_path)), StepOptions(aggregate=how))
        assert loaded.score_steps([item])[0].score == pytest.approx(value, abs=1e-6)


def test_wordpiece_reads_the_last_token_before_uncovered_white_space(bert_prm_path: Path) -> None:
    model = load(cpu_options(str(bert_prm_path)))
    response = "the film\n\nwas good \n\n"
    item = model.rendering.encode_pairs(["a movie "], [response], truncate=True)[0]
    assert item.step_ends == [10, 21]
    ids, offsets = tokens_with_offsets(bert_prm_path, "a movie " + response)
    assert item.encoded.input_ids == ids  # [CLS] ... [SEP]
    # The last token that ends within each step: "film", then "good".
    expected = [
        max(i for i, (s, e) in enumerate(offsets) if e > s and e <= len("a movie ") + end)
        for end in (10, 21)
    ]
    assert item.positions == expected
    reference = reference_scores(bert_prm_path, ids)
    result = model.score_steps([item])[0]
    assert result.step_scores == pytest.approx([reference[p] for p in expected], abs=1e-5)


# ---------------------------------------------------------------------- chat templates


def conversation(response: str) -> list[dict[str, str]]:
    return [
        {"role": "user", "content": "rate the film"},
        {"role": "assistant", "content": response},
    ]


def test_conversations_with_the_chat_template(chat_prm_path: Path) -> None:
    model = load(cpu_options(str(chat_prm_path)))
    response = "it was good\n\nreally é"
    item = model.rendering.encode_conversations([conversation(response)], truncate=True)[0]
    text = "<|user|>\nrate the film</s>\n<|assistant|>\n" + response + "</s>\n"
    ids, offsets = tokens_with_offsets(chat_prm_path, text)
    assert item.encoded.input_ids == ids
    at = text.index(response)
    assert item.positions == [token_holding(offsets, at + end - 1) for end in (13, 21)]
    # Pairs render the same way.
    pair = model.rendering.encode_pairs(["rate the film"], [response], truncate=True)[0]
    assert pair == item


def test_a_trimming_template_is_followed(chat_prm_path: Path, tmp_path: Path) -> None:
    template = tmp_path / "trim.jinja"
    template.write_text(TRIM_TEMPLATE)
    model = load(cpu_options(str(chat_prm_path), chat_template=str(template)))
    response = "  first step\n\nsecond step\n\n"
    item = model.rendering.encode_conversations([conversation(response)], truncate=True)[0]
    assert item.step_ends == [14, 27]
    text = "<|user|>\nrate the film</s>\n<|assistant|>\nfirst step\n\nsecond step</s>\n"
    ids, offsets = tokens_with_offsets(chat_prm_path, text)
    assert item.encoded.input_ids == ids
    at = text.index("first")
    # Step one ends after its separator; step two's separator was trimmed: its last token.
    assert item.positions == [token_holding(offsets, at + 11), token_holding(offsets, at + 22)]


def test_a_template_that_changes_the_response_is_an_error(
    chat_prm_path: Path, tmp_path: Path
) -> None:
    template = tmp_path / "upper.jinja"
    template.write_text(UPPER_TEMPLATE)
    model = load(cpu_options(str(chat_prm_path), chat_template=str(template)))
    with pytest.raises(ResponseNotFoundError, match="item 0: the chat template changes"):
        model.rendering.encode_conversations([conversation("fine\n\nok")], truncate=True)


def test_the_last_message_must_be_the_assistants(chat_prm_path: Path) -> None:
    model = load(cpu_options(str(chat_prm_path)))
    conv = [*conversation("fine"), {"role": "user", "content": "and?"}]
    with pytest.raises(ResponseNotFoundError, match=r"conversation 0: .* not 'user'"):
        model.rendering.encode_conversations([conv], truncate=True)


# ---------------------------------------------------------------------- truncation


LONG = "\n\n".join(f"step {word} was good" for word in ("one", "two", "three", "four", "five"))


@pytest.mark.parametrize("side", ["left", "right"])
def test_truncation_drops_and_counts_steps(prm_path: Path, side: str) -> None:
    full = load(cpu_options(str(prm_path))).rendering.encode_pairs(["q "], [LONG], truncate=True)[0]
    n = len(full.encoded.input_ids)
    limit = n - 20
    model = load(cpu_options(str(prm_path), max_length=limit, truncation_side=side))
    item = model.rendering.encode_pairs(["q "], [LONG], truncate=True)[0]
    assert item.encoded.truncated and item.encoded.num_tokens == limit
    assert 0 < item.steps_dropped < 5
    assert item.steps_dropped + len(item.step_ends) == 5
    cut = n - limit if side == "left" else 0  # tokens cut before the kept ones
    pairs = zip(full.positions, full.step_ends, strict=True)
    kept = [(p - cut, e) for p, e in pairs if 0 <= p - cut < limit]
    assert list(zip(item.positions, item.step_ends, strict=True)) == kept
    result = model.score_steps([item])[0]
    reference = reference_scores(prm_path, item.encoded.input_ids)
    assert result.step_scores == pytest.approx([reference[p] for p, _ in kept], abs=1e-5)
    assert result.steps_dropped == item.steps_dropped
    with pytest.raises(TextTooLongError):
        model.rendering.encode_pairs(["q "], [LONG], truncate=False)


def test_no_step_left_is_an_error(prm_path: Path) -> None:
    model = load(cpu_options(str(prm_path), max_length=8, truncation_side="right"))
    with pytest.raises(StepsTruncatedError, match="item 0: truncation to 8 tokens"):
        model.rendering.encode_pairs(
            ["a long query that fills the budget "], ["a\n\nb"], truncate=True
        )


# ---------------------------------------------------------------------- batching and loading


def test_token_scores_are_batch_invariant(prm: ProcessRewardModel) -> None:
    texts = [LONG, "a", "the film was good\n\nvery"]
    rows = [e.input_ids for e in prm.encode(texts, truncate=True)]
    together = prm.token_scores(rows)
    for row, scores in zip(rows, together, strict=True):
        alone = prm.token_scores([row])[0]
        assert len(alone) == len(row) == len(scores)
        assert scores == pytest.approx(alone, abs=1e-5)
    assert prm.token_scores([]) == []


def test_info_and_load_errors(prm: ProcessRewardModel, gpt2_rm: Path, prm_path: Path) -> None:
    info = prm.info()
    assert info["kind"] == "process" and info["num_labels"] == 2
    assert info["step_separator"] == "\n\n" and info["step_aggregate"] == "min"
    assert info["architecture"] == "GPT2ForTokenClassification"
    with pytest.raises(ModelLoadError, match="not a token-classification model"):
        load(cpu_options(str(gpt2_rm)))
    with pytest.raises(ModelLoadError, match=r"step_tag 'two words' is \d+ tokens"):
        load(cpu_options(str(prm_path)), StepOptions(tag="two words"))


def test_a_model_with_its_own_class_needs_trust_remote_code() -> None:
    config = SimpleNamespace(
        architectures=["Qwen2ForProcessRewardModel"],
        auto_map={"AutoModel": "modeling_qwen2_rm.Qwen2ForProcessRewardModel"},
    )
    with pytest.raises(ModelLoadError, match="pass --trust-remote-code"):
        _auto_class(config, LoadOptions(model="prm"))
    assert _auto_class(config, LoadOptions(model="prm", trust_remote_code=True)) is AutoModel


def test_a_template_that_starts_with_bos(chat_prm_path: Path, tmp_path: Path) -> None:
    # The rendered text carries its BOS: the renderer keeps it in front when truncating,
    # and the steps are still placed on the right tokens.
    template = tmp_path / "bos.jinja"
    template.write_text(tiny_models.EOS + tiny_models.CHAT_TEMPLATE)
    response = "good\n\nbad\n\nfine"
    full = load(cpu_options(str(chat_prm_path), chat_template=str(template)))
    item = full.rendering.encode_conversations([conversation(response)], truncate=True)[0]
    text = tiny_models.EOS + "<|user|>\nrate the film</s>\n<|assistant|>\n" + response + "</s>\n"
    ids, offsets = tokens_with_offsets(chat_prm_path, text)
    assert item.encoded.input_ids == ids
    at = text.index(response)
    expected = [token_holding(offsets, at + end - 1) for end in (6, 11, 15)]
    assert item.positions == expected
    limit = len(ids) - 10
    cut = load(
        cpu_options(str(chat_prm_path), chat_template=str(template), max_length=limit)
    ).rendering.encode_conversations([conversation(response)], truncate=True)[0]
    assert cut.encoded.input_ids == ids[:1] + ids[11:]  # BOS kept, the content cut after it
    assert cut.positions == [p - 10 for p in expected] and cut.steps_dropped == 0


def test_process_models_run_on_the_transformers_engine(prm_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="process reward models run on the transformers"):
        load_process_scorer(cpu_options(str(prm_path)), StepOptions(), "vllm")
    loaded = load_process_scorer(cpu_options(str(prm_path)), StepOptions(separator=" "))
    assert isinstance(loaded, ProcessRewardModel) and loaded.steps.separator == " "
