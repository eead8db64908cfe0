"""``dns+http://`` base URLs against real servers: the certificate checked against the name over
HTTPS, and a client following replicas as the name's addresses change. The pool's decisions
with a fake clock and a stub resolver are in test_client_dns.py."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from server_proc import ServerProcess, free_port, start_server
from test_client_dns import (
    ADDRESSES,
    RESOLVE_INTERVAL,
    FakeClock,
    Receive,
    Send,
    SendLog,
    StubResolver,
    _answer,
    _self_signed,
    load,
    scored,
    wait_for,
)

from reward_client import RewardClient
from tiny_models import make_corpus


def test_https_checks_the_certificate_against_the_name(tmp_path: Path) -> None:
    cert, key = _self_signed("rm.test", tmp_path)
    hosts: list[str] = []

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """A TLS reward server that scores 1.0 and records the Host header."""
        if scope["type"] != "http":
            return
        hosts.append(dict(scope["headers"])[b"host"].decode())
        request = httpx.Request("POST", "/", content=(await receive())["body"])
        response = _answer(request)
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": response.content})

    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.2",
        port=port,
        ssl_certfile=str(cert),
        ssl_keyfile=str(key),
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 30)
        trusted = ssl.create_default_context(cafile=str(cert))
        # The address alone fails the certificate check: it names rm.test, not 127.0.0.2 ...
        with pytest.raises(httpx.ConnectError, match="certificate"):
            httpx.get(f"https://127.0.0.2:{port}/", verify=trusted)
        # ... so the client, which connects to the address, must present and check the name.
        with (
            httpx.Client(verify=trusted) as http,
            RewardClient(
                f"dns+https://rm.test:{port}",
                http_client=http,
                resolver=StubResolver(rm_test=["127.0.0.2"]),
                max_client_batch=2,
                retry_timeout=0,
            ) as client,
        ):
            assert client.score(texts=["a", "b", "c"]) == [1.0] * 3
        assert hosts == [f"rm.test:{port}"] * 2
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture(scope="module")
def replicas(bert_rm: Path) -> Iterator[tuple[int, dict[str, ServerProcess]]]:
    """Three real servers of one model, one per loopback address, all on one port."""
    port = free_port()
    servers: dict[str, ServerProcess] = {}
    try:
        for address in ADDRESSES:
            server = start_server(bert_rm, "--host", address, port=port)  # the last --host wins
            server.url = f"http://{address}:{port}"
            servers[address] = server
        for server in servers.values():
            server.wait_ready(180)
        yield port, servers
    finally:
        for server in servers.values():
            server.stop()
            server.log_path.unlink(missing_ok=True)


def test_client_follows_replicas_as_dns_changes(
    replicas: tuple[int, dict[str, ServerProcess]],
) -> None:
    """Concurrent load while the name resolves to 2, then 3, then 1 of the servers; the
    client's clock is fake, so which requests see which answer depends on no timing."""
    port, servers = replicas
    a, b, c = ADDRESSES
    texts = make_corpus(6, seed=3)
    answer = httpx.post(f"{servers[a].url}/score", json={"texts": texts}, timeout=60)
    expected = answer.json()["scores"]
    served_before = {address: scored(server) for address, server in servers.items()}
    resolver, log, clock = StubResolver(rm_test=[a, b]), SendLog(), FakeClock()

    def sleep(seconds: float) -> None:  # a retry (none is expected) spends fake time only
        clock.now += seconds

    http = httpx.Client(timeout=60, event_hooks={"request": [log]})
    client = RewardClient(
        f"dns+http://rm.test:{port}",
        http_client=http,
        resolver=resolver,
        resolve_interval=RESOLVE_INTERVAL,
        clock=clock,
        sleep=sleep,
        max_client_batch=2,  # three requests per call, sent concurrently
        max_concurrency=3,
        retry_timeout=120,
    )
    with http, client:
        # Phase 0, two addresses: round-robin over both (36 requests), none to the third.
        load(client, texts, expected)
        assert log.counts(0) == {a: 18, b: 18, c: 0}
        # Phase 1, a third replica in DNS, within the re-resolve period: not asked yet.
        log.phase = 1
        resolver.set("rm.test", ADDRESSES)
        clock.now += RESOLVE_INTERVAL - 1
        load(client, texts, expected)
        assert log.counts(1) == {a: 18, b: 18, c: 0}
        assert len(resolver.calls) == 1
        # Phase 2, the period over: resolved once more, and the new one gets its equal share.
        log.phase = 2
        clock.now += 1
        load(client, texts, expected)
        assert log.counts(2) == {a: 12, b: 12, c: 12}
        assert len(resolver.calls) == 2
        # Phase 3, scaled down to one: the others get nothing from the next resolution on ...
        log.phase = 3
        resolver.set("rm.test", [b])
        clock.now += RESOLVE_INTERVAL
        load(client, texts, expected)
        assert log.counts(3) == {a: 0, b: 36, c: 0}
        # ... each answered every request it was sent (none failed on the way) ...
        for gone in (a, c):
            assert scored(servers[gone]) - served_before[gone] == log.counts()[gone]
        # ... and they can go away as a scale-down stops them, without a failed request.
        servers[a].stop()
        servers[c].stop()
        log.phase = 4
        clock.now += RESOLVE_INTERVAL
        load(client, texts, expected)
        assert log.counts(4) == {a: 0, b: 36, c: 0}
    assert scored(servers[b]) - served_before[b] == log.counts()[b]
    assert len(resolver.calls) == 4 and set(resolver.calls) == {("rm.test", port)}
