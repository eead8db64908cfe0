"""A judge for OpenAI's model graders (``score_model``): a tiny GPT-2 trained to answer the
messages a score_model leaf sends (rendered without a chat template: ``role: content``
lines, then ``assistant:``) with OpenAI's ``{"result": N, "steps": []}``, N set by the
response's last word, or with garbage for one last word (a ``model_grader_parse_error``).
The ``grader_judge`` fixture of tests/conftest.py trains it once per run;
:func:`reference_answers` is plain transformers' greedy ``generate`` of the same prompts.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import tiny_models

#: The score_model grader this judge answers (its one input message).
RATE = "Rate: {{ sample.output_text }}"
INSTRUCTION = 'Answer in JSON: {"result": <0 to 1>, "steps": [...]}'
#: The judge's answer by the response's last word.
ANSWERS = {
    "great": '{"result": 0.9, "steps": []}',
    "good": '{"result": 0.7, "steps": []}',
    "bad": '{"result": 0.2, "steps": []}',
}
GARBAGE = {"odd": "no idea"}
FILLER = "the movie film story plot was is very really quite and but so it".split()


def score_model(**extra: Any) -> dict[str, Any]:
    """The score_model grader (model ``judge``, range [0, 1])."""
    return {
        "type": "score_model",
        "name": "judge",
        "model": "judge",
        "input": [{"role": "user", "content": RATE}],
        **extra,
    }


def random_response(rng: random.Random, last: str) -> str:
    return " ".join([*rng.choices(FILLER, k=rng.randint(0, 4)), last])


def prompt(response: str) -> str:
    """The leaf's messages as the judge reads them without a chat template."""
    return f"user: Rate: {response}\nsystem: {INSTRUCTION}\nassistant:"


def line(response: str) -> str:
    answer = ANSWERS.get(response.split()[-1]) or GARBAGE["odd"]
    return f"{prompt(response)} {answer}"


def expected(response: str) -> float | None:
    """The score the grader reads from the trained answer (None: it cannot parse one)."""
    answer = ANSWERS.get(response.split()[-1])
    return None if answer is None else float(json.loads(answer)["result"])


def train_grader_judge(folder: Path) -> Path:
    """The trained judge, on one torch thread (see helpers.rubric_judge for why)."""
    with tiny_models.torch_threads(1):
        rng = random.Random(0)
        lasts = [*ANSWERS, *GARBAGE]
        corpus = [line(random_response(rng, rng.choice(lasts))) for _ in range(500)]
        tok = tiny_models.byte_bpe_tokenizer(corpus, vocab_size=400, pad_is_eos=True)
        model = tiny_models.gpt2_causal_lm(tok, seed=0, n_positions=128, n_embd=128, n_head=2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model.train()
        for _step in range(400):
            responses = [random_response(rng, rng.choice(lasts)) for _ in range(32)]
            enc = tok(
                [line(r) + tok.eos_token for r in responses], return_tensors="pt", padding=True
            )
            labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
            for row, response in zip(labels, responses, strict=True):  # the answer's loss only
                row[: len(tok(prompt(response))["input_ids"])] = -100
            loss = model(**enc, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        return tiny_models.save(folder, model, tok)


def reference_answers(folder: Path, responses: list[str], max_new_tokens: int) -> list[str]:
    """Plain transformers: each prompt alone, unpadded, greedy, decoded up to EOS."""
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    answers = []
    for response in responses:
        enc = tok(prompt(response), return_tensors="pt")
        out = model.generate(
            **enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.eos_token_id
        )
        answers.append(tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True))
    return answers


def judge_entry(folder: Path, **extra: Any) -> dict[str, Any]:
    """The judge's entry: mode generate, no chat template (its own template and pattern are
    for /score of the judge itself; the graders send their messages)."""
    return {
        "name": "judge",
        "kind": "judge",
        "model": str(folder),
        "mode": "generate",
        "template": "Rate: {{ response }}",
        "score_pattern": r"\"result\": ([0-9.]+)",
        "chat_template": "none",
        "max_new_tokens": 24,
        "weight": 0,
        **extra,
    }
