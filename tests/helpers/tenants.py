"""Tenants in tests: the keys of the tests' tenants (never in a file or a log: the keys file
holds their hashes, :func:`helpers.models_files.keys_yaml`), and a tenant's requests and
counts."""

from __future__ import annotations

import httpx
from server_proc import metric

from helpers.posting import bearer

# Keys of the tests' tenants; none of them may ever appear in a file or a log.
KEY_A = "alpha-key-5b0c61a7e2"
KEY_B = "beta-key-93d1f04c88"
KEY_C = "gamma-key-0e7a2b9d14"
WRONG = "wrong-key-7c3e55aa01"
ALL_KEYS = (KEY_A, KEY_B, KEY_C, WRONG)


def score_as(url: str, key: str | None, texts: list[str]) -> httpx.Response:
    """POST /score of ``texts`` with ``key`` (none: without one); the answer as it is."""
    headers = bearer(key) if key is not None else {}
    return httpx.post(f"{url}/score", json={"texts": texts}, headers=headers, timeout=60)


def tenant_items(url: str, tenant: str) -> float:
    """Items the server scored for ``tenant`` so far."""
    return metric(url, "reward_server_tenant_items_total", tenant=tenant)


def reloads(url: str, outcome: str) -> float:
    """Reloads of the keys file with ``outcome`` so far."""
    return metric(url, "reward_server_tenant_reloads_total", outcome=outcome)


def assert_no_key_in(text: str) -> None:
    """None of the tests' keys is in ``text`` (a file, a log, a message)."""
    for key in ALL_KEYS:
        assert key not in text
