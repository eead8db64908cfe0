"""Tenants in processes: the key-hashing command line, the start-up error of --api-key with
--api-keys, and a real server's per-tenant metrics, logs and reloads (SIGHUP, a changed file).
The keys file, authentication and the table's reload in process are in test_tenants.py."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers.models_files import keys_yaml
from helpers.posting import assert_error, bearer
from helpers.tenants import (
    KEY_A,
    KEY_B,
    KEY_C,
    WRONG,
    assert_no_key_in,
    reloads,
    score_as,
    tenant_items,
)
from server_proc import REWARD_SERVER, ServerProcess, metric, running_server, wait_until

from reward_server.cli import parse_settings
from reward_server.config.tenants import (
    hash_key,
)


def test_hash_key_is_sha256sum_of_the_key_without_newline() -> None:
    done = subprocess.run(
        ["sha256sum"], input=KEY_A.encode(), capture_output=True, check=True
    )  # printf %s "$KEY" | sha256sum
    assert hash_key(KEY_A) == done.stdout.split()[0].decode()
    assert hash_key(KEY_A) == hashlib.sha256(KEY_A.encode()).hexdigest()


def test_hash_key_cli_reads_stdin_and_makes_new_keys() -> None:
    done = subprocess.run(
        [str(REWARD_SERVER), "hash-key"], input=f"{KEY_A}\n", capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == hash_key(KEY_A)
    new = subprocess.run(
        [str(REWARD_SERVER), "hash-key", "--new"], capture_output=True, text=True, check=True
    )
    fields = dict(line.split(": ", 1) for line in new.stdout.splitlines())
    assert len(fields["key"]) >= 32 and fields["key_sha256"] == hash_key(fields["key"])


def test_api_key_and_api_keys_together_is_a_start_up_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both flags: the real console script stops at once with a message naming both."""
    for name in [n for n in os.environ if n.startswith("REWARD_SERVER_")]:
        monkeypatch.delenv(name)
    path = tmp_path / "keys.yaml"
    path.write_text(keys_yaml(("alpha", KEY_A)))
    done = subprocess.run(
        [str(REWARD_SERVER), "--model", "m", "--api-key", KEY_B, "--api-keys", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "give --api-key or --api-keys, not both" in done.stderr
    assert_no_key_in(done.stderr + done.stdout)
    # the environment variable counts as the flag, and a bad file stops the start too
    monkeypatch.setenv("REWARD_SERVER_API_KEY", KEY_B)
    with pytest.raises(SystemExit):
        parse_settings(["--model", "m", "--api-keys", str(path)])
    monkeypatch.delenv("REWARD_SERVER_API_KEY")
    path.write_text(keys_yaml(("alpha", KEY_A), ("alpha", KEY_B)))
    done = subprocess.run(
        [str(REWARD_SERVER), "--model", "m", "--api-keys", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert f"--api-keys: {path}: tenants[1]: duplicate name 'alpha'" in done.stderr
    assert_no_key_in(done.stderr)


@pytest.fixture(scope="module")
def keys_server(gpt2_rm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A real server with tenants alpha and beta, logging all it can (trace: access lines and
    uvicorn's ASGI messages included)."""
    path = tmp_path_factory.mktemp("keys") / "keys.yaml"
    path.write_text(keys_yaml(("alpha", KEY_A), ("beta", KEY_B)))
    with running_server(gpt2_rm, "--api-keys", str(path), "--log-level", "trace") as server:
        yield server


def test_each_key_is_its_tenant_in_the_metrics(keys_server: ServerProcess) -> None:
    url = keys_server.url
    assert score_as(url, KEY_A, ["a", "bb", "ccc"]).status_code == 200
    assert score_as(url, KEY_B, ["d"]).status_code == 200
    assert tenant_items(url, "alpha") == 3
    assert tenant_items(url, "beta") == 1
    assert metric(url, "reward_server_tenant_tokens_total", tenant="alpha") > metric(
        url, "reward_server_tenant_tokens_total", tenant="beta"
    )
    assert metric(url, "reward_server_tenants") == 2
    labels = {"tenant": "alpha", "endpoint": "/score", "status": "200"}
    assert metric(url, "reward_server_tenant_requests_total", **labels) == 1
    # the server-wide series keep their names and sum over the tenants
    assert metric(url, "reward_server_items_total", endpoint="/score") == 4
    # an error is counted for its tenant; a wrong or missing key for no tenant
    bad = httpx.post(f"{url}/score", json={"texts": []}, headers=bearer(KEY_B), timeout=60)
    assert bad.status_code == 422
    assert metric(url, "reward_server_tenant_errors_total", tenant="beta", status="422") == 1
    assert_error(score_as(url, WRONG, ["x"]), 401, "unauthorized")
    assert_error(score_as(url, None, ["x"]), 401, "unauthorized")
    assert_error(score_as(url, hash_key(KEY_A), ["x"]), 401, "unauthorized")
    text = httpx.get(f"{url}/metrics", timeout=30).text
    tenants = {
        line.split('tenant="')[1].split('"')[0] for line in text.splitlines() if 'tenant="' in line
    }
    assert tenants == {"alpha", "beta"}
    assert_no_key_in(text)
    # every protocol endpoint takes the tenants' keys too, and /info says auth is on
    info = httpx.get(f"{url}/info", headers=bearer(KEY_B), timeout=30)
    assert info.status_code == 200 and info.json()["auth"] is True
    reward = httpx.post(f"{url}/get_reward", json={"query": ["q"]}, headers=bearer(KEY_A))
    assert reward.status_code == 200
    assert tenant_items(url, "alpha") == 4


def test_keys_never_reach_the_log(keys_server: ServerProcess) -> None:
    url = keys_server.url
    assert score_as(url, KEY_A, ["a"]).status_code == 200
    assert score_as(url, WRONG, ["a"]).status_code == 401
    wait_until(lambda: "/score" in keys_server.log(), 30, "the access log line")
    assert_no_key_in(keys_server.log())


def test_reloads_on_sighup_on_change_and_keeps_the_old_keys_on_a_bad_file(
    gpt2_rm: Path, tmp_path: Path
) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(keys_yaml(("alpha", KEY_A), ("beta", KEY_B)))
    with running_server(gpt2_rm, "--api-keys", str(path), "--log-level", "debug") as server:
        url = server.url
        assert score_as(url, KEY_B, ["a"]).status_code == 200

        # SIGHUP. beta's key is swapped for gamma's in place, with the file's size, inode and
        # mtime kept, so the change poll cannot see it: only the signal reloads.
        before = os.stat(path)
        swapped = keys_yaml(("alpha", KEY_A), ("beta", KEY_C))
        assert len(swapped) == before.st_size
        with path.open("r+") as f:
            f.write(swapped)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        server.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "SIGHUP: reloaded" in server.log(), 30, "the reload on SIGHUP")
        assert server.proc.poll() is None  # SIGHUP no longer ends the server
        assert_error(score_as(url, KEY_B, ["a"]), 401, "unauthorized")  # the removed key, at once
        assert score_as(url, KEY_C, ["a", "b"]).status_code == 200
        assert tenant_items(url, "beta") == 3  # one item with the old key, two with the new

        # A change of the file: a new tenant, and alpha removed.
        ok = reloads(url, "ok")
        path.write_text(keys_yaml(("beta", KEY_C), ("gamma", KEY_A)))
        wait_until(lambda: reloads(url, "ok") > ok, 30, "the reload on change")
        assert "keys file changed: reloaded" in server.log()
        assert score_as(url, KEY_A, ["a"]).status_code == 200
        assert tenant_items(url, "gamma") == 1
        assert metric(url, "reward_server_tenants") == 2

        # A malformed file: the old tenants stay, and the log says why (WARNING).
        path.write_text(f"tenants:\n  - name: gamma\n    key_sha256: {KEY_B}\n")
        wait_until(lambda: reloads(url, "error") == 1, 30, "the failed reload")
        assert score_as(url, KEY_A, ["a"]).status_code == 200
        assert score_as(url, KEY_C, ["a"]).status_code == 200
        assert_error(score_as(url, KEY_B, ["a"]), 401, "unauthorized")
        warning = next(line for line in server.log().splitlines() if "not reloaded" in line)
        assert "WARNING" in warning and "must be the 64 hex digits" in warning
        # SIGHUP on the bad file: again kept
        server.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: reloads(url, "error") == 2, 30, "the failed reload on SIGHUP")
        assert score_as(url, KEY_A, ["a"]).status_code == 200

        # Fixed: gamma's key removed takes effect from the next request.
        path.write_text(keys_yaml(("beta", KEY_C)))
        wait_until(lambda: reloads(url, "ok") > ok + 1, 30, "the reload of the fixed file")
        assert_error(score_as(url, KEY_A, ["a"]), 401, "unauthorized")
        assert score_as(url, KEY_C, ["a"]).status_code == 200
        log = server.log()
    assert server.proc.returncode == 0  # a clean shutdown after all that
    assert_no_key_in(log)


def test_a_single_api_key_is_the_default_tenant(gpt2_rm: Path) -> None:
    with running_server(gpt2_rm, env={"REWARD_SERVER_API_KEY": KEY_A}) as server:
        url = server.url
        assert score_as(url, KEY_A, ["a", "b"]).status_code == 200
        assert_error(score_as(url, KEY_B, ["a"]), 401, "unauthorized")
        assert_error(score_as(url, None, ["a"]), 401, "unauthorized")
        assert tenant_items(url, "default") == 2
        assert metric(url, "reward_server_tenants") == 1
        assert_no_key_in(server.log())
