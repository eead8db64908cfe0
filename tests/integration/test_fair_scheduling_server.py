"""Per-tenant rate limits in a real server: a rate-limited tenant gets a 429 with a Retry-After
and the other tenant is served. The scheduling itself is tested in test_fair_scheduling.py."""

from __future__ import annotations

from pathlib import Path

import httpx
from server_proc import metric, running_server

from reward_server.config.tenants import hash_key

KEY_SLOW = "slow-tenant-key-4e1f0a9b"
KEY_FREE = "free-tenant-key-77c2d5e0"


def test_a_rate_limited_tenant_gets_429_and_the_other_is_served(
    gpt2_rm: Path, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(
        "tenants:\n"
        f'  - {{name: slow, key_sha256: "{hash_key(KEY_SLOW)}", tokens_per_s: 5}}\n'
        f'  - {{name: free, key_sha256: "{hash_key(KEY_FREE)}", weight: 2}}\n'
    )
    sent = iter(range(1000))

    def texts() -> list[str]:
        # Tens of tokens (a bucket of 5 is far short), new ones each time (no cache hit).
        return [" ".join([f"tokens {next(sent)}"] * 4) for _ in range(2)]

    with running_server(gpt2_rm, "--api-keys", str(keys)) as server:

        def post(key: str) -> httpx.Response:
            return httpx.post(
                f"{server.url}/score",
                json={"texts": texts()},
                headers={"Authorization": f"Bearer {key}"},
                timeout=60,
            )

        # A full bucket admits one request larger than itself; it leaves a debt.
        assert post(KEY_SLOW).status_code == 200
        refused = post(KEY_SLOW)
        sent_tokens = metric(server.url, "reward_server_tenant_tokens_total", tenant="slow")
        assert refused.status_code == 429
        body = refused.json()
        assert body["type"] == "tenant_limit"
        assert "'slow'" in body["error"] and "rate limit of 5 tokens/s" in body["error"]
        # Until the bucket is back from 5 - tokens to 5: tokens / 5 s, less the time since.
        assert 10 < sent_tokens < 140
        retry_after = int(refused.headers["retry-after"])
        assert sent_tokens / 5 - 5 <= retry_after <= sent_tokens / 5 + 1
        # The other tenant is not affected, and its queue wait is its own series.
        assert post(KEY_FREE).status_code == 200
        assert metric(server.url, "reward_server_tenant_queue_wait_seconds_count", tenant="free")
        assert (
            metric(server.url, "reward_server_tenant_queue_wait_seconds_count", tenant="slow") == 2
        )
        assert metric(server.url, "reward_server_errors_total", status="429", type="tenant_limit")
