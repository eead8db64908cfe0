"""The servers and requests of :mod:`bench.tenants` for each kind of model (issue 49,
acceptance 1): a tenant flooding a reward model, a python verifier, a code verifier or a
remote component, against the other tenant's latency.

* ``model``: MiniLM on CPU (``--model``), texts of 16-128 tokens, as issue 23 measured;
* ``python``: a ``verifier: python`` entry, 2 worker processes, a function that spins the CPU
  for ``PY_ITEM_S`` per item;
* ``code``: a ``verifier: code`` entry (bubblewrap, the machine's cores as sandbox slots),
  each item a Python program and one stdin/stdout test (its check and its run: two programs
  in the sandbox);
* ``remote``: a ``kind: remote`` entry (``protocol: remote-reward``, ``max_concurrent:
  REMOTE_SEATS``) whose service is :func:`fake_remote` in a process of its own, answering each
  ``/score`` of up to ``REMOTE_BATCH`` items after ``REMOTE_DELAY_S`` (no CPU: the seats are
  the bottleneck).

Every request is fresh (a request number leads each text), so no cache answers it. The keys
a models file uses here are the same before and after issue 49's change, so one bench
measures both commits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from reward_server.launcher import ServerProcess, free_port, running_server

__all__ = ["KINDS", "Body", "fake_remote", "kind_server"]

KINDS = ("model", "python", "code", "remote")

#: A python verifier's CPU time per item, seconds.
PY_ITEM_S = 0.005
#: The remote service: items per /score (its max_client_batch), seconds per answer, and the
#: entry's connection seats.
REMOTE_BATCH = 4
REMOTE_DELAY_S = 0.04
REMOTE_SEATS = 2

#: Request number -> the /score body of one request.
Body = Callable[[int], dict[str, Any]]

_SPIN = f"""import time


def verify(prompt, response, label):
    end = time.perf_counter() + {PY_ITEM_S!r}
    while time.perf_counter() < end:
        pass
    return float(len(response) % 7)
"""

_PROGRAM = "# request {k}, item {j}\nprint(int(input()) * 2)\n"


def _models_file(path: Path, entry: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({"models": [entry]}), encoding="utf-8")
    return path


@contextlib.contextmanager
def kind_server(
    kind: str,
    tmp: Path,
    args: tuple[str, ...],
    env: dict[str, str],
    per_request: int,
    model: tuple[str, list[str]] | None = None,
) -> Iterator[tuple[ServerProcess, Body]]:
    """A running server of ``kind`` (``args``: the keys file and other flags) and the body
    of a request of ``per_request`` items; ``model``: the model's path and texts (``model``
    only)."""
    if kind == "model":
        assert model is not None
        path, texts = model
        with running_server(path, *args, env=env, timeout=180) as server:

            def body(k: int) -> dict[str, Any]:
                picked = (texts[(k * per_request + j) % len(texts)] for j in range(per_request))
                return {"texts": [f"{k} {text}" for text in picked]}

            yield server, body
        return
    with contextlib.ExitStack() as stack:
        entry, body = _entry(kind, tmp, per_request, stack)
        models = _models_file(tmp / "models.yaml", {"name": kind, **entry})
        yield (
            stack.enter_context(
                running_server(None, "--models", str(models), *args, env=env, timeout=180)
            ),
            body,
        )


def _entry(
    kind: str, tmp: Path, n: int, stack: contextlib.ExitStack
) -> tuple[dict[str, Any], Body]:
    """The models-file entry of ``kind`` and its requests' bodies."""
    if kind == "python":
        (tmp / "spin_verifier.py").write_text(_SPIN, encoding="utf-8")
        entry = {"kind": "verifier", "verifier": "python", "workers": 2}
        entry["function"] = f"{tmp / 'spin_verifier.py'}:verify"
        return entry, lambda k: {"texts": [f"request {k} item {j}" for j in range(n)]}
    if kind == "code":
        entry = {"kind": "verifier", "verifier": "code", "languages": ["python"]}

        def code(k: int) -> dict[str, Any]:
            labels = [{"inputs": [f"{j}\n"], "outputs": [f"{2 * j}\n"]} for j in range(n)]
            return {"texts": [_PROGRAM.format(k=k, j=j) for j in range(n)], "labels": labels}

        return entry, code
    if kind == "remote":
        url = stack.enter_context(_fake_remote_process())
        entry = {"kind": "remote", "url": url, "protocol": "remote-reward"}
        entry["max_concurrent"] = REMOTE_SEATS
        return entry, lambda k: {"texts": [f"request {k} item {j}" for j in range(n)]}
    raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")


@contextlib.contextmanager
def _fake_remote_process() -> Iterator[str]:
    """:func:`fake_remote` in a process of its own; its base URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "bench.tenant_kinds", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        began = time.monotonic()
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/info", timeout=1).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() - began > 60:
                raise RuntimeError("the fake remote service did not start")
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


async def fake_remote(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A remote reward service (ASGI): ``/info`` and ``/score`` of texts, each answer after
    ``REMOTE_DELAY_S`` (a sleep: the seats in front of it, not its CPU, set the pace)."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/info":
        answer: dict[str, Any] = {"model": "fake", "max_client_batch": REMOTE_BATCH}
    else:
        texts = json.loads(body)["texts"]
        await asyncio.sleep(REMOTE_DELAY_S)
        n = len(texts)
        answer = {"scores": [0.5] * n, "tokens": [1] * n, "truncated": [False] * n}
        answer["model"] = "fake"
    payload = json.dumps(answer).encode()
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


if __name__ == "__main__":
    import uvicorn

    uvicorn.run(fake_remote, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
