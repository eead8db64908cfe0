"""A judge in ``mode: generate`` that answers a rubric: a tiny GPT-2 trained (:data:`TRAIN_STEPS` steps) to
answer ``Rate: <response>`` with ``Verdict: Score: N``, N set by the response's last word, or
with garbage (``no idea``) for one last word; the ``rubric_judge`` fixture of
tests/conftest.py trains it once per run. ``reference_answers`` is plain transformers'
greedy ``generate`` of the same prompts, ``parsed`` the numbers the score pattern finds.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import tiny_models

TEMPLATE = "Rate: {{ response }}\nVerdict:"  # (Jinja drops a last newline)
PATTERN = r"Score: (\d+)"
#: The judge's answer by the response's last word.
ANSWERS = {"great": "Score: 9", "good": "Score: 7", "bad": "Score: 2", "awful": "Score: 0"}
GARBAGE = {"odd": "no idea"}
FILLER = "the movie film story plot was is very really quite and but so it".split()
ON_ERROR = -1.0
#: Training steps: the judge answers every prompt of 300 random ones as trained from 300
#: steps on (250: 149 of 150), so 350 leaves a margin; 500 took 40 % longer for nothing more.
#: (helpers.grader_judge's judge keeps 500: it is also asked prompts it was not trained on.)
TRAIN_STEPS = 350


def random_response(rng: random.Random, last: str) -> str:
    return " ".join([*rng.choices(FILLER, k=rng.randint(0, 4)), last])


def rubric_prompt(response: str) -> str:
    return f"Rate: {response}\nVerdict:"


def rubric_line(response: str) -> str:
    return f"{rubric_prompt(response)} {ANSWERS.get(response.split()[-1]) or GARBAGE['odd']}"


def train_judge(path: Path, steps: int, **shape: int) -> Path:
    """A tiny GPT-2 taught to answer the rubric (the loss on the answer only); ``shape``:
    :func:`tiny_models.gpt2_causal_lm`'s sizes instead of the default ones."""
    rng = random.Random(0)
    firsts = [*ANSWERS, *GARBAGE]
    corpus = [rubric_line(random_response(rng, rng.choice(firsts))) for _ in range(500)]
    tok = tiny_models.byte_bpe_tokenizer(corpus, vocab_size=300, pad_is_eos=True)
    sizes = {"n_positions": 64, "n_embd": 64, **shape}
    model = tiny_models.gpt2_causal_lm(tok, seed=0, **sizes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _step in range(steps):
        responses = [random_response(rng, rng.choice(firsts)) for _ in range(32)]
        enc = tok(
            [rubric_line(r) + tok.eos_token for r in responses], return_tensors="pt", padding=True
        )
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        for row, response in zip(labels, responses, strict=True):  # the answer's loss only
            row[: len(tok(rubric_prompt(response))["input_ids"])] = -100
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
    cores took 5x their idle time (127 s against 25 s); one thread takes about 20 s idle."""
    with tiny_models.torch_threads(1):
        return train_judge(folder, steps=TRAIN_STEPS, n_embd=128, n_head=2)


def reference_answers(folder: Path, responses: list[str], max_new_tokens: int) -> list[str]:
    """Plain transformers: each prompt alone, unpadded, greedy, decoded up to EOS."""
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    answers = []
    for response in responses:
        enc = tok(rubric_prompt(response), return_tensors="pt")
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
