"""The ``reward-server`` command line as a process: ``python -m``, a load failure's exit status,
and the environment configuring a real server. The flags and settings in process are in
test_server_cli.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
from helpers.server_cli import AUTH, KEY, assert_one_error_line, load_failure_args
from server_proc import REWARD_SERVER, running_server


def test_python_dash_m_entry_point() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "reward_server", "--version"], capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.startswith("reward-server ")


def test_console_script_load_failure_exits_nonzero_without_traceback(
    tmp_path: Path, gpt2_rm: Path
) -> None:
    """One real process: the console script's exit status and stderr."""
    args = load_failure_args("bad adapter", tmp_path, gpt2_rm)
    out = subprocess.run(
        [str(REWARD_SERVER), *args, "--port", "1", "--log-level", "warning"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1
    assert_one_error_line(out.stderr, "bad adapter", args[1])


def test_environment_configures_a_real_server(gpt2_rm: Path) -> None:
    """A server configured only through REWARD_SERVER_* variables, over a real socket: each
    limit set there takes effect (every error case is tested in process in test_server_api.py
    and against a real server in test_reliability_hostile.py)."""
    env = {
        "REWARD_SERVER_API_KEY": KEY,
        "REWARD_SERVER_MAX_CLIENT_BATCH": "4",
        "REWARD_SERVER_NO_TRUNCATE": "1",
        "REWARD_SERVER_MAX_LENGTH": "16",
        "REWARD_SERVER_MAX_BODY_BYTES": "4096",
        "REWARD_SERVER_LOG_LEVEL": "debug",
    }
    with running_server(gpt2_rm, env=env) as server:
        url = server.url

        def score(**kwargs: object) -> httpx.Response:
            return httpx.post(f"{url}/score", headers=AUTH, timeout=60, **kwargs)  # type: ignore[arg-type]

        info = httpx.get(f"{url}/info", headers=AUTH)
        assert info.status_code == 200, info.text
        body = info.json()
        assert body["max_client_batch"] == 4
        assert body["max_length"] == 16
        assert body["truncate"] is False
        assert body["max_body_bytes"] == 4096
        assert body["auth"] is True
        assert KEY not in info.text
        # The key: required on scoring and /info, not on health and metrics.
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            r = httpx.post(f"{url}/score", json={"texts": ["a"]}, headers=headers)
            assert r.status_code == 401 and r.json()["type"] == "unauthorized"
            assert httpx.get(f"{url}/info", headers=headers).status_code == 401
        assert httpx.get(f"{url}/health").status_code == 200
        assert httpx.get(f"{url}/metrics").status_code == 200
        # The limits from the environment, each a JSON error of its kind.
        cases = [
            (score(json={"texts": []}), 422, "invalid_request"),
            (score(json={"texts": ["a"] * 5}), 413, "too_many_items"),
            (score(json={"texts": ["ok", "word " * 40]}), 413, "text_too_long"),
            (score(json={"texts": ["a" * 5000]}), 413, "body_too_large"),
            (httpx.get(f"{url}/nowhere"), 404, "not_found"),
        ]
        for r, status, kind in cases:
            assert r.status_code == status, r.text
            assert r.json().keys() == {"error", "type"} and r.json()["type"] == kind
        ok = score(json={"texts": ["still up"]})
        assert ok.status_code == 200 and len(ok.json()["scores"]) == 1
        log = server.log()
    assert KEY not in log
