"""LLM judges in ``mode: generate`` (issue 21, part 3): the judge answers in text and the
score is parsed from its answer by ``score_pattern``.

A tiny GPT-2 is trained here (500 steps, seconds on CPU; once per run, shared with
tests/e2e/test_vllm_judge.py) to answer ``Rate: <response>`` with
``Verdict: Score: N``, N set by the response's last word, or with garbage (``no idea``) for one last
word. Served as a judge, its parsed scores are the expected numbers; an answer without a
match scores ``on_error`` with the reason ``parse_failure`` (in ``verifier_errors`` and counted in
``reward_server_verifier_errors_total``); and every score equals the number parsed from an
independent, unpadded, greedy ``generate`` of plain transformers on the same prompt.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import test_judge
import torch
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoModelForCausalLM, AutoTokenizer

import tiny_models
from reward_server.config.models_file import ModelsFileError, parse_models_file

#: The fixture ``serve(entries, **settings)``: a TestClient of an app per models file.
serve = test_judge.serve

TEMPLATE = "Rate: {{ response }}\nVerdict:"  # (Jinja drops a last newline)
PATTERN = r"Score: (\d+)"
#: The judge's answer by the response's last word.
ANSWERS = {"great": "Score: 9", "good": "Score: 7", "bad": "Score: 2", "awful": "Score: 0"}
GARBAGE = {"odd": "no idea"}
FILLER = "the movie film story plot was is very really quite and but so it".split()
ON_ERROR = -1.0


def _response(rng: random.Random, last: str) -> str:
    return " ".join([*rng.choices(FILLER, k=rng.randint(0, 4)), last])


def _prompt(response: str) -> str:
    return f"Rate: {response}\nVerdict:"


def _line(response: str) -> str:
    return f"{_prompt(response)} {ANSWERS.get(response.split()[-1]) or GARBAGE['odd']}"


def train_judge(path: Path, steps: int, **shape: int) -> Path:
    """A tiny GPT-2 taught to answer the rubric (the loss on the answer only); ``shape``:
    :func:`tiny_models.gpt2_causal_lm`'s sizes instead of the default ones."""
    rng = random.Random(0)
    firsts = [*ANSWERS, *GARBAGE]
    corpus = [_line(_response(rng, rng.choice(firsts))) for _ in range(500)]
    tok = tiny_models.byte_bpe_tokenizer(corpus, vocab_size=300, pad_is_eos=True)
    sizes = {"n_positions": 64, "n_embd": 64, **shape}
    model = tiny_models.gpt2_causal_lm(tok, seed=0, **sizes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _step in range(steps):
        responses = [_response(rng, rng.choice(firsts)) for _ in range(32)]
        enc = tok([_line(r) + tok.eos_token for r in responses], return_tensors="pt", padding=True)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        for row, response in zip(labels, responses, strict=True):  # the answer's loss only
            row[: len(tok(_prompt(response))["input_ids"])] = -100
        loss = model(**enc, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    return tiny_models.save(path, model, tok)


def train_rubric_judge(folder: Path) -> Path:
    """The trained judge this module and tests/e2e/test_vllm_judge.py serve (the ``built_once``
    fixture trains it once per run); a head size of 64, which vLLM's CPU attention takes.

    On one torch thread: beside the other pytest worker's servers, two threads on the two
    cores took 5x their idle time (127 s against 25 s); one thread takes 36 s idle."""
    with tiny_models.torch_threads(1):
        return train_judge(folder, steps=500, n_embd=128, n_head=2)


@pytest.fixture(scope="module")
def judge(built_once: Callable[..., Path]) -> Path:
    return built_once("rubric-judge", train_rubric_judge)


def reference_answers(folder: Path, responses: list[str], max_new_tokens: int) -> list[str]:
    """Plain transformers: each prompt alone, unpadded, greedy, decoded up to EOS."""
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    answers = []
    for response in responses:
        enc = tok(_prompt(response), return_tensors="pt")
        out = model.generate(
            **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.eos_token_id
        )
        answers.append(tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True))
    return answers


def parsed(answers: list[str], pattern: str = PATTERN) -> list[float]:
    matches = [re.search(pattern, a) for a in answers]
    return [ON_ERROR if m is None else float(m.group(1)) for m in matches]


def entry(folder: Path, **extra: Any) -> dict[str, Any]:
    return {
        "name": "judge",
        "kind": "judge",
        "model": str(folder),
        "mode": "generate",
        "template": TEMPLATE,
        "score_pattern": PATTERN,
        "chat_template": "none",
        "on_error": ON_ERROR,
        "max_new_tokens": 8,
        **extra,
    }


def parse_errors(client: TestClient) -> float:
    text = client.get("/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {"model": "judge", "reason": "parse_failure"}
            if sample.name == "reward_server_verifier_errors_total" and sample.labels == labels:
                return float(sample.value)
    return 0.0


RESPONSES = [
    "great",
    "the film and it was very really good",
    "plot bad",
    "the movie so awful",
    "story odd",
    "good",
]


def test_the_trained_judge_answers_the_rubric(judge: Path) -> None:
    answers = reference_answers(judge, RESPONSES, 8)
    want = [{**ANSWERS, **GARBAGE}[r.split()[-1]] for r in RESPONSES]
    assert [a.strip() for a in answers] == want


def test_scores_are_parsed_from_the_answers_and_a_parse_failure_scores_on_error(
    judge: Path, serve: Any
) -> None:
    client = serve([entry(judge)])
    r = client.post("/score", json={"texts": RESPONSES})
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["scores"] == [9.0, 7.0, 2.0, 0.0, ON_ERROR, 7.0]
    assert data["verifier_errors"] == {"judge": [None, None, None, None, "parse_failure", None]}
    assert parse_errors(client) == 1.0
    # A pair reads its response the same way (the template has no prompt).
    pairs = client.post("/score", json={"queries": ["q", "q"], "responses": ["it bad", "great"]})
    assert pairs.json()["scores"] == [2.0, 9.0] and pairs.json().get("verifier_errors") is None
    assert parse_errors(client) == 1.0


def test_scores_equal_a_plain_greedy_generate(judge: Path, serve: Any) -> None:
    """Items of many lengths in one left-padded batch, some the judge never saw."""
    rng = random.Random(1)
    words = [*ANSWERS, *GARBAGE, "movie", "it", "so"]
    responses = [_response(rng, rng.choice(words)) for _ in range(16)]
    for max_new in (3, 8):
        client = serve([entry(judge, max_new_tokens=max_new)], max_batch_size=16)
        r = client.post("/score", json={"texts": responses})
        assert r.status_code == 200, r.text
        want = parsed(reference_answers(judge, responses, max_new))
        assert r.json()["scores"] == want
        assert len(set(r.json()["tokens"])) > 2
    # Repeated: the same numbers (greedy is deterministic).
    again = client.post("/score", json={"texts": responses})
    assert again.json()["scores"] == want


def test_a_pattern_that_never_matches_scores_on_error(judge: Path, serve: Any) -> None:
    client = serve([entry(judge, score_pattern=r"Grade: (\d+)", on_error=0.5)])
    r = client.post("/score", json={"texts": RESPONSES[:3]})
    assert r.status_code == 200, r.text
    assert r.json()["scores"] == [0.5] * 3
    assert r.json()["verifier_errors"] == {"judge": ["parse_failure"] * 3}
    assert parse_errors(client) == 3.0


def test_sampling_runs_and_info_lists_the_settings(judge: Path, serve: Any) -> None:
    client = serve([entry(judge, temperature=0.7, top_p=0.9)])
    r = client.post("/score", json={"texts": RESPONSES})
    assert r.status_code == 200, r.text
    assert len(r.json()["scores"]) == len(RESPONSES)
    (info,) = client.get("/info").json()["models"]
    assert info["mode"] == "generate" and info["score_pattern"] == PATTERN
    assert info["max_new_tokens"] == 8 and info["temperature"] == 0.7 and info["top_p"] == 0.9
    assert info["on_error"] == ON_ERROR and "score_tokens" not in info


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"score_pattern": None}, "mode: generate needs 'score_pattern'"),
        ({"score_pattern": r"Score: \d+"}, "score_pattern needs exactly one group"),
        ({"score_pattern": r"Score: (\d+"}, "score_pattern 'Score: (\\\\d+'"),
        ({"score_tokens": {"Yes": 1.0, "No": 0.0}}, "score_tokens: only for mode: logprobs"),
        ({"top_p": 0.5}, "top_p samples: give a temperature above 0"),
        ({"max_new_tokens": 0}, "max_new_tokens: Input should be greater than or equal to 1"),
        (
            {"mode": "logprobs", "score_tokens": {"Yes": 1.0, "No": 0.0}},
            "score_pattern, max_new_tokens: only for mode: generate; "
            "on_error: only for mode: generate or pairwise",
        ),
    ],
)
def test_generate_keys_are_validated(extra: dict[str, Any], message: str) -> None:
    spec = {k: v for k, v in {**entry(Path("/m")), **extra}.items() if v is not None}
    with pytest.raises(ModelsFileError) as err:
        parse_models_file({"models": [spec]})
    assert message in str(err.value)


def test_max_new_tokens_leaves_room_for_the_prompt(judge: Path, serve: Any) -> None:
    """The prompt is cut to max_length - max_new_tokens (here 64 - 8) tokens."""
    client = serve([entry(judge)])
    long = "very " * 100 + "good"
    r = client.post("/score", json={"texts": [long]})
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == [56] and r.json()["truncated"] == [True]
