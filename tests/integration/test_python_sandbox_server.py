"""``verifier: python`` with ``sandbox: bwrap`` in a real server (issue 33, item 2).

One server holds the same functions twice, in the worker processes (``sandbox: none``, the
default) and in the sandbox (``sandbox: bwrap``): both score right and wrong items and
return the same extras, by file path and by module name; a function that reads a keys
file the test wrote, an environment variable of the server holding a secret, and the
server's own port on 127.0.0.1, gets all three in the workers and none of them in the
sandbox; a function that hangs is a ``timeout``, one that raises an ``error``, one that
returns NaN ``non_finite``, one that exits without a result a ``crash``. Without bwrap the
server stops at start-up with one line; a function that does not import in the sandbox
stops it too. The models file's defaults (python: none, code: bwrap), and how a module's
file is found (its package never imported in the server), are checked here as well.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.models_files import python_verifier, write_models
from helpers.servers import serve
from pydantic import ValidationError
from server_proc import REWARD_SERVER, ServerProcess, free_port

from reward_server.config.models_file import parse_entry
from reward_server.sandbox import Sandbox
from reward_server.verifiers.sandboxed import module_source

SECRET = "sandbox-test-secret-4d1c"
SECRET_ENV = "REWARD_TEST_SANDBOX_SECRET"
TIMEOUT_S = 1.5

FUNCTIONS = """
import math, os, socket, time



def contains(prompt, response, label):
    return {"score": float(str(label) in response), "words": float(len(response.split()))}


def reach(prompt, response, label):
    \"\"\"1.0 for each thing of the server's the function can get at.\"\"\"
    try:
        with open(label["keys"], encoding="utf-8") as f:
            keys = float(label["secret"] in f.read())
    except OSError:
        keys = 0.0
    env = float(os.environ.get(label["env"]) == label["secret"])
    try:
        with socket.create_connection(("127.0.0.1", label["port"]), timeout=2):
            port = 1.0
    except OSError:
        port = 0.0
    return {"score": keys + env + port, "keys": keys, "env": env, "port": port}


def forever(prompt, response, label):
    while True:
        time.sleep(0.05)


def boom(prompt, response, label):
    raise RuntimeError("a verifier bug")


def nan(prompt, response, label):
    return math.nan


def leave(prompt, response, label):
    os._exit(0)
"""

RESPONSES = ["It is 7.", "It is 8, I think."]
LABELS = [7, 7]


@pytest.fixture(scope="module")
def functions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("sandboxed_functions")
    path = folder / "sandbox_probe_functions.py"
    path.write_text(FUNCTIONS, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def server(functions: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    reason = Sandbox.probe()
    assert reason is None, f"no sandbox on this machine: {reason}"
    folder = tmp_path_factory.mktemp("sandboxed_server")
    box = {"sandbox": "bwrap"}
    models = [
        python_verifier("inproc", f"{functions}:contains"),
        python_verifier("boxed", f"{functions}:contains", **box),
        python_verifier("boxed_module", "sandbox_probe_functions:contains", **box, workers=2),
        python_verifier("reach_inproc", f"{functions}:reach", timeout_s=10),
        python_verifier("reach_boxed", f"{functions}:reach", timeout_s=10, **box),
        python_verifier(
            "sleepy", f"{functions}:forever", timeout_s=TIMEOUT_S, on_error=-1.0, **box
        ),
        python_verifier("boom", f"{functions}:boom", on_error=-2.0, **box),
        python_verifier("nan", f"{functions}:nan", on_error=-3.0, **box),
        python_verifier("leave", f"{functions}:leave", on_error=-4.0, **box),
    ]
    # The module form finds its file on the server's sys.path.
    env = {SECRET_ENV: SECRET, "PYTHONPATH": str(functions.parent)}
    with serve(models=models, folder=folder, env=env) as srv:
        yield srv


def score(server: ServerProcess, model: str, responses: list[str], labels: list[Any]) -> dict:
    body = {"queries": ["q"] * len(responses), "responses": responses, "labels": labels}
    answer = httpx.post(f"{server.url}/score", json={**body, "model": model}, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def test_sandboxed_function_scores_as_the_in_process_one(server: ServerProcess) -> None:
    inproc = score(server, "inproc", RESPONSES, LABELS)
    assert inproc["scores"] == [1.0, 0.0]
    assert inproc["objectives"] == {"words": [3.0, 5.0]}
    for model in ("boxed", "boxed_module"):
        boxed = score(server, model, RESPONSES, LABELS)
        assert boxed["scores"] == inproc["scores"], model
        assert boxed["objectives"] == inproc["objectives"], model
        assert "verifier_errors" not in boxed


def test_the_sandbox_hides_the_server_s_files_environment_and_port(
    server: ServerProcess, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"tenants:\n  - name: a\n    key: {SECRET}\n", encoding="utf-8")
    port = int(server.url.rsplit(":", 1)[1])
    label = {"keys": str(keys), "secret": SECRET, "env": SECRET_ENV, "port": port}
    inproc = score(server, "reach_inproc", ["x"], [label])
    # The worker processes run with the server's rights: they get all three.
    assert inproc["objectives"] == {"keys": [1.0], "env": [1.0], "port": [1.0]}
    boxed = score(server, "reach_boxed", ["x"], [label])
    assert "verifier_errors" not in boxed  # it ran, and found nothing
    assert boxed["objectives"] == {"keys": [0.0], "env": [0.0], "port": [0.0]}
    assert boxed["scores"] == [0.0]


@pytest.mark.parametrize(
    ("model", "reason", "on_error"),
    [
        ("sleepy", "timeout", -1.0),
        ("boom", "error", -2.0),
        ("nan", "non_finite", -3.0),
        ("leave", "crash", -4.0),
    ],
)
def test_failing_calls_get_their_reason(
    server: ServerProcess, model: str, reason: str, on_error: float
) -> None:
    answer = score(server, model, RESPONSES, LABELS)
    assert answer["scores"] == [on_error, on_error]
    assert answer["verifier_errors"] == {model: [reason, reason]}
    assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200


def test_a_function_that_hangs_on_most_items_is_not_tried_on_the_rest(
    server: ServerProcess,
) -> None:
    # One call at a time (workers 1), 12 items that all hang: without the breaker the
    # request would take 12 x TIMEOUT_S; it stops trying after three timeouts.
    items = 12
    logged = len(server.log())
    answer = score(server, "sleepy", [f"r{i}" for i in range(items)], [7] * items)
    assert answer["verifier_errors"] == {"sleepy": ["timeout"] * items}
    log = server.log()[logged:]
    # Each item that ran logs its own timeout; the rest were never started.
    ran = log.count("verifier 'sleepy': item ")
    assert 3 <= ran < items, log
    assert "its items not sent yet are not tried" in log


def test_info_shows_where_the_function_runs(server: ServerProcess) -> None:
    info = httpx.get(f"{server.url}/info", timeout=10).json()
    by_name = {m["name"]: m for m in info["models"]}
    assert by_name["inproc"]["sandbox"] == "none"
    assert by_name["boxed"]["sandbox"] == "bwrap"
    assert by_name["boxed"]["memory_mb"] == 1024
    assert "bwrap" not in by_name["boxed"]  # a path of the server's machine


def _start_fails(path: Path) -> str:
    done = subprocess.run(
        [str(REWARD_SERVER), "--models", str(path), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return errors[0]


def test_no_bwrap_stops_the_server_with_one_line(functions: Path, tmp_path: Path) -> None:
    missing = tmp_path / "no" / "bwrap"
    entry = python_verifier("boxed", f"{functions}:contains", sandbox="bwrap", bwrap=str(missing))
    line = _start_fails(write_models(tmp_path, [entry]))
    assert "cannot make a sandbox" in line and str(missing) in line
    assert "sandbox: none" in line  # what to do


def test_a_function_that_cannot_import_in_the_sandbox_stops_the_server(tmp_path: Path) -> None:
    needs = tmp_path / "needs_yaml.py"
    needs.write_text("import yaml\n\n\ndef f(prompt, response, label):\n    return 1.0\n")
    line = _start_fails(
        write_models(tmp_path, [python_verifier("needs", f"{needs}:f", sandbox="bwrap")])
    )
    assert "in its sandbox" in line and "No module named 'yaml'" in line


def entry(**keys: Any) -> Any:
    """One models-file entry, as the class of its kind."""
    return parse_entry(keys)


def test_models_file_defaults_and_refusals() -> None:
    python = {"name": "p", "kind": "verifier", "verifier": "python", "function": "m:f"}
    assert entry(**python).sandbox == "none"
    assert entry(**python, sandbox="bwrap", memory_mb=256).sandbox == "bwrap"
    assert entry(name="c", kind="verifier", verifier="code").sandbox == "bwrap"
    assert not hasattr(entry(name="e", kind="verifier", verifier="exact"), "sandbox")
    for bad in ({"languages": ["cpp"]}, {"memory_mb": 256}, {"bwrap": "/usr/bin/bwrap"}):
        with pytest.raises(ValidationError):
            entry(**python, **bad)
    with pytest.raises(ValidationError, match="sandbox: only for verifier: python or code"):
        entry(name="e", kind="verifier", verifier="exact", sandbox="bwrap")


def test_a_module_s_file_is_found_without_importing_its_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    package = tmp_path / "explosive_package"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (package / "rules.py").write_text("def f(prompt, response, label):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert module_source("explosive_package.rules") == package / "rules.py"
    with pytest.raises(ImportError, match="no module named"):
        module_source("explosive_package.missing")
    with pytest.raises(ImportError, match="no Python source file"):
        module_source("sys")
