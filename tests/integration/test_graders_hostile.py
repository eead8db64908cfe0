"""Hostile python graders against their sandbox (issue 50, acceptance 3): each limit of a
``python`` grader has a grader that would break it (network, host files, memory, time,
processes, disk), run in :class:`~reward_server.verifiers.graders.python_sandbox.PythonSandbox`
as a grader's pool worker runs it (one warm interpreter for many items).

Every hostile grader is bounded (a few hundred processes that end by themselves, a few GiB
asked for, loops cut by the time limit) and runs only after the ``isolated`` fixture saw a
probe grader inside namespaces of its own (PID, network, mount, user), with none of the
host's files and no way to the host's port: a sandbox that is not in place fails that
fixture and no hostile grader runs. After each, the sandbox still grades a plain item.
"""

from __future__ import annotations

import json
import os
import socket
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from reward_server.verifiers.graders.errors import GradeFailure
from reward_server.verifiers.graders.python_sandbox import GraderLimits, PythonSandbox

SECRET = "grader-sandbox-secret-91c3"
LIMITS = GraderLimits(timeout_s=10.0, memory_mb=512, disk_mb=16, processes=16)
PLAIN = "def grade(sample, item):\n    return 0.25\n"


def source(body: str) -> str:
    """A grader whose ``grade`` runs ``body`` (indented for it)."""
    return "def grade(sample, item):\n" + textwrap.indent(textwrap.dedent(body), "    ")


@pytest.fixture(scope="module")
def listener() -> Iterator[socket.socket]:
    """A TCP port listening on the host's 127.0.0.1 (a grader must not reach it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sock.setblocking(False)
        yield sock


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("host") / "keys.yaml"
    path.write_text(f"- name: a\n  key: {SECRET}\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def isolated(listener: socket.socket, keys: Path) -> Iterator[PythonSandbox]:
    """A started sandbox, once a probe grader in it saw namespaces of its own, none of the
    host's files and no way to the host's port."""
    sandbox = PythonSandbox(LIMITS)
    sandbox.start()
    port = listener.getsockname()[1]
    probe = source(
        f"""
        import json, os, socket
        out = {{"uid": os.getuid()}}
        for ns in ("pid", "net", "mnt", "user"):
            out[ns] = os.readlink(f"/proc/self/ns/{{ns}}")
        paths = ("/work", "/root", "/home", {str(keys)!r}, {str(Path.cwd())!r})
        out["host_paths"] = [p for p in paths if os.path.exists(p)]
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
            out["connect"] = "connected"
        except OSError as exc:
            out["connect"] = exc.errno
        item["seen"] = out
        raise RuntimeError(json.dumps(out))
        """
    )
    with pytest.raises(GradeFailure) as failed:
        sandbox.grade(probe, {}, {})
    seen = json.loads(failed.value.detail.strip().splitlines()[-1].split(": ", 1)[1])
    for ns in ("pid", "net", "mnt", "user"):
        assert seen[ns] != os.readlink(f"/proc/self/ns/{ns}"), f"{ns} namespace is the host's"
    assert seen["host_paths"] == []
    assert seen["connect"] != "connected"
    if os.geteuid() == 0:
        assert seen["uid"] != 0
    yield sandbox
    sandbox.close()


def still_works(sandbox: PythonSandbox) -> None:
    assert sandbox.grade(PLAIN, {}, {}) == 0.25


def outcome(sandbox: PythonSandbox, body: str, item: Any = None) -> float | GradeFailure:
    try:
        return sandbox.grade(source(body), {"output_text": "x"}, item or {})
    except GradeFailure as failure:
        return failure


def test_no_network(isolated: PythonSandbox, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    got = outcome(
        isolated,
        f"""
        import socket
        for host in ("127.0.0.1", "1.1.1.1"):
            try:
                socket.create_connection((host, {port}), timeout=2)
                return 1.0
            except OSError:
                pass
        return 0.0
        """,
    )
    assert got == 0.0
    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing ever connected
    still_works(isolated)


def test_no_host_files_and_no_writes_outside(isolated: PythonSandbox, keys: Path) -> None:
    got = outcome(
        isolated,
        f"""
        import os
        found = 0
        for path in ({str(keys)!r}, "/etc/passwd", "/etc/shadow", "/proc/1/environ"):
            try:
                found += {SECRET!r} in open(path).read() or path.startswith("/etc")
            except OSError:
                pass
        for path in ("/usr/evil", "/opt/grader-packages/evil", "/evil"):
            try:
                open(path, "w").write("x")
                found += 10
            except OSError:
                pass
        return found
        """,
    )
    assert got == 0.0
    assert SECRET in keys.read_text()
    still_works(isolated)


def test_memory_is_bounded(isolated: PythonSandbox) -> None:
    got = outcome(isolated, "blob = bytearray(4 << 30)\nreturn len(blob)\n")
    assert isinstance(got, GradeFailure) and got.flag == "python_grader_runtime_error"
    assert "MemoryError" in got.detail
    still_works(isolated)


def test_disk_is_bounded(isolated: PythonSandbox) -> None:
    got = outcome(
        isolated,
        """
        import os
        written = 0
        try:
            with open("/tmp/fill", "wb") as out:
                for _ in range(64):
                    out.write(b"x" * (1 << 20))
                    written += 1
        except OSError:
            pass
        finally:
            if os.path.exists("/tmp/fill"):
                os.remove("/tmp/fill")
        return written
        """,
    )
    assert isinstance(got, float) and got <= LIMITS.disk_mb
    still_works(isolated)


def test_a_slow_grader_is_cut_at_its_limit_and_the_next_item_runs(isolated: PythonSandbox) -> None:
    sandbox = PythonSandbox(GraderLimits(timeout_s=1.0, memory_mb=512, disk_mb=16, processes=16))
    try:
        began = time.monotonic()
        got = outcome(sandbox, "while True:\n    pass\n")
        assert isinstance(got, GradeFailure) and got.flag == "python_grader_server_error"
        assert "time limit" in got.detail
        assert time.monotonic() - began < 10
        still_works(sandbox)  # a new sandbox for the next item
    finally:
        sandbox.close()


def test_processes_are_bounded_and_none_outlives_the_sandbox(isolated: PythonSandbox) -> None:
    sandbox = PythonSandbox(LIMITS)
    try:
        sandbox.start()
        pid = sandbox.pid
        assert pid is not None
        got = outcome(
            sandbox,
            """
            import os, time
            made = 0
            for _ in range(300):
                try:
                    child = os.fork()
                except OSError:
                    break
                if child == 0:
                    time.sleep(3)
                    os._exit(0)
                made += 1
            return made
            """,
        )
        assert isinstance(got, float) and got < LIMITS.processes
        still_works(sandbox)
        children = psutil.Process(pid).children(recursive=True)
        assert children  # the sandbox's own processes, while it runs
    finally:
        sandbox.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(c.is_running() for c in children):
        time.sleep(0.1)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_the_graders_packages_import(isolated: PythonSandbox) -> None:
    """The packages of OpenAI's grader image that are installed here import in the sandbox,
    within OpenAI's memory (2 GiB, the default limits)."""
    sandbox = PythonSandbox(GraderLimits())
    got = outcome(
        sandbox,
        """
        import importlib
        for name in ("numpy", "scipy", "sympy", "pandas", "rapidfuzz", "rouge_score", "nltk",
                     "jsonschema", "pydantic", "yaml", "deepdiff", "sqlparse"):
            importlib.import_module(name)
        return 1.0
        """,
    )
    sandbox.close()
    assert got == 1.0


def test_sandbox_none_runs_the_same_grader_unsandboxed() -> None:
    """``sandbox: none`` (trusted graders): the same interpreter and limits, no namespaces."""
    sandbox = PythonSandbox(GraderLimits(sandbox="none", memory_mb=1024))
    try:
        got = outcome(sandbox, "import os\nreturn float(os.path.exists('/proc/1'))\n")
        assert got == 1.0
        big = outcome(sandbox, "blob = bytearray(4 << 30)\nreturn len(blob)\n")
        assert isinstance(big, GradeFailure) and "MemoryError" in big.detail
    finally:
        sandbox.close()
