"""``kind: remote`` against a second real reward-server process: the remote component equals
that server's own score. Its parts with a fake chat endpoint are in test_remote_component.py."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from helpers.remote import LABELS, QUERIES, RESPONSES, SECRET
from helpers.servers import serve
from server_proc import metric, running_server


def test_remote_component_equals_the_other_servers_score(gpt2_rm: Path, tmp_path: Path) -> None:
    body = {"queries": QUERIES, "responses": RESPONSES, "labels": LABELS, "components": True}
    with running_server(gpt2_rm, "--max-wait-ms", "1", timeout=120) as other:
        own = httpx.post(f"{other.url}/score", json=body, timeout=60).json()["scores"]
        models = [
            {
                "name": "other",
                "kind": "remote",
                "url": other.url,
                "api_key_env": "OTHER_RM_KEY",
                "call_timeout_s": 2,
                "on_error": -1.5,
                "weight": 0.5,
            },
            {"name": "exact", "kind": "verifier", "verifier": "exact"},
        ]
        env = {"OTHER_RM_KEY": SECRET}
        with serve(models=models, folder=tmp_path, env=env) as first:
            ok = httpx.post(f"{first.url}/score", json=body, timeout=60)
            info = httpx.get(f"{first.url}/info", timeout=30)
            other.stop()
            down = httpx.post(f"{first.url}/score", json=body, timeout=60)
            errors = metric(
                first.url, "reward_server_remote_errors_total", model="other", reason="remote_error"
            )
    assert ok.status_code == 200, ok.text
    answer = ok.json()
    assert answer["components"]["other"] == pytest.approx(own, abs=1e-6)
    assert answer["components"]["exact"] == [1.0, 0.0, 1.0]
    want = [0.5 * o + e for o, e in zip(own, [1.0, 0.0, 1.0], strict=True)]
    assert answer["scores"] == pytest.approx(want, abs=1e-6)
    assert not answer.get("verifier_errors")

    assert down.status_code == 200, down.text
    gone = down.json()
    assert gone["components"]["other"] == [-1.5] * 3
    assert gone["verifier_errors"] == {"other": ["remote_error"] * 3}
    assert errors == 3.0

    assert SECRET not in info.text
    (entry,) = [m for m in info.json()["models"] if m["name"] == "other"]
    assert entry["kind"] == "remote"
    assert entry["url"] == other.url
    assert entry["protocol"] == "remote-reward"
    assert "remote_model" not in entry  # none: the remote's own model
    assert entry["call_timeout_s"] == 2
    assert "api_key_env" not in entry
