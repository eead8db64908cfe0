"""Pairwise judges (``mode: pairwise``) and their reference: every ordered pair of a group
judged by one unbatched forward pass of plain transformers (``first_better``), the
position-bias average, and both aggregates (win rate; Bradley-Terry fitted by
``scipy.optimize``) written again here (``expected``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ATOL = 1e-5
TEMPLATE = (
    "Question: {{ prompt }}\n"
    "{% if label %}Reference: {{ label }}\n{% endif %}"
    "A: {{ response_a }}\n"
    "B: {{ response_b }}\n"
    "Which answer is better? Reply A or B.\n"
)
ANSWERS = ["A", "B"]
WORDS = "the cat sat on a mat and then it ran far away from home".split()
PRIOR = 1e-3  # the server's documented L2 prior of the Bradley-Terry fit


def group_request(sizes: Sequence[int] = (2, 4, 8), alone: bool = True) -> dict[str, Any]:
    """Groups of ``sizes`` responses (each group its own question and label), then one
    ungrouped item when ``alone``."""
    queries: list[str] = []
    responses: list[str] = []
    labels: list[str] = []
    groups: list[list[int]] = []
    for g, size in enumerate(sizes):
        groups.append(list(range(len(queries), len(queries) + size)))
        for k in range(size):
            queries.append(f"Question {g}: what did the cat do?")
            responses.append(" ".join(WORDS[(g + k) % 5 : (g + k) % 5 + 2 + (3 * k) % 9]))
            labels.append(f"label {g}")
    if alone:
        queries.append("Alone?")
        responses.append("yes")
        labels.append("x")
    return {"queries": queries, "responses": responses, "labels": labels, "groups": groups}


def entry(folder: Path, name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "kind": "judge",
        "model": str(folder),
        "mode": "pairwise",
        "template": TEMPLATE,
        "answer_tokens": ANSWERS,
        **extra,
    }


# --------------------------------------------------------------------------- the reference


def first_better(folder: Path, body: dict[str, Any]) -> dict[tuple[int, int], float]:
    """``p_ij`` of every ordered pair of every group: one unbatched forward each."""
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    answer_ids = [tok.convert_tokens_to_ids(tok.tokenize(a)) for a in ANSWERS]
    assert all(len(i) == 1 for i in answer_ids), answer_ids
    template = jinja2.Template(TEMPLATE)
    out = {}
    for group in body["groups"]:
        for i in group:
            for j in group:
                if i == j:
                    continue
                content = template.render(
                    prompt=body["queries"][i],
                    label=body["labels"][group[0]],
                    response_a=body["responses"][i],
                    response_b=body["responses"][j],
                )
                turn = [{"role": "user", "content": content}]
                text = tok.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([tok(text)["input_ids"]])).logits[0, -1]
                two = logits[[answer_ids[0][0], answer_ids[1][0]]].double()
                out[(i, j)] = float(torch.softmax(two, -1)[0])
    return out


def judged_pairs(group: Sequence[int], pairs: int | str) -> list[tuple[int, int]]:
    """The documented choice: all pairs, or ring neighbours at distance 1 .. ceil(k / 2)."""
    n = len(group)
    every = [(group[a], group[b]) for a in range(n) for b in range(a + 1, n)]
    if pairs == "all":
        return every
    assert isinstance(pairs, int)
    near = {tuple(sorted((a, (a + d) % n))) for a in range(n) for d in range(1, -(-pairs // 2) + 1)}
    return [(group[a], group[b]) for a, b in sorted(near)]


def fit_bradley_terry(n: int, wins: dict[tuple[int, int], float]) -> list[float]:
    """The strengths by scipy: the same objective, a quasi-Newton minimiser."""
    import numpy as np
    from scipy.optimize import minimize

    def loss(theta: Any) -> tuple[float, Any]:
        value, grad = PRIOR / 2 * float(theta @ theta), PRIOR * theta.copy()
        for (a, b), p in wins.items():
            d = theta[a] - theta[b]
            value -= p * -np.logaddexp(0, -d) + (1 - p) * -np.logaddexp(0, d)
            g = p - 1 / (1 + math.exp(-d))
            grad[a] -= g
            grad[b] += g
        return value, grad

    found = minimize(loss, np.zeros(n), jac=True, method="BFGS", options={"gtol": 1e-12})
    return [float(t) for t in found.x]


def expected(
    p: dict[tuple[int, int], float], body: dict[str, Any], pairs: int | str, how: str
) -> list[float | None]:
    """Every item's score by the reference (None: an item without opponent)."""
    scores: list[float | None] = [None] * len(body["queries"])
    for group in body["groups"]:
        wins = {(i, j): (p[(i, j)] + 1 - p[(j, i)]) / 2 for i, j in judged_pairs(group, pairs)}
        if how == "win_rate":
            for k in group:
                mine = [w if i == k else 1 - w for (i, j), w in wins.items() if k in (i, j)]
                scores[k] = sum(mine) / len(mine)
        else:
            at = {k: a for a, k in enumerate(group)}
            theta = fit_bradley_terry(len(group), {(at[i], at[j]): w for (i, j), w in wins.items()})
            for k in group:
                scores[k] = theta[at[k]]
    return scores


def assert_close(got: Sequence[float | None], want: Sequence[float | None]) -> None:
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert (g is None) == (w is None), (k, g, w)
        if w is not None:
            assert g == pytest.approx(w, abs=ATOL), (k, got, want)
