"""Run the real ``reward-server`` in a subprocess for end-to-end tests.

The implementation lives in :mod:`reward_server.launcher` (the demo and the benchmarks use
it too); this module keeps the tests' import path short, starts the servers from the
suite's warm launcher (``warm=True``, :mod:`warm_launcher`: the suite starts over a hundred
servers, each of which would import torch and transformers anew), and reads what a running
server counted from its /metrics. A test of the console script itself runs
``REWARD_SERVER`` or passes ``warm=False``; a server whose environment changes more than its
``REWARD_SERVER_*`` settings starts cold anyway.
"""

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from warm_launcher import spawn as warm_spawn

from reward_server import launcher
from reward_server.launcher import REWARD_SERVER, ServerProcess, free_port, spawn_process

__all__ = [
    "REWARD_SERVER",
    "HeldRequest",
    "ServerProcess",
    "free_port",
    "metric",
    "requests_in_progress",
    "running_server",
    "score_requests",
    "start_server",
    "wait_until",
]


def start_server(
    model_path: str | Path | None, *args: str, warm: bool = True, **kwargs: Any
) -> ServerProcess:
    """:func:`reward_server.launcher.start_server`, warm unless told otherwise."""
    return launcher.start_server(model_path, *args, spawn=_spawn(warm), **kwargs)


def running_server(
    model_path: str | Path | None, *args: str, warm: bool = True, **kwargs: Any
) -> contextlib.AbstractContextManager[ServerProcess]:
    """:func:`reward_server.launcher.running_server`, warm unless told otherwise."""
    return launcher.running_server(model_path, *args, spawn=_spawn(warm), **kwargs)


def _spawn(warm: bool) -> launcher.Spawn:
    return warm_spawn if warm else spawn_process


def metric(url: str, name: str, **labels: str) -> float:
    """The server's sample ``name`` with exactly ``labels`` from its /metrics (0 if absent)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def score_requests(url: str) -> float:
    """/score requests the server at ``url`` answered 200 so far."""
    return metric(url, "reward_server_requests_total", endpoint="/score", status="200")


def require_counterpart(present: bool, env: str, what: str) -> None:
    """Skip the calling test module when a real counterpart (vLLM, kubectl, Ray) is missing,
    or fail it where ``make test`` set ``env`` to 1: CI must run those tests, not skip them."""
    if present:
        return
    if os.environ.get(env) == "1":
        pytest.fail(f"{what} is not installed: run `make setup`", pytrace=False)
    pytest.skip(f"{what} is not installed", allow_module_level=True)


def requests_in_progress(url: str, endpoint: str = "/score") -> float:
    """Requests to ``endpoint`` the server at ``url`` is handling now (started, not answered)."""
    return metric(url, "reward_server_requests_in_progress", endpoint=endpoint)


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``condition()`` until it is true; fail naming ``what`` after ``timeout`` seconds.

    The deadline only bounds a hang: a test waits on an observable state (a metric, a log
    line), never on the passing of time."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


class HeldRequest:
    """A JSON POST, sent from a thread, whose body stops half-way until :meth:`release`.

    The server has started handling it (its handler is reading the body) and cannot answer
    it before the test says so: a request that is certainly in flight, for as long as a test
    needs one (to send SIGTERM, to fill a batch at a chosen moment), without any sleep.
    """

    def __init__(
        self,
        url: str,
        body: object,
        *,
        headers: dict[str, str] | None = None,
        timeout: float = 120.0,
    ) -> None:
        data = json.dumps(body).encode()
        cut = len(data) // 2
        self._released = threading.Event()
        self._response: httpx.Response | None = None
        self._error: BaseException | None = None

        def chunks() -> Iterator[bytes]:
            yield data[:cut]
            if not self._released.wait(timeout):
                raise TimeoutError("the held request was never released")
            yield data[cut:]

        def send() -> None:
            try:
                self._response = httpx.post(
                    url,
                    content=chunks(),
                    headers={"content-type": "application/json", **(headers or {})},
                    timeout=timeout,
                )
            except BaseException as exc:  # handed to result()
                self._error = exc

        self._thread = threading.Thread(target=send, name="held-request", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Send the rest of the body."""
        self._released.set()

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self, timeout: float = 120.0) -> httpx.Response:
        """The answer (releasing the body first if the test has not)."""
        self.release()
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise AssertionError(f"no answer to the held request within {timeout}s")
        if self._error is not None:
            raise self._error
        assert self._response is not None
        return self._response
