"""A judge beside a reward model and a verifier, in a real server process (the judge itself in
process: test_judge.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from helpers.judges import ATOL, QUERIES, RESPONSES, YES_NO, contents, judge_entry, reference
from helpers.servers import serve
from server_proc import metric

from reward_server.config import ServerSettings
from reward_server.http.app import create_app


def test_a_judge_with_a_reward_model_and_a_verifier_in_a_real_server(
    judges: dict[str, Path],
    gpt2_rm: Path,
    tmp_path: Path,
) -> None:
    """One models file: a judge (0.5), a sequence reward model (0.1) and an exact verifier
    (1.0): each component as it is alone, the combined score their weighted sum."""
    folder = judges["llama"]
    entries = [
        judge_entry(folder, weight=0.5),
        {"name": "rm", "model": str(gpt2_rm), "weight": 0.1},
        {"name": "exact", "kind": "verifier", "verifier": "exact"},
    ]
    body = {"queries": QUERIES, "responses": RESPONSES, "labels": ["4", "blue", "boring"]}
    with TestClient(create_app(ServerSettings(model=str(gpt2_rm), max_wait_ms=1.0))) as rm_alone:
        rm = rm_alone.post("/score", json=body).json()["scores"]
    with serve(None, "--max-wait-ms", "1", models=entries, folder=tmp_path) as srv:
        r = httpx.post(f"{srv.url}/score", json=body, timeout=60)
        info = httpx.get(f"{srv.url}/info", timeout=30).json()
        judged = metric(srv.url, "reward_server_model_items_total", model="judge")
    assert r.status_code == 200, r.text
    answer = r.json()
    judge = reference(folder, contents(QUERIES, RESPONSES, body["labels"]), YES_NO)
    components = answer["components"]
    assert components["judge"] == pytest.approx(judge, abs=ATOL)
    assert components["rm"] == pytest.approx(rm, abs=ATOL)
    assert components["exact"] == [1.0, 0.0, 1.0]
    want = [0.5 * j + 0.1 * m + e for j, m, e in zip(judge, rm, [1.0, 0.0, 1.0], strict=True)]
    assert answer["scores"] == pytest.approx(want, abs=ATOL)
    assert [m["kind"] for m in info["models"]] == ["judge", "sequence", "verifier"]
    assert judged == 3.0
