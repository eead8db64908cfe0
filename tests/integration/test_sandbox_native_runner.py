"""The sandbox's native runner (``launch serve``, ``reward_server/sandbox/_serve.c``,
``_message.c`` and ``_launch.c``) on its own, in mode ``none`` (a plain process, no
namespaces), driven over its control socket the way the server's channel drives it: jobs and
their reports, what a program gets (its pipes only, default signals, its limits), the
per-test work directory, kills, deadlines, bad messages (the same answers from the Python
runner, which reads the same messages), its end when the server goes, its reports, and how
it is built. Inside a real sandbox, test_sandbox_hostile.py runs compiled programs through
it."""

from __future__ import annotations

import array
import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import tomllib

from reward_server.sandbox import Limits, Sandbox
from reward_server.sandbox._channel import encode
from reward_server.sandbox._host import SANDBOX_ENV
from reward_server.sandbox._launcher import (
    LAUNCHER_SOURCES,
    _build,
    build_launcher,
    find_compiler,
    launcher_flags,
)
from reward_server.sandbox._session import RUNNER_SOURCE

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

    def job(self, argv: list[str], stdin: bytes = b"", kind: str = "exec", **fields: object) -> Job:
        """Start a job (cwd test unless given), its stdin written and closed."""
        job_id = next(self.ids)
        msg = {"op": "job", "id": job_id, "kind": kind, "cwd": "test", "argv": argv}
        msg.update({"limits": dict(LIMITS), "env": {"EXTRA": "yes"}, **fields})
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.send(encode(msg), [in_r, out_w, err_w])
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


def _start(root: Path, command: list[str]) -> Runner:
    """A runner (``command``, then the runners' arguments) in mode none on ``root``, whose
    ``prog`` folder holds ``lib/data.txt`` and ``main.sh``, once it said it is ready."""
    (root / "prog" / "lib").mkdir(parents=True)
    (root / "prog" / "main.sh").write_text("echo from main\n")
    (root / "prog" / "lib" / "data.txt").write_text("data\n")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    extra_r, extra_w = os.pipe()  # a descriptor of the runner's that no program may get
    argv = [*command, "none", str(root), str(theirs.fileno()), str(1 << 20), "1024"]
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
    return Runner(proc, ours, root, iter(range(1, 1000)))


def _stop(started: Runner) -> None:
    started.sock.close()
    try:
        started.proc.wait(10)
    finally:
        started.proc.kill()
        started.proc.wait()


def _native(tmp_path: Path) -> list[str]:
    binary, why = build_launcher()
    assert binary is not None, why
    launch = tmp_path / "launch"
    launch.write_bytes(binary)
    launch.chmod(0o555)
    return [str(launch), "serve"]


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[Runner]:
    started = _start(tmp_path / "item", _native(tmp_path))
    try:
        assert started.read() == {"op": "ready", "pid": started.proc.pid, "runner": "native"}
        yield started
    finally:
        _stop(started)


@pytest.fixture(params=["native", "python"])
def either_runner(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Runner]:
    """The native runner, or the Python runner (Python programs' runner), which reads the
    same messages."""
    command = _native(tmp_path) if request.param == "native" else _python_runner()
    started = _start(tmp_path / "item", command)
    try:
        ready = started.read()
        assert ready == {"op": "ready", "pid": started.proc.pid, "runner": request.param}
        yield started
    finally:
        _stop(started)


def _python_runner() -> list[str]:
    return [sys.executable, "-I", "-S", "-c", RUNNER_SOURCE]


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
    runner.send(encode({"op": "kill", "id": sleeper.id}))
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


def _job_fields(runner: Runner, job_id: int) -> list[bytes]:
    """A valid job message of the runner's kind, as its fields (changed by the caller)."""
    kind, argv = ("python", ["main.py"]) if _is_python(runner) else ("exec", ["true"])
    msg = {"op": "job", "id": job_id, "kind": kind, "cwd": "test", "argv": argv}
    return encode({**msg, "limits": LIMITS, "env": {}}).split(b"\0")


def _is_python(runner: Runner) -> bool:
    return runner.proc.args[0] == sys.executable


def test_bad_messages_get_an_answer_and_the_runner_goes_on(either_runner: Runner) -> None:
    runner = either_runner
    runner.send(b"job\x0077\x00test\x00")  # too few fields
    assert runner.read() == {"op": "done", "id": 77, "error": "bad job message"}
    fields = _job_fields(runner, 76)
    fields[8] = b"-5"  # a negative file size
    runner.send(b"\0".join(fields))
    assert runner.read() == {"op": "done", "id": 76, "error": "bad job message: limits"}
    fields[8], fields[12] = b"0", str(2**64 - 1).encode()  # more environment than fields
    runner.send(b"\0".join(fields))
    assert runner.read() == {"op": "done", "id": 76, "error": "bad job message"}
    no_pipes = _job_fields(runner, 78)
    runner.send(b"\0".join(no_pipes))
    assert runner.read() == {"op": "done", "id": 78, "error": "expected 3 pipes"}
    runner.send(b"what\x00")
    runner.send(b"job\x005x\x00")  # no ID to answer to: nothing
    runner.send(encode({"op": "seal", "id": 79}))
    assert runner.read() == {"op": "done", "id": 79, "error": None}
    if _is_python(runner):
        main = runner.root / "prog" / "main.py"
        main.write_text("print('fine')\n")
        check = runner.job([str(main)], kind="pycheck", cwd="prog")
        assert check.output() == (b"", b"")
        assert runner.read()["error"] is None
        job = runner.job([str(main)], kind="python")
    else:
        job = runner.job(["echo", "fine"])
    assert job.output()[0] == b"fine\n"
    assert runner.read()["status"] == 0


@pytest.mark.parametrize(
    ("index", "value", "error"),
    [
        (5, b"nan", "timeout_s"),
        (5, b"inf", "timeout_s"),
        (5, b"-1.0", "timeout_s"),
        (5, b"1e400", "timeout_s"),  # past a double: infinity
        (5, b"2e9", "timeout_s"),  # past MAX_SECONDS
        (5, b"0x10", "timeout_s"),
        (5, b" 5.0", "timeout_s"),
        (5, b"", "timeout_s"),
        (6, b"nan", "cpu_s"),
        (6, b"-0.5", "cpu_s"),
        (7, b" -5", "limits"),  # strtoull would wrap it
        (7, b"+5", "limits"),
        (7, str(2**64 - 1).encode(), "limits"),  # RLIM_INFINITY: no limit at all
        (9, str(2**48 + 1).encode(), "limits"),
        (10, b"1" * 5000, "limits"),
        (11, b"1e3", "limits"),
        (3, b"elsewhere", None),
        (4, b"2", None),
        (12, b"-1", None),
    ],
)
def test_every_number_from_the_server_is_checked(
    either_runner: Runner, index: int, value: bytes, error: str | None
) -> None:
    """A job message with a number that is not one (NaN, an infinity, a sign, past its
    maximum, ...) is answered as a bad message and starts nothing, by either runner."""
    fields = _job_fields(either_runner, 5)
    fields[index] = value
    pipes = [os.pipe() for _ in range(3)]
    either_runner.send(b"\0".join(fields), [pipes[0][0], pipes[1][1], pipes[2][1]])
    for _, w in pipes:
        os.close(w)
    wanted = "bad job message" + (f": {error}" if error else "")
    assert either_runner.read() == {"op": "done", "id": 5, "error": wanted}
    assert os.read(pipes[1][0], 10) == b""  # the pipes were closed: nothing started
    for r, _ in pipes:
        os.close(r)


def test_a_job_s_environment_is_bounded_and_never_the_runner_s_alone(runner: Runner) -> None:
    """A job's environment is the runner's with the message's entries over it, built
    without allocating (a failed allocation once gave the job the runner's whole
    environment without its own entries); more entries than the runner takes, or one
    without '=', is a bad message."""
    env = {f"V{i}": str(i) for i in range(64)}
    job = runner.job(["sh", "-c", 'echo "$V0 $V63 $PATH"'], env=env)
    assert job.output()[0].decode().split() == ["0", "63", SANDBOX_ENV["PATH"]]
    assert runner.read()["status"] == 0
    job = runner.job(["true"], env={**env, "V64": "64"})
    assert runner.read() == {"op": "done", "id": job.id, "error": "bad job message"}
    fields = _job_fields(runner, 9)
    fields[12:13] = [b"1", b"NOEQUALS"]
    runner.send(b"\0".join(fields))
    assert runner.read() == {"op": "done", "id": 9, "error": "bad job message: environment"}


def test_each_runner_refuses_the_other_s_jobs(either_runner: Runner) -> None:
    fields = _job_fields(either_runner, 3)
    fields[2] = b"exec" if _is_python(either_runner) else b"python"
    either_runner.send(b"\0".join(fields))
    error = either_runner.read()["error"]
    runs = "Python programs" if _is_python(either_runner) else "executables"
    assert error == f"bad job message: the {_name(either_runner)} runner runs {runs}"


def _name(runner: Runner) -> str:
    return "Python" if _is_python(runner) else "native"


def test_the_runner_kills_everything_and_exits_when_the_server_goes(runner: Runner) -> None:
    job = runner.job(["sh", "-c", "echo $$; exec sleep 30"])
    os.set_blocking(job.out, True)
    pid = int(os.read(job.out, 64))
    runner.sock.close()
    assert runner.proc.wait(10) == 0
    assert not _alive(pid, wait_s=5.0)
    os.close(job.out)
    os.close(job.err)


@pytest.mark.parametrize(
    "args",
    [
        ["other", "ROOT", "FD", "1048576", "1024"],  # a mode that is neither
        ["none", "ROOT", str(2**40), "1048576", "1024"],  # no such descriptor: cut to an int
        ["none", "ROOT", "FD", "-1", "1024"],
        ["none", "ROOT", "FD", "1048576", "1e3"],
        ["none", "ROOT/" + "x" * 1100, "FD", "1048576", "1024"],  # its folders' paths cut
    ],
)
def test_a_bad_command_line_is_refused(tmp_path: Path, args: list[str]) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        fd = str(theirs.fileno())
        argv = [*_native(tmp_path), *(a.replace("ROOT", str(tmp_path)) for a in args)]
        argv = [fd if a == "FD" else a for a in argv]
        done = subprocess.run(
            [*argv, "--"], pass_fds=[theirs.fileno()], capture_output=True, timeout=20
        )
    assert done.returncode == 2 and b"usage: launch serve" in done.stderr, done


def test_the_wheel_carries_the_runner_s_sources() -> None:
    pyproject = tomllib.loads(Path(__file__).parents[2].joinpath("pyproject.toml").read_text())
    data = pyproject["tool"]["setuptools"]["package-data"]["reward_server"]
    wanted = [f"sandbox/{p.name}" for p in LAUNCHER_SOURCES] + ["sandbox/_launch.h"]
    assert set(wanted) <= set(data), data


def test_fields_with_nul_bytes_are_refused_before_sending() -> None:
    with pytest.raises(ValueError, match="NUL"):
        msg = {"op": "job", "id": 1, "kind": "exec", "cwd": "test", "argv": ["a\0b"]}
        encode({**msg, "limits": LIMITS})


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
        binary, why = build_launcher("/no/such/cc")
        assert binary is None
    assert "could not build the native runner with /no/such/cc" in caplog.text
    assert why.startswith("could not build the native runner with /no/such/cc: ")


def test_without_a_native_runner_only_python_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """No C compiler (or a failed build): the languages of executables are unavailable, and
    a session in one is a sandbox error; Python programs still run (no fallback runner)."""
    monkeypatch.setattr(
        "reward_server.sandbox._sandbox.build_launcher", lambda: build_launcher("/no/such/cc")
    )
    sandbox = Sandbox("none", workers=1)
    assert sandbox.why_unavailable("python") is None
    for name in ("c", "cpp", "javascript", "java", "bash"):
        why = sandbox.why_unavailable(name)
        assert why is not None and "could not build the native runner" in why, why
    files = {"main.c": "int main(void) { return 0; }\n"}
    built, run = asyncio.run(sandbox.run_once("c", files, "", Limits()))
    assert (built.ok, built.status, run) == (False, "sandbox_error", None)
    assert built.stderr.startswith("could not build the native runner with /no/such/cc")
    built, run = asyncio.run(sandbox.run_once("python", {"main.py": "print(2)"}, "", Limits()))
    assert built.ok and run is not None and run.stdout == "2\n", (built, run)


def test_built_with_warnings_as_errors_and_hardened(tmp_path: Path) -> None:
    """-Wall -Wextra -Werror and the hardening gcc offers: a source with a warning does not
    build, and the runner is a position-independent executable with a read-only GOT bound
    at start (RELRO, BIND_NOW) and a stack that cannot execute."""
    cc = find_compiler()
    assert cc is not None
    flags = launcher_flags(cc)
    assert {"-Wall", "-Wextra", "-Werror", "-Wformat-security"} <= set(flags), flags
    expected = ["-D_FORTIFY_SOURCE=3", "-fstack-protector-strong", "-fstack-clash-protection"]
    assert set(expected) <= set(flags), flags  # what gcc 12 with glibc 2.36 offers
    warned = tmp_path / "warned.c"
    warned.write_text("int main(void) { int unused; return 0; }\n")
    binary, why = _build(cc, [warned])
    assert binary is None and "unused" in why, why
    binary, why = build_launcher()
    assert binary is not None, why
    launch = tmp_path / "launch"
    launch.write_bytes(binary)
    header = subprocess.run(["readelf", "-hldW", str(launch)], capture_output=True, text=True)
    assert "DYN (Position-Independent Executable file)" in header.stdout
    assert "GNU_RELRO" in header.stdout and "BIND_NOW" in header.stdout
    stack = next(line for line in header.stdout.splitlines() if "GNU_STACK" in line)
    assert stack.split()[-2] == "RW", stack


# A driver of the runner's report writer (_message.c): a report of COUNT strings of 1,100
# quotes, each escaped to six bytes.
REPORT_DRIVER = r"""
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    #include <sys/socket.h>
    #include "_launch.h"
    int main(int argc, char **argv) {
        static char text[1101], got[1 << 17];
        int sv[2];
        if (argc != 2 || socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) return 2;
        memset(text, '"', sizeof text - 1);
        struct report r = {.len = 0};
        put(&r, "{\"op\":\"done\",\"id\":7,\"error\":[");
        for (int i = 0; i < atoi(argv[1]); i++) {
            put(&r, i ? "," : "");
            put_string(&r, text);
        }
        put(&r, "]}");
        send_report(sv[0], &r, 7);
        ssize_t n = recv(sv[1], got, sizeof got, 0);
        return n > 0 && fwrite(got, 1, (size_t)n, stdout) == (size_t)n ? 0 : 1;
    }
"""


def test_a_report_that_does_not_fit_is_an_error_never_cut_json(tmp_path: Path) -> None:
    """A report past the runner's buffer is sent as the job's error, as valid JSON (it was
    cut short, into invalid JSON); a long string in it is cut at 1,024 bytes, marked."""
    cc = find_compiler()
    assert cc is not None
    driver = tmp_path / "driver.c"
    driver.write_text(textwrap.dedent(REPORT_DRIVER))
    sources = [driver, next(p for p in LAUNCHER_SOURCES if p.name == "_message.c")]
    out = tmp_path / "driver"
    flags = [*launcher_flags(cc), f"-I{LAUNCHER_SOURCES[0].parent}"]
    subprocess.run([cc, *flags, "-o", str(out), *map(str, sources)], check=True)
    one = json.loads(subprocess.run([out, "1"], capture_output=True, check=True).stdout)
    assert one == {"op": "done", "id": 7, "error": ['"' * 1024 + "..."]}
    many = json.loads(subprocess.run([out, "3"], capture_output=True, check=True).stdout)
    assert many == {"op": "done", "id": 7, "error": "the runner's report passed 16384 bytes"}
