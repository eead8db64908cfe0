"""``dns+http://`` base URLs: the client follows the addresses of a name as replicas come and go.

The pool's decisions with a fake clock and a stub resolver; the Host header and TLS name on
a mock transport. Real servers on 127.0.0.x loopback addresses behind a stub resolver that
returns 2, then 3, then 1 of them under concurrent load: test_client_dns_servers.py.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from helpers.dns import FakeClock, StubResolver
from helpers.mock_answers import mock_answer

from ppo_client.config import PPOConfig
from ppo_client.reward import default_reward_fn
from reward_client import AsyncRewardClient, RewardClient
from reward_client.integrations.trl import RemoteReward
from reward_client.targets import MIN_RESOLVE_GAP, EndpointPool, Target, normalise_urls


def urls(pool: EndpointPool) -> list[str]:
    return [t.url for t in pool.targets()]


# --- the pool ---------------------------------------------------------------------------------


def test_normalise_urls_accepts_dns_schemes_and_rejects_others() -> None:
    assert normalise_urls(["dns+http://rm:8000/", " http://a:1 "]) == [
        "dns+http://rm:8000",
        "http://a:1",
    ]
    with pytest.raises(ValueError, match="dns\\+http://"):
        normalise_urls("dns://rm:8000")
    with pytest.raises(ValueError, match="no host name"):
        normalise_urls("dns+http://:8000")
    with pytest.raises(ValueError, match="bad port"):
        normalise_urls("dns+http://rm:99999")


def test_pool_resolves_before_first_use_then_every_interval() -> None:
    clock, resolver = FakeClock(), StubResolver(rm=["10.0.0.1", "10.0.0.2"])
    pool = EndpointPool(
        ["dns+http://rm:8000", "http://fixed:9"], resolver=resolver, resolve_interval=5, clock=clock
    )
    assert pool.dynamic and pool.due()
    assert urls(pool) == ["http://rm:8000", "http://fixed:9"]  # unresolved: the name itself
    pool.refresh()
    assert urls(pool) == ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://fixed:9"]
    assert resolver.calls == [("rm", 8000)]
    clock.now += 4.9
    assert not pool.due()
    pool.refresh()  # not due: nothing asked
    assert len(resolver.calls) == 1
    clock.now += 0.1
    assert pool.due()
    # A new address is appended, one that left is dropped, the order of the rest is kept
    # whatever order DNS answers in.
    resolver.set("rm", ["10.0.0.3", "10.0.0.2"])
    pool.refresh()
    assert urls(pool) == ["http://10.0.0.2:8000", "http://10.0.0.3:8000", "http://fixed:9"]


def test_pool_keeps_last_addresses_when_resolution_fails_or_is_empty() -> None:
    clock, resolver = FakeClock(), StubResolver(rm=["10.0.0.1"])
    pool = EndpointPool(["dns+http://rm:80"], resolver=resolver, resolve_interval=1, clock=clock)
    pool.refresh()
    resolver.error = OSError("Temporary failure in name resolution")
    clock.now += 1
    pool.refresh()
    assert urls(pool) == ["http://10.0.0.1:80"]
    assert not pool.due()  # tried: the next try waits for the interval
    resolver.error = None
    resolver.set("rm", [])
    clock.now += 1
    pool.refresh()
    assert urls(pool) == ["http://10.0.0.1:80"]


def test_failure_brings_the_next_resolution_forward() -> None:
    clock, resolver = FakeClock(), StubResolver(rm=["10.0.0.1", "10.0.0.2"])
    pool = EndpointPool(["dns+http://rm:80"], resolver=resolver, resolve_interval=30, clock=clock)
    pool.refresh()
    pool.failed(Target("http://fixed:1"))  # a fixed URL: nothing to resolve
    clock.now += MIN_RESOLVE_GAP
    assert not pool.due()
    pool.failed(pool.targets()[0])
    assert pool.due()  # at most MIN_RESOLVE_GAP after the last resolution


def test_targets_carry_host_and_tls_name() -> None:
    resolver = StubResolver(rm=["10.0.0.1", "fd00::7"])
    pool = EndpointPool(["dns+https://rm/prefix", "dns+http://rm:8080"], resolver=resolver)
    pool.refresh()
    assert pool.targets() == [
        Target("https://10.0.0.1:443/prefix", "rm", "rm"),
        Target("https://[fd00::7]:443/prefix", "rm", "rm"),
        Target("http://10.0.0.1:8080", "rm:8080", None),
        Target("http://[fd00::7]:8080", "rm:8080", None),
    ]


# --- the clients on a mock transport ----------------------------------------------------------


def test_sync_client_sends_to_addresses_with_the_name_as_host() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return mock_answer(request)

    resolver = StubResolver(rm=["10.0.0.1", "10.0.0.2"])
    with RewardClient(
        "dns+https://rm:8443",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
        resolver=resolver,
    ) as client:
        assert client.score(texts=["a", "b", "c", "d", "e", "f"]) == [1.0] * 6
    assert {r.url.host for r in seen} == {"10.0.0.1", "10.0.0.2"}
    assert {r.headers["host"] for r in seen} == {"rm:8443"}
    assert {r.extensions.get("sni_hostname") for r in seen} == {"rm"}
    assert resolver.calls == [("rm", 8443)]  # once for the whole call


def test_async_client_and_remote_reward_follow_dns() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(f"{request.url.host} {request.headers['host']}")
        return mock_answer(request)

    resolver = StubResolver(rm=["10.0.0.1", "10.0.0.2", "10.0.0.3"])

    async def main() -> None:
        transport = httpx.MockTransport(handler)
        async with AsyncRewardClient(
            "dns+http://rm:8000",
            http_client=httpx.AsyncClient(transport=transport),
            resolver=resolver,
        ) as client:
            assert await client.score(texts=["x"] * 6) == [1.0] * 6
        reward = RemoteReward(
            "dns+http://rm:8000",
            http_client=httpx.AsyncClient(transport=transport),
            resolver=resolver,
        )
        assert await reward(prompts=["p"] * 2, completions=["c"] * 2) == [1.0] * 2

    asyncio.run(main())
    assert {s.split()[0] for s in seen} == {"10.0.0.1", "10.0.0.2", "10.0.0.3"}
    assert {s.split()[1] for s in seen} == {"rm:8000"}


def test_trainer_reward_url_takes_dns_urls() -> None:
    client = default_reward_fn(PPOConfig(reward_url="dns+http://rm.ns.svc:8000,http://b:1"))
    assert isinstance(client, RewardClient)
    assert client.base_urls == ["dns+http://rm.ns.svc:8000", "http://b:1"]
    client.close()
