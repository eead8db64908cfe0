"""RemoteReward against a stdlib HTTP server: it works on TRL's daemon event loop and across
event loops."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from helpers.mock_answers import item_score, score_answer

from reward_client.integrations.trl import RemoteReward


class ScoreHandler(BaseHTTPRequestHandler):
    """Answers POST /score like the reward server; records the API key it saw."""

    keys: list[str | None] = []  # noqa: RUF012 - shared by design, reset per test

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).keys.append(self.headers.get("Authorization"))
        data = json.dumps(score_answer(body)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default stderr access log."""


@pytest.fixture
def stdlib_server() -> Iterator[str]:
    """A threaded stdlib HTTP server speaking the /score protocol, on a free loopback port."""
    ScoreHandler.keys = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), ScoreHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_works_on_trl_daemon_loop_and_across_event_loops(stdlib_server: str) -> None:
    from trl.trainer.utils import shutdown_event_loop_in_daemon, start_event_loop_in_daemon

    reward = RemoteReward(stdlib_server, api_key="k", max_client_batch=2)
    prompts, completions = ["a", "bb", "ccc"], ["1", "22", "333"]
    expected = [item_score([p, c]) for p, c in zip(prompts, completions, strict=True)]

    # As GRPOTrainer does: await the reward function on a daemon thread's event loop.
    thread, loop, ready = start_event_loop_in_daemon(name="reward-test")
    ready.wait()
    try:
        for _ in range(2):
            future = asyncio.run_coroutine_threadsafe(
                reward(prompts=prompts, completions=completions), loop
            )
            assert future.result(timeout=30) == expected
        asyncio.run_coroutine_threadsafe(reward.aclose(), loop).result(timeout=30)
    finally:
        shutdown_event_loop_in_daemon(thread, loop)

    # And from fresh event loops, one per call (each gets its own connections).
    for _ in range(2):
        assert asyncio.run(reward(prompts=prompts, completions=completions)) == expected
    assert set(ScoreHandler.keys) == {"Bearer k"}
