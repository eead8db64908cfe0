"""Tenants (issue 23): the keys file (``--api-keys``), authentication by SHA-256 in constant
time, reload on SIGHUP and on change, and the per-tenant metrics.

The keys file is parsed and the auth dependency's context checked in process; everything
else runs against the real ``reward-server`` with a tiny model, keys over real HTTP.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_proc import REWARD_SERVER, ServerProcess, metric, running_server, wait_until
from test_server_api import FakeModel, assert_error, settings

from reward_server.cli import parse_settings
from reward_server.config import tenants as tenants_module
from reward_server.config.tenants import (
    DEFAULT_TENANT,
    Tenant,
    TenantKeys,
    TenantsFileError,
    current_tenant,
    hash_key,
    parse_tenants_file,
    read_tenants_file,
)
from reward_server.http.app import create_app
from reward_server.http.auth import Authorized

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "api_keys.yaml"

# Keys of the tests' tenants; none of them may ever appear in a file or a log.
KEY_A = "alpha-key-5b0c61a7e2"
KEY_B = "beta-key-93d1f04c88"
KEY_C = "gamma-key-0e7a2b9d14"
WRONG = "wrong-key-7c3e55aa01"
ALL_KEYS = (KEY_A, KEY_B, KEY_C, WRONG)


def keys_yaml(*entries: tuple[str, str], extra: str = "") -> str:
    """A keys file of ``(name, key)`` entries: only the keys' hashes are written."""
    lines = ["tenants:"]
    for name, key in entries:
        lines += [f"  - name: {name}", f'    key_sha256: "{hash_key(key)}"']
        lines += [f"    {extra}"] if extra else []
    return "\n".join(lines) + "\n"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def score(url: str, key: str | None, texts: list[str]) -> httpx.Response:
    headers = bearer(key) if key is not None else {}
    return httpx.post(f"{url}/score", json={"texts": texts}, headers=headers, timeout=60)


def tenant_items(url: str, tenant: str) -> float:
    return metric(url, "reward_server_tenant_items_total", tenant=tenant)


def reloads(url: str, outcome: str) -> float:
    return metric(url, "reward_server_tenant_reloads_total", outcome=outcome)


def assert_no_key_in(text: str) -> None:
    for key in ALL_KEYS:
        assert key not in text


# --------------------------------------------------------------------------- the file


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


def test_every_tenant_authenticates_as_itself_and_others_as_none(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(keys_yaml(("alpha", KEY_A), ("beta", KEY_B), ("gamma", KEY_C)))
    assert_no_key_in(path.read_text())  # the file holds only hashes
    table = read_tenants_file(path)
    assert table.names == ["alpha", "beta", "gamma"]
    for name, key in (("alpha", KEY_A), ("beta", KEY_B), ("gamma", KEY_C)):
        found = table.authenticate(key)
        assert found is not None and found.name == name
    assert table.authenticate(WRONG) is None
    assert table.authenticate(hash_key(KEY_A)) is None  # the hash is not a key
    assert table.authenticate("") is None


def test_every_digest_is_compared_whichever_matches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No early exit: the first tenant's key, the last one's and a wrong key each cost one
    constant-time comparison per tenant."""
    keys = [f"key-{i}-{'x' * i}" for i in range(5)]
    path = tmp_path / "keys.yaml"
    path.write_text(keys_yaml(*((f"t{i}", key) for i, key in enumerate(keys))))
    table = read_tenants_file(path)
    calls: list[int] = []
    real = tenants_module.hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(1)
        return real(a, b)

    monkeypatch.setattr(tenants_module.hmac, "compare_digest", counting)
    for key, name in ((keys[0], "t0"), (keys[-1], "t4"), (WRONG, None)):
        calls.clear()
        found = table.authenticate(key)
        assert (found.name if found else None) == name
        assert len(calls) == len(keys)


def test_example_file_loads_with_its_documented_keys() -> None:
    table = read_tenants_file(EXAMPLE)
    assert table.names == ["sweep", "grpo-main", "eval"]
    sweep, grpo, _ = table.tenants
    assert sweep == Tenant("sweep", weight=1.0, tokens_per_s=50000.0, queue_share=0.5)
    assert grpo.weight == 2.0 and grpo.tokens_per_s is None and grpo.queue_share is None
    assert table.authenticate("replace-me-grpo") == grpo


GOOD = {"name": "a", "key_sha256": hash_key(KEY_A)}


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (None, "is empty"),
        ([GOOD], "must be a mapping with a 'tenants' list"),
        ({"tenants": []}, "tenants: List should have at least 1 item"),
        ({"tenants": [GOOD], "owners": 1}, "top level: unknown key 'owners'"),
        ({"tenants": [{**GOOD, "wieght": 2}]}, "tenants[0]: unknown key 'wieght'"),
        ({"tenants": [{"name": "a"}]}, "tenants[0]: 'key_sha256' is required"),
        ({"tenants": [{**GOOD, "key_sha256": KEY_A}]}, "tenants[0].key_sha256: must be the 64"),
        ({"tenants": [{**GOOD, "key_sha256": "g" * 64}]}, "64 hex digits"),
        ({"tenants": [{**GOOD, "key_sha256": 12345}]}, "quote it in YAML"),
        (
            {"tenants": [GOOD, {**GOOD, "key_sha256": hash_key(KEY_B)}]},
            "tenants[1]: duplicate name 'a' (also tenants[0])",
        ),
        (
            {"tenants": [GOOD, {**GOOD, "name": "b"}]},
            "tenants[1] ('b') has the same key_sha256 as tenants[0]",
        ),
        ({"tenants": [{**GOOD, "name": "a b"}]}, "tenants[0].name: a tenant name is 1-64"),
        ({"tenants": [{**GOOD, "weight": 0}]}, "tenants[0].weight: Input should be greater"),
        ({"tenants": [{**GOOD, "queue_share": 1.5}]}, "tenants[0].queue_share"),
        ({"tenants": [{**GOOD, "tokens_per_s": -1}]}, "tenants[0].tokens_per_s"),
    ],
)
def test_bad_keys_files_say_where_and_never_echo_a_key(data: object, needle: str) -> None:
    with pytest.raises(TenantsFileError) as caught:
        parse_tenants_file(data, "keys.yaml")
    message = str(caught.value)
    assert needle in message, message
    assert_no_key_in(message)


def test_unreadable_or_invalid_yaml_file(tmp_path: Path) -> None:
    with pytest.raises(TenantsFileError, match="cannot read keys file"):
        read_tenants_file(tmp_path / "missing.yaml")
    path = tmp_path / "keys.yaml"
    path.write_text(f"tenants: [{{name: a, key_sha256: {KEY_A}\n")  # a key pasted, broken
    with pytest.raises(TenantsFileError, match=r"is not valid YAML \(line") as caught:
        read_tenants_file(path)
    assert_no_key_in(str(caught.value))


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


def test_settings_tenants_per_flag(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(keys_yaml(("alpha", KEY_A)))
    assert settings().tenants is None
    single = settings(api_key=KEY_A).tenants
    assert single is not None and single.authenticate(KEY_A) == DEFAULT_TENANT
    filed = settings(api_keys=str(path)).tenants
    assert filed is not None and filed.authenticate(KEY_A) == Tenant("alpha")


def test_a_failed_reload_keeps_the_table_and_a_good_one_swaps_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(keys_yaml(("alpha", KEY_A)))
    outcomes: list[bool] = []
    keys = TenantKeys(read_tenants_file(path), path, on_reload=outcomes.append)
    assert not keys.poll()  # unchanged: not even read
    path.write_text(f"tenants:\n  - name: alpha\n    key_sha256: {KEY_B}\n")
    assert not keys.poll() and outcomes == [False]
    assert keys.authenticate(KEY_A) == Tenant("alpha")
    assert "not reloaded, the old tenants stay: " in caplog.text
    assert not keys.poll() and outcomes == [False]  # a broken file is reported once
    path.unlink()
    assert not keys.poll() and outcomes == [False, False]  # gone: the old keys stay
    path.write_text(keys_yaml(("beta", KEY_B)))
    assert keys.poll() and outcomes == [False, False, True]
    assert keys.authenticate(KEY_A) is None
    assert keys.authenticate(KEY_B) == Tenant("beta")
    assert_no_key_in(caplog.text)


# --------------------------------------------------------------------------- the request's tenant


def test_the_tenant_is_seen_by_the_route_and_the_tasks_it_starts(tmp_path: Path) -> None:
    """The auth dependency sets current_tenant in the request's own task: the route and a
    task it starts read it, and concurrent requests of two tenants never see each other's."""
    path = tmp_path / "keys.yaml"
    path.write_text(keys_yaml(("alpha", KEY_A), ("beta", KEY_B)))
    app = create_app(settings(api_keys=str(path)), model=FakeModel())
    both_in = asyncio.Barrier(2)

    async def whoami(tenant: Authorized) -> dict[str, str]:
        await both_in.wait()  # both requests in flight together
        started = asyncio.create_task(asyncio.sleep(0, current_tenant.get().name))
        return {"dep": tenant.name, "route": current_tenant.get().name, "task": await started}

    app.add_api_route("/whoami", whoami)

    async def scenario() -> list[httpx.Response]:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://rm") as http:
                return list(
                    await asyncio.gather(
                        http.get("/whoami", headers=bearer(KEY_A)),
                        http.get("/whoami", headers=bearer(KEY_B)),
                    )
                )

    alpha, beta = asyncio.run(scenario())
    assert alpha.json() == {"dep": "alpha", "route": "alpha", "task": "alpha"}
    assert beta.json() == {"dep": "beta", "route": "beta", "task": "beta"}
    assert current_tenant.get() is DEFAULT_TENANT  # outside a request


# --------------------------------------------------------------------------- real servers


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
    assert score(url, KEY_A, ["a", "bb", "ccc"]).status_code == 200
    assert score(url, KEY_B, ["d"]).status_code == 200
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
    assert_error(score(url, WRONG, ["x"]), 401, "unauthorized")
    assert_error(score(url, None, ["x"]), 401, "unauthorized")
    assert_error(score(url, hash_key(KEY_A), ["x"]), 401, "unauthorized")
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
    assert score(url, KEY_A, ["a"]).status_code == 200
    assert score(url, WRONG, ["a"]).status_code == 401
    wait_until(lambda: "/score" in keys_server.log(), 30, "the access log line")
    assert_no_key_in(keys_server.log())


def test_reloads_on_sighup_on_change_and_keeps_the_old_keys_on_a_bad_file(
    gpt2_rm: Path, tmp_path: Path
) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(keys_yaml(("alpha", KEY_A), ("beta", KEY_B)))
    with running_server(gpt2_rm, "--api-keys", str(path), "--log-level", "debug") as server:
        url = server.url
        assert score(url, KEY_B, ["a"]).status_code == 200

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
        assert_error(score(url, KEY_B, ["a"]), 401, "unauthorized")  # the removed key, at once
        assert score(url, KEY_C, ["a", "b"]).status_code == 200
        assert tenant_items(url, "beta") == 3  # one item with the old key, two with the new

        # A change of the file: a new tenant, and alpha removed.
        ok = reloads(url, "ok")
        path.write_text(keys_yaml(("beta", KEY_C), ("gamma", KEY_A)))
        wait_until(lambda: reloads(url, "ok") > ok, 30, "the reload on change")
        assert "keys file changed: reloaded" in server.log()
        assert score(url, KEY_A, ["a"]).status_code == 200
        assert tenant_items(url, "gamma") == 1
        assert metric(url, "reward_server_tenants") == 2

        # A malformed file: the old tenants stay, and the log says why (WARNING).
        path.write_text(f"tenants:\n  - name: gamma\n    key_sha256: {KEY_B}\n")
        wait_until(lambda: reloads(url, "error") == 1, 30, "the failed reload")
        assert score(url, KEY_A, ["a"]).status_code == 200
        assert score(url, KEY_C, ["a"]).status_code == 200
        assert_error(score(url, KEY_B, ["a"]), 401, "unauthorized")
        warning = next(line for line in server.log().splitlines() if "not reloaded" in line)
        assert "WARNING" in warning and "must be the 64 hex digits" in warning
        # SIGHUP on the bad file: again kept
        server.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: reloads(url, "error") == 2, 30, "the failed reload on SIGHUP")
        assert score(url, KEY_A, ["a"]).status_code == 200

        # Fixed: gamma's key removed takes effect from the next request.
        path.write_text(keys_yaml(("beta", KEY_C)))
        wait_until(lambda: reloads(url, "ok") > ok + 1, 30, "the reload of the fixed file")
        assert_error(score(url, KEY_A, ["a"]), 401, "unauthorized")
        assert score(url, KEY_C, ["a"]).status_code == 200
        log = server.log()
    assert server.proc.returncode == 0  # a clean shutdown after all that
    assert_no_key_in(log)


def test_a_single_api_key_is_the_default_tenant(gpt2_rm: Path) -> None:
    with running_server(gpt2_rm, env={"REWARD_SERVER_API_KEY": KEY_A}) as server:
        url = server.url
        assert score(url, KEY_A, ["a", "b"]).status_code == 200
        assert_error(score(url, KEY_B, ["a"]), 401, "unauthorized")
        assert_error(score(url, None, ["a"]), 401, "unauthorized")
        assert tenant_items(url, "default") == 2
        assert metric(url, "reward_server_tenants") == 1
        assert_no_key_in(server.log())
