"""Verifiers served beside a reward model, in a real server process (issue 21, part 2).

One server holds a learned reward model and five ``kind: verifier`` entries: ``math``, a
``python`` function that works, one that sleeps forever, one that raises and one that
returns NaN. A failing verification never fails the request: the item scores the entry's
``on_error``, the reason comes back in ``verifier_errors`` and is counted in ``/metrics``;
while the sleeper holds its worker, ``/health`` and the other models keep answering, and
afterwards every pool has its full number of live workers.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from helpers.models_files import python_verifier
from helpers.servers import serve
from server_proc import ServerProcess, metric

FUNCTIONS = """
import math, time


def length(prompt, response, label):
    return {"score": float(len(response)), "has_label": float(label is not None)}


def forever(prompt, response, label):
    while True:
        time.sleep(0.05)


def boom(prompt, response, label):
    raise RuntimeError("a verifier bug")


def nan(prompt, response, label):
    return math.nan
"""

QUERIES = ["What is 1/2 as a decimal?", "What is 3 + 4?"]
RESPONSES = ["Half is \\boxed{0.5}.", "It is 8."]
LABELS = ["\\frac{1}{2}", "7"]
TIMEOUT_S = 2.0


@pytest.fixture(scope="module")
def server(gpt2_rm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("verifiers")
    functions = folder / "functions_under_test.py"
    functions.write_text(FUNCTIONS, encoding="utf-8")

    def python(name: str, function: str, **extra: Any) -> dict[str, Any]:
        return python_verifier(name, f"{functions}:{function}", weight=0.0, **extra)

    models = [
        {"name": "rm", "model": str(gpt2_rm), "weight": 0.1},
        {"name": "correct", "kind": "verifier", "verifier": "math", "workers": 2},
        python("length", "length"),
        python("sleepy", "forever", timeout_s=TIMEOUT_S, on_error=-1.0),
        python("boom", "boom", on_error=-2.0),
        python("nan", "nan", on_error=-3.0),
    ]
    with serve(models=models, folder=folder) as srv:
        yield srv


def _verifier_workers(server: ServerProcess) -> int:
    """Worker processes of the server's verifier pools (its children that are Python)."""
    children = psutil.Process(server.proc.pid).children(recursive=True)
    return sum(1 for child in children if child.is_running() and child.status() != "zombie")


def test_failing_verifiers_score_on_error_and_health_keeps_answering(
    server: ServerProcess,
) -> None:
    body = {"queries": QUERIES, "responses": RESPONSES, "labels": LABELS}
    answer: dict[str, httpx.Response] = {}

    def slow_request() -> None:
        answer["all"] = httpx.post(f"{server.url}/score", json=body, timeout=120)

    thread = threading.Thread(target=slow_request)
    thread.start()
    health_seconds = []
    other_model = None
    while thread.is_alive():
        started = time.monotonic()
        health = httpx.get(f"{server.url}/health", timeout=5)
        health_seconds.append(time.monotonic() - started)
        assert health.status_code == 200
        if other_model is None:
            # Another model answers while the sleeper holds its worker.
            other_model = httpx.post(
                f"{server.url}/score", json={**body, "model": "rm"}, timeout=30
            )
        time.sleep(0.1)
    thread.join()
    assert other_model is not None and other_model.status_code == 200, other_model
    # The sleeper took its full time limit per item, and /health answered throughout: an
    # event loop held by the sleeper would hold a health check for the whole limit (a bound,
    # not a speed: make test's load once took one check to 1.2 s).
    assert len(health_seconds) >= 5, health_seconds
    assert max(health_seconds) < TIMEOUT_S, health_seconds

    response = answer["all"]
    assert response.status_code == 200, response.text
    data = response.json()
    components = data["components"]
    assert components["correct"] == [1.0, 0.0]  # 0.5 == 1/2; 8 != 7
    assert components["length"] == [float(len(r)) for r in RESPONSES]
    assert components["sleepy"] == [-1.0, -1.0]
    assert components["boom"] == [-2.0, -2.0]
    assert components["nan"] == [-3.0, -3.0]
    assert data["verifier_errors"] == {
        "sleepy": ["timeout", "timeout"],
        "boom": ["error", "error"],
        "nan": ["non_finite", "non_finite"],
    }
    assert data["objectives"]["length/has_label"] == [1.0, 1.0]
    # The combined score: weights 0.1 (rm), 1.0 (correct), 0 for the python verifiers.
    rm = components["rm"]
    expected = [0.1 * s + c for s, c in zip(rm, components["correct"], strict=True)]
    assert all(
        math.isclose(a, b, abs_tol=1e-6) for a, b in zip(data["scores"], expected, strict=True)
    )

    for model, reason in (("sleepy", "timeout"), ("boom", "error"), ("nan", "non_finite")):
        counted = metric(
            server.url, "reward_server_verifier_errors_total", model=model, reason=reason
        )
        assert counted == 2.0, (model, reason, counted)
    # Every pool has its full number of live workers after the timeouts and the errors.
    for model, workers in (("correct", 2), ("length", 1), ("sleepy", 1), ("boom", 1), ("nan", 1)):
        assert metric(server.url, "reward_server_verifier_workers", model=model) == workers
    assert _verifier_workers(server) >= 6


def test_info_lists_each_verifier_and_its_settings(server: ServerProcess) -> None:
    info = httpx.get(f"{server.url}/info", timeout=10).json()
    by_name = {m["name"]: m for m in info["models"]}
    assert by_name["rm"]["kind"] == "sequence"
    sleepy = by_name["sleepy"]
    assert sleepy["kind"] == "verifier" and sleepy["verifier"] == "python"
    assert sleepy["timeout_s"] == TIMEOUT_S and sleepy["on_error"] == -1.0
    assert sleepy["function"].endswith("functions_under_test.py:forever")
    assert by_name["correct"]["workers"] == 2


def test_labels_of_the_wrong_length_are_refused(server: ServerProcess) -> None:
    body = {"queries": QUERIES, "responses": RESPONSES, "labels": LABELS[:1]}
    response = httpx.post(f"{server.url}/score", json=body, timeout=30)
    assert response.status_code == 422
    assert "labels" in response.json()["error"]


def test_a_server_of_verifiers_alone(tmp_path: Path) -> None:
    correct = {"name": "correct", "kind": "verifier", "verifier": "math"}
    with serve(models=[correct], folder=tmp_path) as srv:
        body = {"texts": ["so \\boxed{\\frac{1}{2}}", "maybe 3"], "labels": ["0.5", "4"]}
        data = httpx.post(f"{srv.url}/score", json=body, timeout=60).json()
        assert data["scores"] == [1.0, 0.0]
        info = httpx.get(f"{srv.url}/info", timeout=10).json()
        assert info["model"] is None and info["models"][0]["kind"] == "verifier"
        pid = srv.proc.pid
        workers = psutil.Process(pid).children(recursive=True)
        assert workers
    # Stopping the server leaves no verifier worker behind.
    _gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, alive
