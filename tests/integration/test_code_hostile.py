"""Hostile programs through a real server's code rewards, each in the sandbox.

The server holds what a program must not reach: a keys file (``--api-keys``), a TLS key
(``--ssl-keyfile``), a reward model's folder, a secret in its environment, its own port on
127.0.0.1. Each hostile program gets its verdict; while it runs ``/health`` answers (a
request with a client timeout of 1 s succeeds); afterwards a normal item scores right, no
process it started is left in the server's process tree, no file outside the sandbox
changed, and at the end the server's resident memory is where it was.

Programs that probe for a secret print what they found; their label's expected output is
what a sandboxed program must see (``denied``, ``refused``, ``clean``), so a leak is a
``wrong_answer``. ``kill(-1, SIGKILL)`` runs only after a probe has shown the program's PID
namespace to be the sandbox's (its PID 1 the sandbox's runner, a handful of processes).

Two code entries: ``code``, with a short deadline, runs the programs whose verdict is
``timeout``; ``patient``, with a long one, runs the rest, so that a busy machine never
turns their verdict into a timeout.
"""

from __future__ import annotations

import hashlib
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
from helpers.models_files import write_keys, write_models
from helpers.pki import make_pki
from server_proc import ServerProcess, running_server, wait_until

from reward_server.config.tenants import hash_key
from reward_server.sandbox import Sandbox

KEY = "hostile-test-key"
SECRET = "s3cr3t-" + hashlib.sha256(b"hostile").hexdigest()[:16]
TEST_TIMEOUT_S = 2.0
#: The ``patient`` entry's deadline (the module's docstring says why there are two).
PATIENT_TIMEOUT_S = 60.0
#: Growth of the server's resident memory over the whole module that counts as flat.
RSS_BOUND = 64 << 20

NORMAL = (
    "```python\na, b = map(int, input().split())\nprint(a + b)\n```",
    {"inputs": ["1 2\n", "3 4\n"], "outputs": ["3\n", "7\n"]},
)


@dataclass
class Server:
    proc: ServerProcess
    client: httpx.Client
    paths: dict[str, Path]  # what no program may read or write
    baseline_rss: int = 0


@pytest.fixture(scope="module")
def server(bert_rm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    reason = Sandbox.probe()
    assert reason is None, f"no sandbox on this machine: {reason}"
    folder = tmp_path_factory.mktemp("hostile")
    pki = make_pki(folder)
    keys = write_keys(folder, [{"name": "run", "key_sha256": hash_key(KEY)}])
    outside = folder / "outside"
    outside.mkdir()
    (outside / "canary.txt").write_text("untouched\n", encoding="utf-8")
    code = {
        "name": "code",
        "kind": "verifier",
        "verifier": "code",
        "test_timeout_s": TEST_TIMEOUT_S,
        "memory_mb": 256,
        "output_bytes": 65536,
    }
    patient = {**code, "name": "patient", "test_timeout_s": PATIENT_TIMEOUT_S, "weight": 0.0}
    rm = {"name": "rm", "model": str(bert_rm), "weight": 0.0}
    models = write_models(folder, [rm, code, patient])
    trusted = ssl.create_default_context(cafile=str(pki.ca))
    env = {"HOSTILE_TEST_SECRET": SECRET, "OMP_NUM_THREADS": "1"}
    flags = ("--models", str(models), "--api-keys", str(keys))
    flags += ("--ssl-certfile", str(pki.cert), "--ssl-keyfile", str(pki.key))
    with (
        running_server(None, *flags, env=env, verify=trusted, timeout=120) as proc,
        httpx.Client(
            base_url=proc.url, verify=trusted, headers={"Authorization": f"Bearer {KEY}"}
        ) as client,
    ):
        paths = {
            "keys": keys,
            "tls_key": pki.key,
            "model": Path(bert_rm) / "config.json",
            "outside": outside,
            "cwd": Path.cwd(),
        }
        yield Server(proc, client, paths)


def _code(server: Server, responses: list[str], labels: list[object], model: str = "code") -> dict:
    body = {"texts": responses, "labels": labels, "model": model}
    answer = server.client.post("/score", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    return answer.json()  # type: ignore[no-any-return]


def _tree(server: Server) -> set[int]:
    """The server's descendant processes (zombies about to be reaped left out)."""
    out = set()
    for child in psutil.Process(server.proc.proc.pid).children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                out.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return out


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: (size, mtime in ns)."""
    return {
        str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()
    }


def _scored_with_health(server: Server, response: str, label: object, model: str) -> dict:
    """The hostile item's answer; meanwhile /health is asked again and again, each time with
    a client timeout of 1 s, and must answer 200 every time."""
    result: dict[str, dict] = {}
    thread = threading.Thread(
        target=lambda: result.update(answer=_code(server, [response], [label], model))
    )
    thread.start()
    asked = 0
    while thread.is_alive() or asked == 0:
        health = server.client.get("/health", timeout=1.0)  # raises past 1 s
        assert health.status_code == 200
        asked += 1
        time.sleep(0.05)
    thread.join()
    return result["answer"]


def _ok(expected: str) -> dict[str, list[str]]:
    """A label of one test that expects ``expected`` on stdout."""
    return {"inputs": [""], "outputs": [expected + "\n"]}


def test_baseline(server: Server) -> None:
    """A normal item scores right; the server's memory after it is the module's baseline."""
    answer = _code(server, [NORMAL[0]], [NORMAL[1]])
    assert answer["scores"] == [1.0]
    wait_until(lambda: not _tree(server), 30, "no sandbox left after a normal item")
    server.baseline_rss = psutil.Process(server.proc.proc.pid).memory_info().rss


def assert_sandboxed(server: Server, model: str) -> None:
    """A program of ``model`` sees its own PID namespace: PID 1 is the sandbox's runner, and
    only a few processes exist. Only then may a program send kill(-1, SIGKILL)."""
    info = server.client.get("/info", timeout=30).json()
    assert [m["sandbox"] for m in info["models"] if m["name"] == model] == ["bwrap"]
    probe = (
        "import os\n"
        "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "init = open('/proc/1/cmdline', 'rb').read().split(b'\\0')\n"
        "print('isolated' if len(pids) < 10 and b'-I' in init else 'exposed')\n"
    )
    answer = _code(server, [f"```python\n{probe}```"], [_ok("isolated")], model)
    assert answer["tests"][model] == [["passed"]]


@pytest.mark.parametrize("model", ["code", "patient"])
def test_the_sandbox_is_in_place(server: Server, model: str) -> None:
    assert_sandboxed(server, model)


HOSTILE: dict[str, tuple[str, object, str]] = {
    # At most 2^9 = 512 processes if nothing stopped it; the process limit does.
    "fork_bomb": (
        "import os, time\nfor _ in range(9):\n    try:\n        os.fork()\n"
        "    except OSError:\n        pass\ntime.sleep(60)\n",
        _ok("never"),
        "timeout",
    ),
    "memory_bomb": ("x = bytearray(4 << 30)\nprint(len(x))\n", _ok("never"), "memory_exceeded"),
    "growing_memory": (
        "chunks = []\nwhile True:\n    chunks.append(bytearray(64 << 20))\n",
        _ok("never"),
        "memory_exceeded",
    ),
    "cpu_spin": ("while True:\n    pass\n", _ok("never"), "timeout"),
    "endless_output": ("while True:\n    print('x' * 1000)\n", _ok("never"), "output_exceeded"),
    "sleep_forever": ("import time\ntime.sleep(10 ** 6)\n", _ok("never"), "timeout"),
    # The parent answers and exits; the daemon it left must not outlive the run.
    "double_fork_daemon": (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(10 ** 6)\n    os._exit(0)\nos.wait()\nprint('done')\n",
        _ok("done"),
        "passed",
    ),
    # It reaches the processes of its own run, itself included, and not the sandbox's
    # PID 1 (nor anything outside the sandbox's PID namespace).
    "kill_everything": (
        "import os, signal\nos.kill(-1, signal.SIGKILL)\nprint('alive')\n",
        _ok("alive"),
        "runtime_error",
    ),
    "fill_work_dir": (
        "with open('big', 'wb') as f:\n    while True:\n        f.write(b'x' * (1 << 20))\n",
        _ok("never"),
        "runtime_error",
    ),
    # Files under the file size limit, until the work directory's tmpfs is full.
    "fill_work_dir_with_files": (
        "import errno\ni = 0\ntry:\n    while True:\n        with open(f'f{i}', 'wb') as f:\n"
        "            f.write(b'x' * (8 << 20))\n        i += 1\n"
        "except OSError as exc:\n    print('full' if exc.errno == errno.ENOSPC else exc)\n",
        _ok("full"),
        "passed",
    ),
    "open_files_until_refused": (
        "files = []\ntry:\n    while True:\n        files.append(open('/dev/null'))\n"
        "except OSError:\n    print('refused')\n",
        _ok("refused"),
        "passed",
    ),
}


def _reader(path: Path) -> str:
    return (
        f"try:\n    data = open({str(path)!r}, 'rb').read()\n    print('read', len(data))\n"
        "except OSError:\n    print('denied')\n"
    )


def _cases(server: Server) -> dict[str, tuple[str, object, str]]:
    """The hostile programs that need the server's own paths and port."""
    writes = [server.paths["outside"] / "canary.txt", server.paths["outside"] / "new.txt"]
    writes += [server.paths["cwd"] / "hostile-was-here", Path("/tmp/hostile-was-here")]
    writer = (
        f"for path in {[str(p) for p in writes]!r}:\n    try:\n"
        "        with open(path, 'w') as f:\n            f.write('pwned')\n"
        "    except OSError:\n        pass\nprint('done')\n"
    )
    return {
        "connect_own_port": (
            f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', "
            f"{server.proc.port}), timeout=1)\n    print('connected')\n"
            "except OSError:\n    print('refused')\n",
            _ok("refused"),
            "passed",
        ),
        "read_keys_file": (_reader(server.paths["keys"]), _ok("denied"), "passed"),
        "read_tls_key": (_reader(server.paths["tls_key"]), _ok("denied"), "passed"),
        "read_model_folder": (_reader(server.paths["model"]), _ok("denied"), "passed"),
        "read_server_environment": (
            "import os\nfound = any("
            f"{SECRET!r} in v for v in os.environ.values())\n"
            "for pid in ('1', str(os.getppid())):\n    try:\n"
            f"        found |= {SECRET!r}.encode() in open('/proc/' + pid + '/environ', 'rb')"
            ".read()\n    except OSError:\n        pass\n"
            "print('leaked' if found else 'clean')\n",
            _ok("clean"),
            "passed",
        ),
        "write_outside": (writer, _ok("done"), "passed"),
        **HOSTILE,
    }


CASE_NAMES = [
    "connect_own_port",
    "read_keys_file",
    "read_tls_key",
    "read_model_folder",
    "read_server_environment",
    "write_outside",
    *HOSTILE,
]


@pytest.mark.parametrize("name", CASE_NAMES)
def test_hostile_program(server: Server, name: str) -> None:
    program, label, verdict = _cases(server)[name]
    model = "code" if verdict == "timeout" else "patient"
    if name == "kill_everything":
        assert_sandboxed(server, model)  # never on the host's processes
    before = _snapshot(server.paths["outside"])
    answer = _scored_with_health(server, f"```python\n{program}```", label, model)
    assert answer["tests"][model] == [[verdict]], answer
    # A normal item right after it scores right.
    assert _code(server, [NORMAL[0]], [NORMAL[1]])["scores"] == [1.0]
    # Nothing the program started is left.
    wait_until(lambda: not _tree(server), 30, f"the processes of {name} to be gone")
    # No file outside the sandbox changed.
    assert _snapshot(server.paths["outside"]) == before
    assert not (server.paths["cwd"] / "hostile-was-here").exists()
    assert not Path("/tmp/hostile-was-here").exists()
    for path in (server.paths["keys"], server.paths["tls_key"], server.paths["model"]):
        assert path.is_file()


def test_the_server_s_memory_is_flat(server: Server) -> None:
    """After every hostile program, the server's resident memory is within RSS_BOUND of the
    baseline (a program's output, memory or processes never landed in the server)."""
    assert server.baseline_rss > 0
    for _ in range(3):
        assert _code(server, [NORMAL[0]], [NORMAL[1]])["scores"] == [1.0]
    rss = psutil.Process(server.proc.proc.pid).memory_info().rss
    assert rss - server.baseline_rss < RSS_BOUND, (rss, server.baseline_rss)
