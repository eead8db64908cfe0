"""Pairwise judges (``kind: judge``, ``mode: pairwise``, issue 36 item 2) on the transformers
engine, against an independent computation.

The judge is a tiny random causal LM (the ``judges`` fixture's, GPT-2 and Llama with a
BOS); one request holds groups of 2, 4 and 8 responses (each group its own prompt, responses
of different lengths, so rows are padded) and an ungrouped item. The reference: the template
rendered with plain Jinja, the chat template with the generation prompt, one unbatched
forward of plain ``AutoModelForCausalLM`` per ordered pair, a softmax over the two answer
tokens' logits; the pairs, the position-bias average and both aggregates (win rate, and a
Bradley-Terry fit by ``scipy.optimize``) written again in :mod:`helpers.pairwise`. Equal
within 1e-5.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.models_files import next_models_file
from helpers.pairwise import ANSWERS, assert_close, entry, expected, first_better, group_request
from helpers.posting import assert_error

from reward_server.config import ServerSettings
from reward_server.errors import ModelLoadError
from reward_server.http.app import create_app


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
    path = next_models_file(tmp_path, entries)
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
    path = next_models_file(tmp_path, [entry(folder, "pw", on_error=-1.0)])
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
        app = create_app(ServerSettings(models=str(next_models_file(tmp_path, entries))))
        with pytest.raises(ModelLoadError, match=message), TestClient(app):
            pass


def test_identical_pair_rows_are_judged_once(judges: dict[str, Path], tmp_path: Path) -> None:
    """A group whose first two responses are the same: its six rows are three distinct rows
    (the score cache keys rows by token ids), and a repeated request reads all six."""
    from fastapi.testclient import TestClient

    folder = judges["llama"]
    path = next_models_file(tmp_path, [entry(folder, "pw")])
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
