"""The sandbox's native launcher (``reward_server/sandbox/_launch.c``) on its own, outside
any sandbox (mode ``p``: no namespaces): its command line, its failure report on descriptor
3, and what the program it execs gets. Inside a sandbox, test_sandbox_hostile.py checks a
compiled program's whole view of its run through it."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from reward_server.sandbox._launcher import build_launcher


@pytest.fixture(scope="module")
def launcher(tmp_path_factory: pytest.TempPathFactory) -> str:
    binary = build_launcher()
    assert binary is not None and binary[:4] == b"\x7fELF"
    path = tmp_path_factory.mktemp("launcher") / "launch"
    path.write_bytes(binary)
    path.chmod(0o555)
    return str(path)


def _launch(launcher: str, args: list[str], stdin: bytes = b"") -> tuple[int, bytes, bytes]:
    """Start the launcher as the runner does (posix_spawn, the pipes as 0-2, the report
    pipe as 3); its exit code, stdout and report."""
    in_r, in_w = os.pipe()
    out_r, out_w = os.pipe()
    rep_r, rep_w = os.pipe()
    extra_r, extra_w = os.pipe()  # an inheritable descriptor the program must not get
    os.set_inheritable(extra_w, True)
    actions = [
        (os.POSIX_SPAWN_DUP2, fd, target) for target, fd in enumerate((in_r, out_w, out_w, rep_w))
    ]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    # Started with SIGHUP ignored (as under nohup): the launcher must undo what it inherits.
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        pid = os.posix_spawn(launcher, [launcher, *args], env, file_actions=actions)
    finally:
        signal.signal(signal.SIGHUP, before)
    for fd in (in_r, out_w, rep_w, extra_w):
        os.close(fd)
    os.write(in_w, stdin)
    os.close(in_w)
    with os.fdopen(out_r, "rb") as out, os.fdopen(rep_r, "rb") as rep, os.fdopen(extra_r, "rb"):
        stdout, report = out.read(), rep.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), stdout, report


def _args(cwd: str, *program: str, nofile: int = 50, cpu: str = "2") -> list[str]:
    # MODE CWD CPU_S AS FSIZE NOFILE STACK NPROC -- PROGRAM...
    return [
        "p",
        cwd,
        cpu,
        str(1 << 30),
        str(1 << 20),
        str(nofile),
        str(8 << 20),
        "0",
        "--",
        *program,
    ]


def test_runs_the_program_with_its_limits_and_only_its_pipes(launcher: str, tmp_path: Path) -> None:
    script = (
        'read -r line; echo "$line"; pwd; ls /proc/self/fd | wc -l; grep SigIgn /proc/self/status;'
        " cat /proc/self/limits"
    )
    code, stdout, report = _launch(launcher, _args(str(tmp_path), "sh", "-c", script), b"hi\n")
    assert (code, report) == (0, b"")  # EOF with no report: the program ran
    lines = stdout.decode().splitlines()
    # ls sees 0-2 and its own listing's descriptor: the report pipe and the extra are gone.
    assert lines[:3] == ["hi", str(tmp_path), "4"]
    # No signal ignored: not SIGHUP (nohup), nor the two glibc's posix_spawn ignores (32, 33).
    assert lines[3].split() == ["SigIgn:", "0" * 16]
    limits = {" ".join(line.split()[:-3]): line.split()[-3:-1] for line in lines[5:]}
    assert limits["Max cpu time"] == ["2", "3"]
    assert limits["Max address space"] == [str(1 << 30)] * 2
    assert limits["Max file size"] == [str(1 << 20)] * 2
    assert limits["Max open files"] == ["50", "50"]
    assert limits["Max stack size"] == [str(8 << 20)] * 2
    assert limits["Max core file size"] == ["0", "0"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["p", "/"], b"launch: MODE CWD CPU_S AS FSIZE NOFILE STACK NPROC -- PROGRAM"),
        (_args("/", "/no/such/program"), b"/no/such/program: No such file or directory"),
        (_args("/no/such/folder", "true"), b"/no/such/folder: No such file or directory"),
        (_args("/", "true", cpu="x"), b"cpu: Invalid argument"),
    ],
    ids=["usage", "no-program", "no-folder", "bad-number"],
)
def test_a_failure_before_the_program_is_reported_on_descriptor_3(
    launcher: str, args: list[str], said: bytes
) -> None:
    code, stdout, report = _launch(launcher, args)
    assert (code, stdout) == (127, b"")
    assert report.startswith(said), report


def test_the_run_dies_with_its_parent(launcher: str, tmp_path: Path) -> None:
    """Mode p: the kernel kills the program when the process that started it dies (the
    runner, where no PID namespace does it)."""
    middle = f"""
import os, sys
pid = os.posix_spawn({launcher!r}, {[launcher, *_args(str(tmp_path), "sleep", "60")]!r}, {{}},
                     file_actions=[(os.POSIX_SPAWN_DUP2, 2, 3)])
print(pid, flush=True)
"""
    done = subprocess.run(
        [sys.executable, "-c", middle], capture_output=True, text=True, timeout=30, check=True
    )
    pid = int(done.stdout)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        pytest.fail("the program outlived the process that started it")


def test_no_compiler_means_no_launcher(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="reward_server.sandbox._launcher"):
        assert build_launcher("/no/such/cc") is None
    assert "could not build the native launcher with /no/such/cc" in caplog.text
