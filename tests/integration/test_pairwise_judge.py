"""Pairwise judges (``kind: judge``, ``mode: pairwise``, issue 36 item 2) on the transformers
engine, against an independent computation.

The judge is a tiny random causal LM (``tests/unit/test_judge.py``'s, GPT-2 and Llama with a
BOS); one request holds groups of 2, 4 and 8 responses (each group its own prompt, responses
of different lengths, so rows are padded) and an ungrouped item. The reference: the template
rendered with plain Jinja, the chat template with the generation prompt, one unbatched
forward of plain ``AutoModelForCausalLM`` per ordered pair, a softmax over the two answer
tokens' logits; the pairs, the position-bias average and both aggregates (win rate, and a
Bradley-Terry fit by ``scipy.optimize``) written here again. Equal within 1e-5.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
import pytest
import torch
from test_judge import models_file, save_judge
from test_server_api import assert_error
from transformers import AutoModelForCausalLM, AutoTokenizer

from reward_server.config import ServerSettings
from reward_server.errors import ModelLoadError
from reward_server.http.app import create_app

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


# --------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def judges(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {f: save_judge(tmp_path_factory.mktemp(f"pairwise_{f}"), f) for f in ("gpt2", "llama")}


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_pairwise_scores_equal_an_independent_computation(
    family: str, judges: dict[str, Path], tmp_path: Path
) -> None:
    """Groups of 2, 4 and 8 in one request; win rate and Bradley-Terry, pairs all and 2."""
    from fastapi.testclient import TestClient

    folder = judges[family]
    setups = {
        "win": ("all", "win_rate"),
        "bt": ("all", "bradley_terry"),
        "win2": (2, "win_rate"),
        "bt2": (2, "bradley_terry"),
    }
    entries = [
        entry(folder, n, pairs=k, pairwise_aggregate=a, weight=float(n == "win"))
        for n, (k, a) in setups.items()
    ]
    path = models_file(tmp_path, entries)
    body = group_request()
    app = create_app(ServerSettings(models=str(path), max_wait_ms=1.0, max_batch_size=16))
    with TestClient(app) as client:
        r = client.post("/score", json={**body, "components": True})
        info = client.get("/info").json()["models"]
        metrics = client.get("/metrics").text
    assert r.status_code == 200, r.text
    answer = r.json()
    p = first_better(folder, body)
    assert max(p.values()) - min(p.values()) > 0.02, p  # the check can tell rows apart
    for name, (pairs, how) in setups.items():
        assert_close(answer["components"][name], expected(p, body, pairs, how))
    # The ungrouped item has no opponent: masked, with its reason.
    assert answer["scores"][-1] is None and answer["masked"][-1] == "no_opponent"
    assert all(s is not None for s in answer["scores"][:-1])
    # pairs: 2 judges fewer pairs than all in the groups of 4 and 8 (4 + 8, not 6 + 28).
    rows = 2 * (1 + 4 + 8)
    assert f'reward_server_score_cache_misses_total{{model="win2"}} {float(rows)}' in metrics
    assert f'reward_server_score_cache_misses_total{{model="win"}} {float(2 * 35)}' in metrics
    first = info[0]
    assert first["mode"] == "pairwise" and first["answer_tokens"] == ANSWERS
    assert first["pairs"] == "all" and first["pairwise_aggregate"] == "win_rate"
    assert "score_tokens" not in first and len(first["answer_token_ids"]) == 2


def test_pairwise_needs_groups_and_a_template_of_two_responses(
    judges: dict[str, Path], tmp_path: Path
) -> None:
    from fastapi.testclient import TestClient

    folder = judges["gpt2"]
    path = models_file(tmp_path, [entry(folder, "pw", on_error=-1.0)])
    app = create_app(ServerSettings(models=str(path), max_wait_ms=1.0))
    with TestClient(app) as client:
        body = group_request((3,))
        ungrouped = {k: v for k, v in body.items() if k != "groups"}
        assert_error(client.post("/score", json=ungrouped), 422, "bad_groups")
        r = client.post("/score", json=body)
        # A group of one, and on_error: a number: the lone item scores it, unmasked.
        ones = client.post("/score", json={**body, "groups": [[0, 1, 2], [3]]})
    assert r.status_code == 200, r.text
    assert r.json()["scores"][-1] == -1.0 and "masked" not in r.json()
    assert r.json()["verifier_errors"] == {"pw": [None, None, None, "no_opponent"]}
    assert ones.json()["scores"] == r.json()["scores"]
    for entries, message in [
        ([entry(folder, "pw", template="{{ response }} or not")], "uses response; it knows "),
        ([entry(folder, "pw", answer_tokens=["A", "Second"])], "answer token 'Second' is "),
    ]:
        app = create_app(ServerSettings(models=str(models_file(tmp_path, entries))))
        with pytest.raises(ModelLoadError, match=message), TestClient(app):
            pass


def test_identical_pair_rows_are_judged_once(judges: dict[str, Path], tmp_path: Path) -> None:
    """A group whose first two responses are the same: its six rows are three distinct rows
    (the score cache keys rows by token ids), and a repeated request reads all six."""
    from fastapi.testclient import TestClient

    folder = judges["llama"]
    path = models_file(tmp_path, [entry(folder, "pw")])
    body = {
        "queries": ["Q?"] * 3,
        "responses": ["same answer", "same answer", "another one"],
        "labels": ["l"] * 3,
        "groups": [[0, 1, 2]],
    }
    with TestClient(create_app(ServerSettings(models=str(path), max_wait_ms=1.0))) as client:
        first = client.post("/score", json=body).json()
        again = client.post("/score", json=body).json()
        metrics = client.get("/metrics").text
    assert again["scores"] == first["scores"]
    assert_close(first["scores"], expected(first_better(folder, body), body, "all", "win_rate"))
    assert first["scores"][0] == first["scores"][1]
    for name, count in [("misses", 3.0), ("duplicates", 3.0), ("hits", 6.0)]:
        assert f'reward_server_score_cache_{name}_total{{model="pw"}} {count}' in metrics
