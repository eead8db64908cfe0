"""RewardClient and AsyncRewardClient over real sockets: a read timeout, a refused connection and a
server restarted on the same port. The decisions behind them, with a fake clock and a mock
transport, are in test_client.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.clients import FAST
from server_proc import ServerProcess, score_requests, start_server

from reward_client import (
    AsyncRewardClient,
    RetryEvent,
    RewardClient,
    RewardServerError,
)
from reward_server.launcher import EPHEMERAL_RANGE, LOWEST_PORT, free_port
from tiny_models import make_corpus


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


def test_real_read_timeout(silent_port: int) -> None:
    url = f"http://127.0.0.1:{silent_port}"
    client = RewardClient(url, timeout=0.2, max_retries=1, max_client_batch=4, retry=FAST)
    with (
        client,
        pytest.raises(RewardServerError, match="failed after 2 attempts: timed out") as info,
    ):
        client.score(texts=["abc"])
    assert info.value.url == f"{url}/score"


def test_real_connection_refused_async() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again when the block ends: nothing listens

    async def main() -> None:
        async with AsyncRewardClient(
            f"http://127.0.0.1:{port}", max_retries=0, max_client_batch=4
        ) as client:
            await client.score(texts=["abc"])

    with pytest.raises(RewardServerError, match=r"ConnectError") as info:
        asyncio.run(main())
    assert str(info.value).startswith(f"POST http://127.0.0.1:{port}/score failed: ")


def test_a_call_outlasts_a_server_restart_on_the_same_port(
    bert_rm: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each face in turn: its server is killed, the call's first failed attempt brings it
    back on the same port, and the restarted server answers the call."""
    texts = make_corpus(6, seed=2)
    servers = [start_server(bert_rm)]
    port = servers[0].port
    url = servers[0].url
    events: list[RetryEvent] = []
    restarts: list[threading.Thread] = []

    def on_retry(event: RetryEvent) -> None:
        events.append(event)
        if len(restarts) < len(answered) + 1:  # the first failure of this face's call
            restarts.append(
                threading.Thread(target=lambda: servers.append(start_server(bert_rm, port=port)))
            )
            restarts[-1].start()

    answered: list[float | None] = []
    try:
        servers[0].wait_ready(90)
        with RewardClient(url) as client:
            reference = client.score(texts=texts)
        for mode in ("async", "sync"):
            servers[-1].stop(signal.SIGKILL)
            events.clear()
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="reward_client.attempts"):
                # A budget of a minute: the restart takes ~10 s here, more on a busy machine.
                scores = score_once(mode, url, texts, retry_timeout=60, on_retry=on_retry)
            restarts[-1].join(timeout=120)
            answered.append(answered_by(servers[-1]))  # /score requests of the new server
            assert scores == pytest.approx(reference, abs=1e-5), mode
            # The call failed while the server was down, then the restarted one answered it.
            assert answered[-1] == 1, mode
            assert events and all(e.error.startswith("ConnectError") for e in events)
            assert all(e.url in (f"{url}/info", f"{url}/score") for e in events)
            waits = [r.getMessage() for r in caplog.records if r.name == "reward_client.attempts"]
            assert len(waits) == len(events) and all(f"{url}/" in w for w in waits)
            assert all("ConnectError" in w and "of the 60 s retry budget" in w for w in waits)
            assert all("next try in" in w for w in waits)
    finally:
        for thread in restarts:  # a restart runs in its thread: wait for its process
            thread.join(timeout=120)
        for server in servers:
            server.stop()
    assert len(servers) == 3 and answered == [1, 1]


def answered_by(server: ServerProcess) -> float | None:
    """The /score requests ``server`` answered, or None when it cannot tell any more."""
    with contextlib.suppress(httpx.HTTPError):
        return score_requests(server.url)
    return None


def score_once(mode: str, url: str, texts: list[str], **kwargs: Any) -> list[float]:
    """One ``score`` call through a fresh client of the given face."""
    if mode == "sync":
        with RewardClient(url, **kwargs) as client:
            return client.score(texts=texts)

    async def main() -> list[float]:
        async with AsyncRewardClient(url, **kwargs) as client:
            return await client.score(texts=texts)

    return asyncio.run(main())


def test_free_ports_lie_below_the_ephemeral_range() -> None:
    """The servers' ports (tests, demo, benchmarks) are never ones an outgoing connection can
    take as its local end: a client retrying a killed server's port could otherwise connect
    to itself and keep the restarted server from binding it."""
    low = int(EPHEMERAL_RANGE.read_text(encoding="ascii").split()[0])
    if low <= LOWEST_PORT:
        pytest.skip(f"no ports between {LOWEST_PORT} and the ephemeral range ({low})")
    ports = {free_port() for _ in range(20)}
    assert all(LOWEST_PORT <= port < low for port in ports), sorted(ports)
    assert len(ports) > 1  # picked at random, not one port for every server
    # Processes that seed the process-wide random alike (transformers.set_seed) still get
    # different ports.
    seeded = set()
    for _ in range(5):
        random.seed(42)
        seeded.add(free_port())
    assert len(seeded) > 1, seeded
    for port in ports:  # each one free: a server can bind it
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))
