"""SandboxFusion's ``POST /run_code`` on a real server, and how a code verifier starts.

``/run_code`` answers SandboxFusion's shape field for field (``status``, ``message``,
``compile_result`` for compiled languages, ``run_result`` with ``Finished`` /
``TimeLimitExceeded``, ``return_code``, ``stdout``, ``stderr``, ``execution_time``), runs
behind the server's API key, within its code verifier's languages and limits, and answers
404 on a server without one. At start-up, a code verifier whose sandbox cannot be made
(here: a bwrap path that does not exist) stops the server with one line saying why and
what to do; ``sandbox: none`` starts, with a warning in the log.
"""

from __future__ import annotations

import base64
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.models_files import write_models
from helpers.servers import serve
from server_proc import (
    REWARD_SERVER,
    ServerProcess,
    free_port,
    requests_in_progress,
    running_server,
    wait_until,
)

KEY = "run-code-test-key"
CODE = {"kind": "verifier", "verifier": "code", "test_timeout_s": 2.0, "timeout_s": 3.0}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("run_code")
    entry = {"name": "code", **CODE, "languages": ["python", "cpp", "javascript"]}
    with serve(None, "--api-key", KEY, models=[entry], folder=folder) as srv:
        yield srv


def run_code(server: ServerProcess, body: dict[str, Any], key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{server.url}/run_code", json=body, headers=headers, timeout=60)


def test_python_success_as_sandbox_fusion_answers(server: ServerProcess) -> None:
    answer = run_code(
        server, {"code": "print(int(input()) * 2)", "language": "python", "stdin": "21"}
    )
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert set(body) == {
        "status",
        "message",
        "compile_result",
        "run_result",
        "executor_pod_name",
        "files",
    }
    assert (body["status"], body["message"], body["compile_result"], body["files"]) == (
        "Success",
        "",
        None,
        {},
    )
    run = body["run_result"]
    assert set(run) == {"status", "execution_time", "return_code", "stdout", "stderr"}
    assert (run["status"], run["return_code"], run["stdout"], run["stderr"]) == (
        "Finished",
        0,
        "42\n",
        "",
    )
    assert run["execution_time"] >= 0


def test_failures_timeouts_and_compiled_languages(server: ServerProcess) -> None:
    failed = run_code(server, {"code": "import sys\nsys.exit(3)", "language": "python"}).json()
    assert failed["status"] == "Failed"
    assert (failed["run_result"]["status"], failed["run_result"]["return_code"]) == ("Finished", 3)
    syntax = run_code(server, {"code": "print(", "language": "python"}).json()
    assert syntax["status"] == "Failed" and syntax["compile_result"] is None
    assert syntax["run_result"]["return_code"] == 1
    assert "SyntaxError" in syntax["run_result"]["stderr"]
    slow = {"code": "import time\ntime.sleep(60)", "language": "python", "run_timeout": 1}
    timed_out = run_code(server, slow).json()
    assert timed_out["status"] == "Failed"
    assert timed_out["run_result"]["status"] == "TimeLimitExceeded"
    assert timed_out["run_result"]["return_code"] is None
    cpp = "#include <iostream>\nint main() { int x; std::cin >> x; std::cout << x + 1; }"
    built = run_code(server, {"code": cpp, "language": "cpp", "stdin": "41"}).json()
    assert built["status"] == "Success"
    assert built["compile_result"]["status"] == "Finished"
    assert built["compile_result"]["return_code"] == 0
    assert built["run_result"]["stdout"] == "42"
    broken = run_code(server, {"code": "int main( {", "language": "cpp"}).json()
    assert broken["status"] == "Failed" and broken["run_result"] is None
    assert broken["compile_result"]["return_code"] != 0
    assert "error" in broken["compile_result"]["stderr"]
    node = run_code(server, {"code": "console.log(6 * 7)", "language": "nodejs"}).json()
    assert (node["status"], node["run_result"]["stdout"]) == ("Success", "42\n")


def test_files_are_written_beside_the_program(server: ServerProcess) -> None:
    data = base64.b64encode(b"hello from a file\n").decode()
    body = {
        "code": "print(open('data/in.txt').read(), end='')",
        "language": "python",
        "files": {"data/in.txt": data, "ignored.txt": None},
        "fetch_files": ["data/in.txt"],
    }
    answer = run_code(server, body).json()
    assert (answer["status"], answer["run_result"]["stdout"]) == ("Success", "hello from a file\n")
    assert answer["files"] == {}


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"code": "print(1)", "language": "ruby"}, 422),  # not among the entry's languages
        ({"code": "print(1)", "language": "brainfuck"}, 422),
        ({"code": "print(1)", "language": "python", "files": {"../x": "eA=="}}, 422),
        ({"code": "print(1)", "language": "python", "files": {"x": "not base64!"}}, 422),
        ({"language": "python"}, 422),
    ],
)
def test_runs_that_cannot_be_made_are_422(
    server: ServerProcess, body: dict[str, Any], status: int
) -> None:
    answer = run_code(server, body)
    assert answer.status_code == status, answer.text
    assert answer.json()["type"] in ("run_refused", "invalid_request")


def test_run_code_needs_the_api_key(server: ServerProcess) -> None:
    body = {"code": "print(1)", "language": "python"}
    assert run_code(server, body, key=None).status_code == 401
    assert run_code(server, body, key="wrong").status_code == 401


def test_run_code_without_a_code_verifier_is_404(bert_server: ServerProcess) -> None:
    """(Any server without one: the shared server of the tiny BERT reward model.)"""
    answer = httpx.post(
        f"{bert_server.url}/run_code", json={"code": "print(1)", "language": "python"}, timeout=30
    )
    assert answer.status_code == 404
    assert "verifier: code" in answer.json()["error"]


def test_no_sandbox_stops_the_server_with_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "bwrap"
    path = write_models(tmp_path, [{"name": "code", **CODE, "bwrap": str(missing)}])
    done = subprocess.run(
        [str(REWARD_SERVER), "--models", str(path), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, done.stderr
    (line,) = errors
    assert "cannot make a sandbox" in line and str(missing) in line
    assert "sandbox: none" in line  # what to do
    assert "Traceback" not in done.stderr


def test_sandbox_none_warns_at_every_start(tmp_path: Path) -> None:
    path = write_models(tmp_path, [{"name": "code", **CODE, "sandbox": "none"}])
    for _ in range(2):
        log = tmp_path / "server.log"
        with running_server(None, "--models", str(path), log_path=log) as srv:
            body = {"texts": ["print(input())"], "labels": [{"inputs": ["7"], "outputs": ["7"]}]}
            answer = httpx.post(f"{srv.url}/score", json=body, timeout=60).json()
            assert answer["tests"] == {"code": [["passed"]]}
        warnings = [line for line in log.read_text().splitlines() if " WARNING " in line]
        assert any("WITHOUT a sandbox" in line for line in warnings), log.read_text()


def test_runs_beyond_the_queue_are_429(tmp_path: Path) -> None:
    """Runs waiting or running at once are bounded by --max-queue: one more is refused
    with 429 and Retry-After, and is admitted again once the first is done."""
    with serve(None, "--max-queue", "1", models=[{"name": "code", **CODE}], folder=tmp_path) as srv:
        slow = {"code": "import time\ntime.sleep(1.5)\nprint('done')", "language": "python"}
        first: dict[str, httpx.Response] = {}
        thread = threading.Thread(target=lambda: first.update(r=run_code(srv, slow, key=None)))
        thread.start()
        wait_until(lambda: requests_in_progress(srv.url, "/run_code") >= 1, 30, "the first run")
        refused = run_code(srv, {"code": "print(1)", "language": "python"}, key=None)
        thread.join()
        assert refused.status_code == 429, refused.text
        assert int(refused.headers["Retry-After"]) >= 1
        assert first["r"].json()["run_result"]["stdout"] == "done\n"
        again = run_code(srv, {"code": "print(1)", "language": "python"}, key=None)
        assert again.json()["status"] == "Success"
