"""Counterpart reward servers at the seam, for the client side of issue 14 (composite and
process rewards) until the real ``reward-server --models`` serves them.

Small FastAPI apps that answer the wire contract (/info ``models``; /score ``components``,
``step_scores``, ``step_ends``, ``outcome_scores``), served by uvicorn in a thread of the
test process, so that a trainer in a subprocess reaches them over HTTP like a real server.
Tests take them through fixtures only: switching a test to the real server is a fixture
change.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from server_proc import free_port

__all__ = ["Counterpart", "prm_app", "responses_of", "serving", "split_steps", "step_score"]


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


def responses_of(body: dict[str, Any]) -> list[str]:
    """The response of each item of a /score body (pairs or conversations)."""
    if "responses" in body:
        return list(body["responses"])
    return [conversation[-1]["content"] for conversation in body["conversations"]]


def split_steps(response: str, separator: str) -> list[int]:
    """Step ends as the contract defines them: the response split on ``separator``, each
    separator belonging to the step before it, empty pieces dropped; an empty response is
    one step ending at 0. Offsets are exclusive ends in code points."""
    ends, start = [], 0
    pieces = response.split(separator)
    for i, piece in enumerate(pieces):
        end = start + len(piece) + (len(separator) if i < len(pieces) - 1 else 0)
        if piece:
            ends.append(end)
        start = end
    return ends or [len(response)]


def step_score(step: str) -> float:
    """The counterpart PRM's score of one step: a deterministic number in [0, 1)."""
    return (sum(map(ord, step)) % 97) / 97


def prm_app(server: Counterpart, separator: str = " ", outcome: bool = True) -> FastAPI:
    """A server with a process model ``prm`` (steps split on ``separator``) and, when
    ``outcome``, a sequence model ``rm`` scoring len(response) / 10."""
    app = FastAPI()
    models = [{"name": "prm", "kind": "process", "weight": 1.0}]
    if outcome:
        models.append({"name": "rm", "kind": "sequence", "weight": 1.0})

    @app.get("/info")
    def info() -> dict[str, Any]:
        return {"max_client_batch": 64, "models": models, "aggregate": "weighted_sum"}

    @app.post("/score")
    async def score(request: Request) -> dict[str, Any]:
        body = await request.json()
        server.bodies.append(body)
        responses = responses_of(body)
        ends = [split_steps(r, separator) for r in responses]
        steps = [
            [step_score(r[a:b]) for a, b in zip([0, *e[:-1]], e, strict=True)]
            for r, e in zip(responses, ends, strict=True)
        ]
        prm = [min(s) for s in steps]
        answer: dict[str, Any] = {
            "tokens": [len(r) for r in responses],
            "truncated": [False] * len(responses),
            "step_scores": steps,
            "step_ends": ends,
            "steps_dropped": [0] * len(responses),
        }
        if outcome:
            rm = [len(r) / 10 for r in responses]
            answer["scores"] = [p + q for p, q in zip(prm, rm, strict=True)]
            answer["components"] = {"prm": prm, "rm": rm}
            answer["outcome_scores"] = rm
        else:
            answer["scores"] = prm
        return answer

    return app
