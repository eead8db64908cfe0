"""Tenants (issue 23): the keys file (``--api-keys``), authentication by SHA-256 in constant
time, reload on SIGHUP and on change, and the per-tenant metrics.

Here the keys file is parsed and the auth dependency's context checked in process; the key
command line and the real ``reward-server`` with a tiny model, keys over real HTTP, are in
test_tenants_server.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from helpers.fakes import FakeModel, settings
from helpers.models_files import keys_yaml
from helpers.posting import bearer
from helpers.tenants import KEY_A, KEY_B, KEY_C, WRONG, assert_no_key_in

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

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "api_keys.yaml"

# --------------------------------------------------------------------------- the file


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
