"""Counterpart reward servers at the seam: small FastAPI apps for what the real server
cannot be (a server from before composite rewards), served by uvicorn in a thread of the
test process so that clients reach them over HTTP like a real server."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI
from server_proc import free_port

__all__ = ["Counterpart", "serving"]


@dataclass
class Counterpart:
    """What the tests see of a counterpart server: its URL and the /score bodies it got."""

    url: str = ""
    bodies: list[dict[str, Any]] = field(default_factory=list)

    def score_requests(self) -> int:
        """How many /score requests the server has answered."""
        return len(self.bodies)


@contextlib.contextmanager
def serving(app: FastAPI, server: Counterpart) -> Iterator[Counterpart]:
    """Serve ``app`` on a free port of 127.0.0.1 in a thread; ``server.url`` is set."""
    port = free_port()
    server.url = f"http://127.0.0.1:{port}"
    uv = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the counterpart server did not start")
        time.sleep(0.02)
    try:
        yield server
    finally:
        uv.should_exit = True
        thread.join(timeout=10)
