"""``dns+http://`` base URLs against real servers: the certificate checked against the name over
HTTPS, and a client following replicas as the name's addresses change. The pool's decisions
with a fake clock and a stub resolver are in test_client_dns.py."""

from __future__ import annotations

import datetime
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from helpers.dns import FakeClock, StubResolver
from helpers.mock_answers import mock_answer
from server_proc import ServerProcess, free_port, start_server, wait_until

from reward_client import RewardClient
from tiny_models import make_corpus

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

#: The client's re-resolve period, on its fake clock (the default is DEFAULT_RESOLVE_INTERVAL).
RESOLVE_INTERVAL = 30.0
ADDRESSES = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
SCORED = 'reward_server_requests_total{endpoint="/score",status="200"}'


def scored(server: ServerProcess) -> int:
    """The server's count of answered /score requests (from its /metrics)."""
    for line in httpx.get(f"{server.url}/metrics", timeout=30).text.splitlines():
        if line.startswith(SCORED + " "):
            return int(float(line.split()[-1]))
    return 0


class SendLog:
    """Which address each /score request was sent to, in which phase of the test (an httpx
    hook); the test moves to the next phase while no request is in flight."""

    def __init__(self) -> None:
        self.phase = 0
        self.sent: list[tuple[int, str]] = []
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> None:
        if request.url.path == "/score":
            with self.lock:
                self.sent.append((self.phase, request.url.host))

    def counts(self, phase: int | None = None) -> dict[str, int]:
        """Requests per address sent in ``phase`` (None: in all)."""
        with self.lock:
            hosts = [host for p, host in self.sent if phase is None or p == phase]
        return {address: hosts.count(address) for address in ADDRESSES}


def load(client: RewardClient, texts: list[str], expected: list[float], calls: int = 4) -> None:
    """Three threads that each make ``calls`` scoring calls through ``client`` at once, every
    answer checked; returns when all are done (nothing is in flight then)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _ in range(calls):
                assert client.score(texts=texts) == pytest.approx(expected, abs=1e-6)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads), "a scoring call hung"
    assert not errors, errors[:3]


def self_signed(name: str, folder: Path) -> tuple[Path, Path]:
    """A certificate for DNS name ``name`` only (no IP address) and its key, as files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def test_https_checks_the_certificate_against_the_name(tmp_path: Path) -> None:
    cert, key = self_signed("rm.test", tmp_path)
    hosts: list[str] = []

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """A TLS reward server that scores 1.0 and records the Host header."""
        if scope["type"] != "http":
            return
        hosts.append(dict(scope["headers"])[b"host"].decode())
        request = httpx.Request("POST", "/", content=(await receive())["body"])
        response = mock_answer(request)
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
        wait_until(lambda: server.started, 30, "the HTTPS server to start")
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
