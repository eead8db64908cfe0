"""Hostile programs against reward_server.sandbox: each guarantee has a program that would
break it (issue 33, item 2).

Every hostile program is bounded (a thousand processes at most, a few GiB, a few hundred MB
of output, loops that end by themselves within seconds) and runs only after the ``isolated``
fixture saw a probe program inside the sandbox in a PID, network and mount namespace of its
own: a sandbox that is not in place fails that fixture, and no hostile program runs (a
``kill(-1, SIGKILL)`` outside a PID namespace would end the test run itself).

After each: its verdict, nothing of it left on the host (the item's sandbox holds its runner
only, and nothing at all once the session is closed), no file outside changed, and a normal
program still runs right.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from reward_server.sandbox import Limits, RunResult, Sandbox

SECRET = "sandbox-test-secret-5f0e2c"
# Generous wall clock: every program here ends by itself, or is stopped by another limit.
LIMITS = Limits(run_timeout_s=30.0, memory_mb=256, processes=32, workdir_mb=8, file_size_mb=64)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(workers=2)


@pytest.fixture(scope="module")
def listener() -> Iterator[socket.socket]:
    """A TCP port listening on the host's 127.0.0.1 (a program must not reach it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        sock.setblocking(False)
        yield sock


@pytest.fixture(scope="module")
def host_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A keys file and a file a program tries to overwrite, on the host, with their
    contents before."""
    folder = tmp_path_factory.mktemp("host")
    keys = folder / "keys.yaml"
    keys.write_text(f"- name: a\n  key: {SECRET}\n", encoding="utf-8")
    target = folder / "target.txt"
    target.write_text("unchanged\n", encoding="utf-8")
    return {"keys": keys, "target": target}


@pytest.fixture(scope="module")
def isolated(
    sandbox: Sandbox, listener: socket.socket, host_files: dict[str, Path]
) -> Iterator[Sandbox]:
    """The sandbox, once a probe program in it saw its own PID, network, mount and user
    namespaces, none of the host's files and no way to the host's port."""
    _check_isolated(sandbox, listener, host_files)
    yield sandbox


@pytest.fixture(scope="module")
def isolated_exec(
    sandbox: Sandbox, listener: socket.socket, host_files: dict[str, Path]
) -> Sandbox:
    """An isolated sandbox, with its executables' runner (the native runner) checked."""
    _check_isolated(sandbox, listener, host_files)
    # And a compiled program, under the runner that executables get, in namespaces of its
    # own with that runner as its parent.
    probe = """
        #include <stdio.h>
        #include <unistd.h>
        int main(void) {
            const char *names[] = {"pid", "net", "mnt", "user", 0};
            for (int i = 0; names[i]; i++) {
                char path[64], target[128] = {0};
                snprintf(path, sizeof path, "/proc/self/ns/%s", names[i]);
                readlink(path, target, sizeof target - 1);
                printf("%s\\n", target);
            }
            printf("%d\\n", (int)getppid());
        }
    """
    result = _run(sandbox, probe, language="c", name="main.c")
    assert result.status == "ok", result
    *seen, ppid = result.stdout.splitlines()
    host = [os.readlink(f"/proc/self/ns/{ns}") for ns in ("pid", "net", "mnt", "user")]
    assert all(ns and ns != mine for ns, mine in zip(seen, host, strict=True)), seen
    assert ppid == "1"
    return sandbox


def _check_isolated(sandbox: Sandbox, listener: socket.socket, host_files: dict[str, Path]) -> None:
    port = listener.getsockname()[1]
    probe = f"""
        import json, os, socket
        out = {{"ppid": os.getppid(), "uid": os.getuid()}}
        for ns in ("pid", "net", "mnt", "user", "ipc", "uts"):
            out[ns] = os.readlink(f"/proc/self/ns/{{ns}}")
        paths = ("/work", "/root", "/home", {str(host_files["keys"])!r}, {sys.executable!r})
        out["host_paths"] = [p for p in paths if os.path.exists(p)]
        out["init"] = open("/proc/1/cmdline", "rb").read().split(b"\\0")[:3]
        out["init"] = [x.decode() for x in out["init"]]
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=2).close()
            out["connect"] = "connected"
        except OSError as exc:
            out["connect"] = exc.errno
        print(json.dumps(out))
    """
    result = _run(sandbox, probe)
    assert result.status == "ok", result
    seen = json.loads(result.stdout)
    for ns in ("pid", "net", "mnt", "user", "ipc", "uts"):
        assert seen[ns] != os.readlink(f"/proc/self/ns/{ns}"), f"{ns} namespace is the host's"
    assert seen["ppid"] == 1  # the runner is the PID namespace's init
    assert seen["init"][:2] == [sandbox.python, "-I"]  # the runner
    assert seen["host_paths"] == []
    assert seen["connect"] != "connected"
    if os.geteuid() == 0:
        assert seen["uid"] != 0


def _run(
    sandbox: Sandbox,
    code: str,
    *,
    limits: Limits = LIMITS,
    language: str = "python",
    name: str = "main.py",
    stdin: str = "",
) -> RunResult:
    """One item with one run; asserts nothing of it is left on the host, during (the
    sandbox holds its runner only once the run returned) and after the session."""

    async def go() -> RunResult:
        async with sandbox.session(language, {name: textwrap.dedent(code)}, limits) as item:
            assert item.compile_result.ok, item.compile_result
            result = await item.run(stdin)
            outer = item.pid
            assert outer is not None
            procs = _wait_for(lambda: _tree(outer), lambda tree: len(tree) <= 2)
            assert len(procs) == 2, f"left inside the sandbox: {procs}"  # bwrap and runner
            during = [p.pid for p in psutil.Process(outer).children(recursive=True)]
        for pid in (outer, *during):
            gone = _wait_for(lambda pid=pid: _alive(pid), lambda alive: not alive)
            assert not gone, f"process {pid} outlived its session"
        return result

    return asyncio.run(go())


def _tree(pid: int) -> list[str]:
    """The process and its descendants, as 'pid name' (zombies left out: they are dead)."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    out = []
    for proc in procs:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{proc.pid} {proc.name()}")
        except psutil.NoSuchProcess:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for(read, done, timeout_s: float = 3.0):  # type: ignore[no-untyped-def]
    """Poll ``read()`` until ``done(value)`` or the timeout; the last value."""
    deadline = time.monotonic() + timeout_s
    value = read()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.02)
        value = read()
    return value


def _still_works(sandbox: Sandbox) -> None:
    result = _run(sandbox, "a, b = map(int, input().split())\nprint(a + b)\n", stdin="2 40\n")
    assert (result.status, result.stdout) == ("ok", "42\n")


def test_fork_bomb_stops_at_the_process_limit(isolated: Sandbox) -> None:
    result = _run(
        isolated,
        """
        import os, time
        made = 0
        try:
            while made < 1000:
                if os.fork() == 0:
                    time.sleep(3)
                    os._exit(0)
                made += 1
        except OSError as exc:
            print(made, exc.errno)
        """,
    )
    made, err = map(int, result.stdout.split())
    assert err == errno.EAGAIN and made < LIMITS.processes, result
    _still_works(isolated)


def test_memory_bomb_is_memory_exceeded(isolated: Sandbox) -> None:
    result = _run(isolated, "blocks = [bytearray(1 << 30) for _ in range(4)]\n")
    assert result.status == "memory_exceeded" and "MemoryError" in result.stderr, result
    cpp = _run(
        isolated,
        """
        #include <cstring>
        #include <vector>
        int main() {
            std::vector<char*> kept;
            for (int i = 0; i < 4; i++) { char* p = new char[1 << 30]; std::memset(p, 1, 1 << 30); kept.push_back(p); }
        }
        """,
        language="cpp",
        name="main.cpp",
    )
    assert cpp.status == "memory_exceeded" and "bad_alloc" in cpp.stderr, cpp
    _still_works(isolated)


def test_cpu_spin_is_a_timeout(isolated: Sandbox) -> None:
    # The loop ends by itself after 5 CPU seconds; the CPU limit (1 s) stops it first, however
    # loaded the machine is (the wall-clock limit is only a backstop here).
    limits = Limits(run_timeout_s=60.0, cpu_s=1.0, memory_mb=256)
    code = "import time\nwhile time.process_time() < 5: pass\n"
    result = _run(isolated, code, limits=limits)
    assert result.status == "timeout" and "CPU" in result.message, result
    # The CPU it reports is about the limit. Not to the letter: the kernel checks RLIMIT_CPU
    # against CPU time sampled at its ticks, and wait4 reports the scheduler's exact time,
    # which a busy machine can leave lower (0.878 s once, beside four pytest workers).
    assert result.signal is not None and 0.75 <= result.cpu_s < 2.0, result
    _still_works(isolated)


def test_sleep_forever_is_a_timeout(isolated: Sandbox) -> None:
    limits = Limits(run_timeout_s=1.0, memory_mb=256)
    result = _run(
        isolated, "import time\nprint('before', flush=True)\ntime.sleep(8)\n", limits=limits
    )
    assert result.status == "timeout" and result.stdout == "before\n", result
    _still_works(isolated)


def test_endless_output_is_capped(isolated: Sandbox) -> None:
    limits = Limits(run_timeout_s=20.0, memory_mb=256, output_bytes=1 << 20)
    code = """
        import sys
        chunk = "x" * 65536
        for _ in range(300 * 16):  # 300 MB at most
            sys.stdout.write(chunk)
            sys.stderr.write(chunk)
    """
    result = _run(isolated, code, limits=limits)
    assert result.status == "output_exceeded", result.status
    assert result.stdout_truncated and len(result.stdout) == 1 << 20
    assert len(result.stderr) <= 1 << 20
    _still_works(isolated)


def test_double_forked_daemon_does_not_outlive_its_run(isolated: Sandbox) -> None:
    # The daemon leaves its session and its parent; _run asserts it is gone once the run
    # returned, with the session still open.
    code = """
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                sys.stdout.close(); sys.stderr.close()
                os.close(1); os.close(2)
                time.sleep(5)
                os._exit(0)
            os._exit(0)
        os.wait()
        print("parent done")
    """
    result = _run(isolated, code)
    assert (result.status, result.stdout) == ("ok", "parent done\n")
    _still_works(isolated)


def test_kill_minus_one_stays_inside(isolated: Sandbox) -> None:
    """kill(-1, SIGKILL) reaches only the item's own processes: not its runner (the PID
    namespace's init), not another item running at the same time, not the host."""
    hostile = """
        import os, signal, time
        time.sleep(0.2)
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:  # nothing of the item but the runner to signal
            pass
        print("still here")
    """
    normal = "import time\ntime.sleep(1.0)\nprint('fine')\n"
    marker = subprocess.Popen(["sleep", "60"])  # a host process kill(-1) must not reach

    async def side_by_side() -> list[RunResult]:
        async def item(code: str, runs: int) -> list[RunResult]:
            files = {"main.py": textwrap.dedent(code)}
            async with isolated.session("python", files, LIMITS) as session:
                return [await session.run("") for _ in range(runs)]

        first, second = await asyncio.gather(item(hostile, 2), item(normal, 1))
        return [*first, *second]

    try:
        again, twice, neighbour = asyncio.run(side_by_side())
        assert [r.stdout for r in (again, twice)] == ["still here\n"] * 2, (again, twice)
        assert (neighbour.status, neighbour.stdout) == ("ok", "fine\n")
        assert marker.poll() is None
        result = _run(isolated, hostile)
        assert (result.status, result.stdout) == ("ok", "still here\n"), result
    finally:
        marker.kill()
        marker.wait()
    _still_works(isolated)


def test_no_way_to_the_hosts_port(isolated: Sandbox, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    code = f"""
        import socket
        for host in ("127.0.0.1", "localhost", "10.0.2.2"):
            try:
                socket.create_connection((host, {port}), timeout=2).close()
                print("connected", host)
            except OSError as exc:
                print("refused", host, exc.errno)
    """
    result = _run(isolated, code)
    assert result.status == "ok" and "connected" not in result.stdout, result
    with pytest.raises(BlockingIOError):
        listener.accept()
    _still_works(isolated)


def test_host_files_are_not_there(isolated: Sandbox, host_files: dict[str, Path]) -> None:
    paths = [
        str(host_files["keys"]),
        str(Path(__file__).resolve()),  # the repository
        "/root",
        "/home",
        "/etc/shadow",
        "/etc/passwd",
        "/etc/hostname",
    ]
    code = f"""
        import os
        for path in {paths!r}:
            try:
                print(path, "READ", open(path).read()[:20] if os.path.isfile(path) else os.listdir(path))
            except OSError as exc:
                print(path, "no", exc.errno)
    """
    result = _run(isolated, code)
    assert result.status == "ok" and "READ" not in result.stdout, result.stdout
    assert SECRET not in result.stdout
    _still_works(isolated)


def test_no_view_of_the_servers_environment_or_processes(
    isolated: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REWARD_SERVER_API_KEY", SECRET)  # the server's environment
    code = f"""
        import os
        found = [k for k, v in os.environ.items() if {SECRET!r} in v]
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    if {SECRET!r}.encode() in open(f"/proc/{{pid}}/environ", "rb").read():
                        found.append(pid)
                except OSError:
                    pass
        print(sorted(os.environ), found, len([p for p in os.listdir("/proc") if p.isdigit()]))
    """
    result = _run(isolated, code)
    assert result.status == "ok", result
    names, found, visible = (
        result.stdout.rsplit(" ", 2)[0],
        result.stdout,
        result.stdout.split()[-1],
    )
    assert SECRET not in found and "[]" in found, found
    assert "REWARD_SERVER" not in names
    assert int(visible) <= 3  # the runner, this program (and a thread of /proc's listing)
    _still_works(isolated)


def test_writing_outside_the_work_dir_is_refused(
    isolated: Sandbox, host_files: dict[str, Path]
) -> None:
    target = host_files["target"]
    code = f"""
        import os
        for path in ("/x", "/usr/x", "/etc/x", "/dev/x", "/dev/shm/x", "/proc/x",
                     "/sandbox/x", "/sandbox/prog/main.py", "/sandbox/prog/new", {str(target)!r}):
            try:
                with open(path, "w") as f:
                    f.write("hacked")
                print(path, "WROTE")
            except OSError as exc:
                print(path, "no", exc.errno)
        with open("here.txt", "w") as f:  # the work dir itself is writable
            f.write("ok")
        with open("/tmp/t.txt", "w") as f:
            f.write("ok")
        print("work ok")
    """
    result = _run(isolated, code)
    assert result.status == "ok" and "WROTE" not in result.stdout, result.stdout
    assert result.stdout.endswith("work ok\n")
    assert target.read_text(encoding="utf-8") == "unchanged\n"
    _still_works(isolated)


def test_filling_the_work_dir_ends_in_enospc(isolated: Sandbox) -> None:
    code = """
        import errno
        written = 0
        with open("fill.bin", "wb", buffering=0) as f:
            try:
                while written < (1 << 30):
                    written += f.write(b"\\0" * (1 << 20))
            except OSError as exc:
                print(written >> 20, exc.errno)
    """
    result = _run(isolated, code)
    mb, err = map(int, result.stdout.split())
    assert err == errno.ENOSPC and mb <= LIMITS.workdir_mb, result
    _still_works(isolated)


def test_opening_files_until_refused(isolated: Sandbox) -> None:
    limits = Limits(run_timeout_s=30.0, memory_mb=256, open_files=64)
    code = """
        files = []
        try:
            while len(files) < 100000:
                files.append(open("/dev/null"))
        except OSError as exc:
            print(len(files), exc.errno)
    """
    result = _run(isolated, code, limits=limits)
    count, err = map(int, result.stdout.split())
    assert err == errno.EMFILE and count < 64, result
    _still_works(isolated)


def test_no_new_namespaces_and_no_privileges(isolated: Sandbox) -> None:
    code = """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        print(libc.unshare(0x10000000), ctypes.get_errno())  # CLONE_NEWUSER
        status = open("/proc/self/status").read()
        print([line.split()[1] for line in status.splitlines() if line.startswith(("CapEff", "CapPrm", "NoNewPrivs"))])
    """
    result = _run(isolated, code)
    first, second = result.stdout.splitlines()
    assert first.split()[0] == "-1", result.stdout
    assert second == "['0000000000000000', '0000000000000000', '1']"
    _still_works(isolated)


def test_the_runner_and_other_items_are_out_of_reach(isolated: Sandbox) -> None:
    """A program cannot read or trace the runner (PID 1), nor see a file another item
    running at the same time wrote in its own sandbox."""
    writer = "import time\nopen('/tmp/other-item.txt', 'w').write('mine')\ntime.sleep(1.5)\n"
    reader = """
        import ctypes, os, time
        time.sleep(0.5)
        for path in ("/proc/1/mem", "/proc/1/environ", "/proc/1/maps", "/tmp/other-item.txt"):
            try:
                open(path, "rb").read(16)
                print(path, "READ")
            except OSError as exc:
                print(path, "no", exc.errno)
        libc = ctypes.CDLL(None, use_errno=True)
        print("ptrace", libc.ptrace(16, 1, 0, 0), ctypes.get_errno())  # PTRACE_ATTACH
    """

    async def side_by_side() -> list[RunResult]:
        async def item(code: str) -> RunResult:
            files = {"main.py": textwrap.dedent(code)}
            async with isolated.session("python", files, LIMITS) as session:
                return await session.run("")

        return list(await asyncio.gather(item(writer), item(reader)))

    wrote, read = asyncio.run(side_by_side())
    assert wrote.status == "ok", wrote
    assert read.status == "ok" and "READ" not in read.stdout, read.stdout
    assert read.stdout.splitlines()[-1].split()[1] == "-1"  # ptrace refused
    _still_works(isolated)


# What a compiled program sees of its run: a bounded fork bomb, a new user namespace, then
# its session, parent, descriptors, status and limits as /proc shows them.
EXEC_VIEW = """
    #define _GNU_SOURCE
    #include <dirent.h>
    #include <errno.h>
    #include <sched.h>
    #include <signal.h>
    #include <stdio.h>
    #include <string.h>
    #include <unistd.h>
    static void copy(const char *path, const char *const keys[]) {
        char line[256];
        FILE *f = fopen(path, "r");
        while (f && fgets(line, sizeof line, f))
            for (int i = 0; keys[i]; i++)
                if (strncmp(line, keys[i], strlen(keys[i])) == 0) fputs(line, stdout);
        if (f) fclose(f);
    }
    int main(void) {
        pid_t kids[1000];
        int made = 0, err = 0;
        for (; made < 1000; made++) {
            pid_t pid = fork();
            if (pid == 0) { sleep(3); _exit(0); }
            if (pid < 0) { err = errno; break; }
            kids[made] = pid;
        }
        for (int i = 0; i < made; i++) kill(kids[i], SIGKILL);
        printf("fork %d %d\\n", made, err);
        printf("unshare %d\\n", unshare(CLONE_NEWUSER));
        printf("session %d ppid %d\\n", getsid(0) == getpid(), getppid());
        int fds = 0;
        DIR *dir = opendir("/proc/self/fd");
        for (struct dirent *e; (e = readdir(dir)) != NULL;) fds += e->d_name[0] != '.';
        closedir(dir);
        printf("fds %d\\n", fds - 1);  /* the listing's own descriptor left out */
        char cwd[256];
        printf("cwd %s\\n", getcwd(cwd, sizeof cwd));
        const char *const status[] = {"NoNewPrivs", "CapEff", "SigIgn", "SigBlk", 0};
        copy("/proc/self/status", status);
        const char *const limits[] = {
            "Max cpu time", "Max file size", "Max processes", "Max open files",
            "Max address space", "Max core file size", 0};
        copy("/proc/self/limits", limits);
        return 0;
    }
"""


def test_executables_start_isolated_and_limited(isolated_exec: Sandbox) -> None:
    """Under the native runner, a compiled program starts in a session of its own under the
    runner, with only its three pipes, default signals, no privileges, no new namespaces, a
    process count of its own run, and every limit of its Limits."""
    limits = Limits(
        run_timeout_s=30.0, cpu_s=2.5, memory_mb=256, processes=32, file_size_mb=8, open_files=40
    )
    result = _run(isolated_exec, EXEC_VIEW, limits=limits, language="c", name="main.c")
    assert result.status == "ok", result
    lines = result.stdout.splitlines()
    made, err = map(int, lines[0].split()[1:])
    assert err == errno.EAGAIN and made < limits.processes, lines[0]
    assert lines[1:4] == ["unshare -1", "session 1 ppid 1", "fds 3"], lines
    assert lines[4].startswith("cwd /sandbox/work/"), lines[4]
    status = {k: v.strip() for k, v in (line.split(":", 1) for line in lines[5:9])}
    # No signal ignored or blocked, however the server was started (nohup ignores SIGHUP),
    # glibc's own two (32, 33) included.
    ignored = int(status.pop("SigIgn"), 16)
    assert ignored == 0
    assert status == {"NoNewPrivs": "1", "CapEff": "0" * 16, "SigBlk": "0" * 16}
    seen = {" ".join(line.split()[:-3]): line.split()[-3:-1] for line in lines[9:]}
    mb = str(1 << 20)
    assert seen == {
        "Max cpu time": ["3", "4"],  # whole seconds, SIGKILL one after SIGXCPU
        "Max file size": [str(8 << 20)] * 2,
        "Max processes": ["32", "32"],
        "Max open files": ["40", "40"],
        "Max address space": [str(256 * int(mb))] * 2,
        "Max core file size": ["0", "0"],
    }
    _still_works(isolated_exec)


# A compiled program against its runner (PID 1 of the item's sandbox): what it can see of
# PID 1, a double-forked daemon, and kill(-1, SIGKILL), chosen by its input.
HOSTILE_EXEC = r"""
    #define _GNU_SOURCE
    #include <errno.h>
    #include <fcntl.h>
    #include <signal.h>
    #include <stdio.h>
    #include <string.h>
    #include <sys/ptrace.h>
    #include <sys/wait.h>
    #include <unistd.h>
    int main(void) {
        char what[16] = "";
        if (scanf("%15s", what) != 1) return 2;
        if (strcmp(what, "probe") == 0) {
            char cmd[256] = {0};
            int fd = open("/proc/1/cmdline", O_RDONLY);
            ssize_t n = fd < 0 ? -1 : read(fd, cmd, sizeof cmd - 1);
            for (ssize_t i = 0; i < n; i++) if (cmd[i] == 0) cmd[i] = ' ';
            printf("init %s\n", cmd);
            const char *paths[] = {"/proc/1/mem", "/proc/1/environ", "/proc/1/maps", 0};
            for (int i = 0; paths[i]; i++) {
                char buf[16];
                int f = open(paths[i], O_RDONLY);
                printf("%s %s\n", paths[i], f >= 0 && read(f, buf, sizeof buf) > 0 ? "READ" : "no");
            }
            errno = 0;
            long traced = ptrace(PTRACE_ATTACH, 1, 0, 0);
            printf("ptrace %ld %d\n", traced, errno);
        } else if (strcmp(what, "daemon") == 0) {
            if (fork() == 0) {
                setsid();
                if (fork() == 0) { close(0); close(1); close(2); sleep(5); _exit(0); }
                _exit(0);
            }
            wait(NULL);
            printf("parent done\n");
        } else if (strcmp(what, "kill") == 0) {
            usleep(200000);
            kill(-1, SIGKILL);
            printf("still here\n");
        }
        return 0;
    }
"""
SLEEPER_EXEC = (
    '#include <stdio.h>\n#include <unistd.h>\nint main(void) { sleep(2); puts("fine"); }\n'
)


def test_hostile_executables_leave_their_runner_alone(isolated_exec: Sandbox) -> None:
    """Against the native runner: PID 1 cannot be read or traced, a daemon that leaves its
    run dies with it, and kill(-1, SIGKILL) reaches neither the runner, nor another item
    running at the same time, nor the host."""
    marker = subprocess.Popen(["sleep", "60"])  # a host process kill(-1) must not reach

    async def side_by_side() -> tuple[list[RunResult], list[str], RunResult]:
        async def hostile() -> tuple[list[RunResult], list[str]]:
            async with isolated_exec.session("c", {"main.c": textwrap.dedent(HOSTILE_EXEC)}, LIMITS) as item:  # fmt: skip
                assert item.compile_result.ok, item.compile_result
                results = [await item.run("probe"), await item.run("daemon")]
                outer = item.pid
                assert outer is not None
                left = _wait_for(lambda: _tree(outer), lambda tree: len(tree) <= 2)
                results += [await item.run("kill"), await item.run("daemon")]
                return results, left

        async def neighbour() -> RunResult:
            async with isolated_exec.session("c", {"main.c": SLEEPER_EXEC}, LIMITS) as item:
                return await item.run("")

        (results, left), other = await asyncio.gather(hostile(), neighbour())
        return results, left, other

    try:
        (probe, daemon, killer, again), left, other = asyncio.run(side_by_side())
        assert marker.poll() is None
    finally:
        marker.kill()
        marker.wait()
    assert all(r.status == "ok" for r in (probe, daemon, killer, again, other))
    lines = probe.stdout.splitlines()
    runner = "/sandbox/launch serve bwrap /sandbox"
    assert lines[0].startswith(f"init {runner}"), lines[0]
    assert lines[1:4] == [f"/proc/1/{name} no" for name in ("mem", "environ", "maps")]
    assert lines[4].split()[1] == "-1", lines[4]  # ptrace refused
    assert len(left) == 2, f"left inside the sandbox after the daemon's run: {left}"
    outputs = [r.stdout for r in (daemon, killer, again)]
    assert outputs == ["parent done\n", "still here\n", "parent done\n"], outputs
    assert other.stdout == "fine\n"
    _still_works(isolated_exec)
