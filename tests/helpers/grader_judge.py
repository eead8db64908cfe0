"""A judge for OpenAI's model graders: a tiny GPT-2 trained to answer the messages a
``score_model`` leaf sends (rendered without a chat template: ``role: content`` lines, then
``assistant:``) with OpenAI's ``{"result": N, "steps": []}``, N set by the response's last
word whatever range the instruction names (the server clips to it), and those of a
``label_model`` leaf with ``{"result": "positive"}`` or ``"negative"``; with garbage for
one last word (a ``model_grader_parse_error``).
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
#: The instruction the server adds to a score_model leaf's messages, by the leaf's range.
INSTRUCTION = 'Answer in JSON: {{"result": <{lo:g} to {hi:g}>, "steps": [...]}}'
#: The ranges of the training prompts: the default most often, and others (the tests ask
#: [0.8, 1]), so that the answer depends on the response's last word alone.
TRAIN_RANGES = [(0.0, 1.0)] * 4 + [(0.8, 1.0), (0.0, 10.0), (1.0, 5.0), (0.5, 1.0)]
#: Training steps: trained on those ranges, the judge answers each of 600 random prompts as
#: trained from 150 steps on; 250 leaves a margin. (Trained on the default range alone, it
#: took 500 steps to answer [0.8, 1] as [0, 1].)
TRAIN_STEPS = 250
#: The judge's answer by the response's last word.
ANSWERS = {
    "great": '{"result": 0.9, "steps": []}',
    "good": '{"result": 0.7, "steps": []}',
    "bad": '{"result": 0.2, "steps": []}',
}
GARBAGE = {"odd": "no idea"}
#: The label_model grader this judge answers, and its label by the response's last word.
LABEL = "Label: {{ sample.output_text }}"
LABELS = ["positive", "negative"]
LABEL_INSTRUCTION = 'Answer in JSON: {"result": <one of ["positive", "negative"]>}'
LABEL_OF = {"great": "positive", "good": "positive", "bad": "negative"}
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


def label_model(**extra: Any) -> dict[str, Any]:
    """The label_model grader (model ``judge``, positive passes)."""
    return {
        "type": "label_model",
        "name": "sentiment",
        "model": "judge",
        "input": [{"role": "user", "content": LABEL}],
        "labels": LABELS,
        "passing_labels": ["positive"],
        **extra,
    }


def random_response(rng: random.Random, last: str) -> str:
    return " ".join([*rng.choices(FILLER, k=rng.randint(0, 4)), last])


def prompt(
    response: str, labelled: bool = False, score_range: tuple[float, float] = (0.0, 1.0)
) -> str:
    """The leaf's messages as the judge reads them without a chat template (``labelled``:
    the label_model's; ``score_range``: the score_model's range)."""
    if labelled:
        return f"user: Label: {response}\nsystem: {LABEL_INSTRUCTION}\nassistant:"
    instruction = INSTRUCTION.format(lo=score_range[0], hi=score_range[1])
    return f"user: Rate: {response}\nsystem: {instruction}\nassistant:"


def answer(response: str, labelled: bool = False) -> str:
    """What the judge is trained to answer."""
    last = response.split()[-1]
    if labelled:
        label = LABEL_OF.get(last)
        return json.dumps({"result": label}) if label else GARBAGE["odd"]
    return ANSWERS.get(last) or GARBAGE["odd"]


def expected(response: str) -> float | None:
    """The score the grader reads from the trained answer (None: it cannot parse one)."""
    answer = ANSWERS.get(response.split()[-1])
    return None if answer is None else float(json.loads(answer)["result"])


def train_grader_judge(folder: Path) -> Path:
    """The trained judge, on one torch thread (see helpers.rubric_judge for why)."""
    with tiny_models.torch_threads(1):
        rng = random.Random(0)
        lasts = [*ANSWERS, *GARBAGE]

        def example() -> tuple[str, str]:
            """A random prompt (half score_model, half label_model) and its answer."""
            response, labelled = random_response(rng, rng.choice(lasts)), rng.random() < 0.5
            text = prompt(response, labelled, rng.choice(TRAIN_RANGES))
            return text, answer(response, labelled)

        corpus = [" ".join(example()) for _ in range(500)]
        tok = tiny_models.byte_bpe_tokenizer(corpus, vocab_size=400, pad_is_eos=True)
        model = tiny_models.gpt2_causal_lm(tok, seed=0, n_positions=128, n_embd=128, n_head=2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model.train()
        for _step in range(TRAIN_STEPS):
            examples = [example() for _ in range(32)]
            texts = [f"{text} {said}{tok.eos_token}" for text, said in examples]
            enc = tok(texts, return_tensors="pt", padding=True)
            labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
            for row, (text, _said) in zip(labels, examples, strict=True):
                row[: len(tok(text)["input_ids"])] = -100  # the answer's loss only
            loss = model(**enc, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        model.eval()
        return tiny_models.save(folder, model, tok)


def reference_answers(
    folder: Path, responses: list[str], max_new_tokens: int, labelled: bool = False
) -> list[str]:
    """Plain transformers: each prompt alone, unpadded, greedy, decoded up to EOS."""
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    answers = []
    for response in responses:
        enc = tok(prompt(response, labelled), return_tensors="pt")
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


PY_GRADER = "def grade(sample, item):\n    return len(sample['output_text']) / 100\n"
#: The string_check leaf of the judge tests' multi graders: the item's answer in the output,
#: in any case.
EXACT = {
    "type": "string_check",
    "name": "exact",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.answer }}",
    "operation": "ilike",
}
#: A multi grader of the three kinds a run combines (a score_model on the tiny judge, a
#: string_check, a python grader) and the samples and items the judge tests grade with it.
MULTI = {
    "type": "multi",
    "name": "rft",
    "graders": {
        "judge": score_model(),
        "exact": EXACT,
        "py": {"type": "python", "name": "py", "source": PY_GRADER},
    },
    "calculate_output": "(judge + exact + py) / 3",
}
RESPONSES = ["the movie was great", "plot bad", "it good", "so odd"]
ITEMS = [{"answer": "GREAT"}, {"answer": "good"}, {"answer": "good"}, {"answer": "x"}]
