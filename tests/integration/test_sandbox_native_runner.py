"""The sandbox's native runner (``launch serve``, ``reward_server/sandbox/_serve.c`` and
``_launch.c``) on its own, in mode ``none`` (a plain process, no namespaces), driven over its
control socket the way the server's channel drives it: jobs and their reports, what a
program gets (its pipes only, default signals, its limits), the per-test work directory,
kills, deadlines, bad messages, and its end when the server goes. Inside a real sandbox,
test_sandbox_hostile.py runs compiled programs through it."""

from __future__ import annotations

import array
import json
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from reward_server.sandbox._channel import native_message
from reward_server.sandbox._host import SANDBOX_ENV
from reward_server.sandbox._launcher import build_launcher

LIMITS = {
    "timeout_s": 20.0,
    "cpu_s": 1.5,
    "as_bytes": 1 << 30,
    "fsize_bytes": 1 << 20,
    "nofile": 64,
    "stack_bytes": 8 << 20,
    "nproc": 0,
}


@dataclass
class Runner:
    proc: subprocess.Popen[bytes]
    sock: socket.socket
    root: Path
    ids: Iterator[int]

    def send(self, data: bytes, fds: list[int] | None = None) -> None:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        self.sock.sendmsg([data], ancillary)

    def read(self, timeout_s: float = 20.0) -> dict:
        self.sock.settimeout(timeout_s)
        return json.loads(self.sock.recv(1 << 16))

    def job(self, argv: list[str], stdin: bytes = b"", **fields: object) -> Job:
        """Start a job (cwd test unless given), its stdin written and closed."""
        job_id = next(self.ids)
        msg = {"op": "job", "id": job_id, "kind": "exec", "cwd": "test", "argv": argv}
        msg.update({"limits": dict(LIMITS), "env": {"EXTRA": "yes"}, **fields})
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.send(native_message(msg), [in_r, out_w, err_w])
        for fd in (in_r, out_w, err_w):
            os.close(fd)
        os.write(in_w, stdin)
        os.close(in_w)
        return Job(job_id, out_r, err_r)


@dataclass
class Job:
    id: int
    out: int
    err: int

    def output(self) -> tuple[bytes, bytes]:
        with os.fdopen(self.out, "rb") as out, os.fdopen(self.err, "rb") as err:
            return out.read(), err.read()


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[Runner]:
    binary = build_launcher()
    assert binary is not None
    root = tmp_path / "item"
    (root / "prog" / "lib").mkdir(parents=True)
    (root / "prog" / "main.sh").write_text("echo from main\n")
    (root / "prog" / "lib" / "data.txt").write_text("data\n")
    launch = root / "launch"
    launch.write_bytes(binary)
    launch.chmod(0o555)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    extra_r, extra_w = os.pipe()  # a descriptor of the runner's that no program may get
    argv = [str(launch), "serve", "none", str(root), str(theirs.fileno()), str(1 << 20), "1024"]
    # Started with SIGHUP ignored (as under nohup): programs must not inherit that.
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        proc = subprocess.Popen(
            [*argv, "--", "lib/data.txt", "main.sh"],
            pass_fds=[theirs.fileno(), extra_w],
            env=dict(SANDBOX_ENV),
            stderr=subprocess.PIPE,
        )
    finally:
        signal.signal(signal.SIGHUP, before)
    for fd in (theirs.fileno(), extra_r, extra_w):
        os.close(fd)
    theirs.detach()
    started = Runner(proc, ours, root, iter(range(1, 1000)))
    try:
        assert started.read() == {"op": "ready", "pid": proc.pid, "runner": "native"}
        yield started
    finally:
        ours.close()
        try:
            proc.wait(10)
        finally:
            proc.kill()
            proc.wait()


def test_a_job_runs_in_a_fresh_folder_with_the_items_files(runner: Runner) -> None:
    script = 'read -r x; echo "$x"; pwd; cat lib/data.txt; sh main.sh; echo "$EXTRA $PATH"'
    job = runner.job(["sh", "-c", script], b"input\n")
    out, err = job.output()
    report = runner.read()
    assert report["op"] == "done" and report["id"] == job.id
    assert (report["status"], report["error"], report["timed_out"], report["killed"]) == (
        0,
        None,
        False,
        False,
    )
    assert report["cpu_s"] >= 0 and report["wall_s"] > 0 and report["maxrss_kb"] > 0
    lines = out.decode().splitlines()
    assert lines == ["input", str(runner.root / "work" / "t1"), "data", "from main",
                     f"yes {SANDBOX_ENV['PATH']}"], err  # fmt: skip
    # Its folder is gone once reported; the next job gets a new one.
    assert sorted(p.name for p in (runner.root / "work").iterdir()) == ["tmp"]
    second = runner.job(["pwd"])
    assert second.output()[0].decode().strip() == str(runner.root / "work" / "t2")
    assert runner.read()["status"] == 0


def test_a_build_runs_in_prog_and_failures_are_reported(runner: Runner) -> None:
    build = runner.job(["sh", "-c", "pwd; touch built"], cwd="prog", seal=True)
    assert build.output()[0].decode().strip() == str(runner.root / "prog")
    assert runner.read()["status"] == 0
    assert (runner.root / "prog" / "built").exists()
    missing = runner.job(["/no/such/program"])
    missing.output()
    report = runner.read()
    assert report["error"].startswith("job setup: /no/such/program: No such file"), report
    failing = runner.job(["sh", "-c", "exit 3"])
    failing.output()
    assert os.waitstatus_to_exitcode(runner.read()["status"]) == 3


def test_a_program_gets_its_pipes_default_signals_and_its_limits(runner: Runner) -> None:
    script = (
        "ls /proc/self/fd | wc -l; grep -E 'SigIgn|SigBlk' /proc/self/status; cat /proc/self/limits"
    )
    limits = {**LIMITS, "cpu_s": 2.2, "nofile": 50, "nproc": 0}
    out, err = runner.job(["sh", "-c", script], limits=limits).output()
    assert runner.read()["status"] == 0, err
    lines = out.decode().splitlines()
    # ls sees 0-2 and its own listing's descriptor: the runner's socket, its signal and
    # report descriptors and the extra pipe are gone.
    assert lines[0] == "4", lines
    # No signal ignored (not SIGHUP from nohup, nor the runner's SIGINT and SIGPIPE), none
    # blocked (the runner blocks SIGCHLD).
    assert dict(line.split() for line in lines[1:3]) == {"SigIgn:": "0" * 16, "SigBlk:": "0" * 16}
    seen = {" ".join(line.split()[:-3]): line.split()[-3:-1] for line in lines[4:]}
    assert seen["Max cpu time"] == ["3", "4"]  # whole seconds up, SIGKILL a second later
    assert seen["Max address space"] == [str(1 << 30)] * 2
    assert seen["Max file size"] == [str(1 << 20)] * 2
    assert seen["Max open files"] == ["50", "50"]
    assert seen["Max stack size"] == [str(8 << 20)] * 2
    assert seen["Max core file size"] == ["0", "0"]


def test_a_program_dies_with_its_runner(runner: Runner) -> None:
    """Mode none: the kernel kills the program when the runner dies (in a sandbox, the end
    of its PID namespace does)."""
    job = runner.job(["sh", "-c", "echo $$; exec sleep 60"])
    os.set_blocking(job.out, True)
    pid = int(os.read(job.out, 64))
    runner.proc.kill()
    runner.proc.wait()
    assert not _alive(pid, wait_s=10.0), "the program outlived its runner"
    os.close(job.out)
    os.close(job.err)


def test_kills_deadlines_and_what_a_job_leaves_behind(runner: Runner) -> None:
    sleeper = runner.job(["sleep", "30"])
    runner.send(native_message({"op": "kill", "id": sleeper.id}))
    sleeper.output()
    report = runner.read()
    assert report["killed"] and os.WTERMSIG(report["status"]) == 9, report
    slow = runner.job(["sleep", "30"], limits={**LIMITS, "timeout_s": 0.3})
    slow.output()
    report = runner.read()
    assert report["timed_out"] and 0.3 <= report["wall_s"] < 5, report
    # A daemon that leaves the job's session is killed once the job ended.
    daemon = "setsid sleep 30 </dev/null >/dev/null 2>&1 & echo $!"
    job = runner.job(["sh", "-c", daemon])
    pid = int(job.output()[0])
    assert runner.read()["status"] == 0
    assert not _alive(pid), "a process outlived its job"


def test_bad_messages_get_an_answer_and_the_runner_goes_on(runner: Runner) -> None:
    runner.send(b"job\x0077\x00test\x00")  # too few fields
    assert runner.read() == {"op": "done", "id": 77, "error": "bad job message"}
    fields = native_message(
        {
            "op": "job",
            "id": 76,
            "kind": "exec",
            "cwd": "test",
            "argv": ["true"],
            "limits": LIMITS,
            "env": {},
        }
    ).split(b"\0")
    fields[7] = b"-5"  # a negative file size
    runner.send(b"\0".join(fields))
    assert runner.read() == {"op": "done", "id": 76, "error": "bad job message: limits"}
    fields[7], fields[11] = b"0", str(2**64 - 1).encode()  # more environment than fields
    runner.send(b"\0".join(fields))
    assert runner.read() == {"op": "done", "id": 76, "error": "bad job message"}
    msg = {"op": "job", "id": 78, "kind": "exec", "cwd": "test", "argv": ["true"]}
    runner.send(native_message({**msg, "limits": LIMITS, "env": {}}))  # no pipes
    assert runner.read() == {"op": "done", "id": 78, "error": "expected 3 pipes"}
    runner.send(b"what\x00")
    runner.send(native_message({"op": "seal", "id": 79}))
    assert runner.read() == {"op": "done", "id": 79, "error": None}
    job = runner.job(["echo", "fine"])
    assert job.output()[0] == b"fine\n"
    assert runner.read()["status"] == 0


def test_the_runner_kills_everything_and_exits_when_the_server_goes(runner: Runner) -> None:
    job = runner.job(["sh", "-c", "echo $$; exec sleep 30"])
    os.set_blocking(job.out, True)
    pid = int(os.read(job.out, 64))
    runner.sock.close()
    assert runner.proc.wait(10) == 0
    assert not _alive(pid, wait_s=5.0)
    os.close(job.out)
    os.close(job.err)


def test_only_executables_go_to_the_native_runner() -> None:
    with pytest.raises(ValueError, match="executables"):
        native_message({"op": "job", "id": 1, "kind": "python", "cwd": "test", "limits": LIMITS})
    with pytest.raises(ValueError, match="NUL"):
        msg = {"op": "job", "id": 1, "kind": "exec", "cwd": "test", "argv": ["a\0b"]}
        native_message({**msg, "limits": LIMITS})


def _alive(pid: int, wait_s: float = 2.0) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            return False
        time.sleep(0.02)
    return True


def test_no_compiler_means_no_native_runner(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="reward_server.sandbox._launcher"):
        assert build_launcher("/no/such/cc") is None
    assert "could not build the native runner with /no/such/cc" in caplog.text
