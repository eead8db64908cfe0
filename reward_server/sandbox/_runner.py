"""The runner inside one item's sandbox: builds the program once, then forks each run.

Not imported by the server: its text goes to the sandbox's interpreter as ``python3 -I -S
-c SOURCE CONFIG`` (standard library only, Python 3.8+). In ``bwrap`` mode it is PID 1 of
the item's PID namespace (``--as-pid-1``): the kernel drops signals to a namespace's init
that has no handler for them (SIGKILL included), so programs cannot kill it; orphans are
re-parented to it and killed; when it exits, everything left in the namespace dies. At
start it enters a user and mount namespace of its own, with the right to mount: the work
directory becomes a tmpfs with a size and an inode cap (bwrap cannot cap inodes), and the
program's folder is remounted read-only once built.

Each job (build, syntax check, run) is a fork that starts a session (its process group is
killed as one), enters a user namespace of its own (``RLIMIT_NPROC`` counts per user
namespace: each run has its own count; and it may create no further namespaces), takes the
three pipes the server passed for stdin/stdout/stderr and closes every other descriptor,
sets its rlimits, ``no_new_privs`` and default signals in a fresh work directory, then
``exec``s the program, or (Python) drops its capabilities and runs the code object
compiled once, as ``__main__``. The runner kills a job at its wall-clock deadline (its
process group, then whatever escaped it) and reports its wait status, CPU and wall time over
the control socket (JSON on SOCK_SEQPACKET; a job's pipes come with SCM_RIGHTS). When the
socket closes, it kills everything and exits.
"""

import array
import contextlib
import ctypes
import json
import math
import os
import resource
import select
import shutil
import signal
import socket
import sys
import time
import traceback

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38
MAX_FDS = 3

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source, target, fstype, flags, data=None):
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {target}",
    )


def _prctl(option, value):
    _check(
        _libc.prctl(option, ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0), 0),
        f"prctl {option}",
    )


def _write(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _own_user_namespace(mount_ns):
    """Enter a new user namespace (and mount namespace) mapping only our own ids."""
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWUSER | (CLONE_NEWNS if mount_ns else 0)), "unshare")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1")
    _write("/proc/self/gid_map", f"{gid} {gid} 1")


def _drop_capabilities():
    """Clear every capability (those of the run's own user namespace, for the Python path,
    which does not exec)."""

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        ]

    header = Header(0x20080522, 0)
    data = (Data * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")


class Job:
    """One forked job, from its start to its report."""

    def __init__(self, msg, pid, tdir, err_r):
        self.id = msg["id"]
        self.kind = msg["kind"]
        self.seal = bool(msg.get("seal"))
        self.path = msg.get("path")
        self.pid = pid
        self.started = time.monotonic()
        self.deadline = self.started + float(msg["limits"]["timeout_s"])
        self.timed_out = False
        self.killed = False
        self.tdir = tdir
        self.err_r = err_r


class Runner:
    def __init__(self, cfg):
        self.cfg = cfg
        self.bwrap = cfg["mode"] == "bwrap"
        self.root = cfg["root"]
        self.prog = os.path.join(self.root, "prog")
        self.work = os.path.join(self.root, "work")
        self.ctl = socket.socket(fileno=cfg["control_fd"])
        self.ctl.setblocking(True)
        self.jobs = {}
        self.code = None
        self.counter = 0
        self.env = dict(cfg["env"])
        self.files = list(cfg["files"])

    # -- setup ------------------------------------------------------------------------
    def setup(self):
        # The out-of-memory killer takes the sandbox's processes before the server.
        with contextlib.suppress(OSError):
            _write("/proc/self/oom_score_adj", "1000")
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if self.bwrap:
            _own_user_namespace(mount_ns=True)
            _mount(None, "/", None, MS_REC | MS_PRIVATE)
            _mount(
                "tmpfs",
                self.work,
                "tmpfs",
                MS_NOSUID | MS_NODEV,
                f"size={self.cfg['workdir_bytes']},nr_inodes={self.cfg['inodes']},mode=0700",
            )
        else:
            # Orphans of the programs come back to the runner, which kills them.
            _prctl(PR_SET_CHILD_SUBREAPER, 1)
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            os.makedirs(self.work, exist_ok=True)
        os.makedirs(os.path.join(self.work, "tmp"), exist_ok=True)
        # Programs must not touch the runner: no ptrace, no /proc/1/mem, no core dumps
        # (last: writing our own uid_map above needs /proc/self to be ours).
        _prctl(PR_SET_DUMPABLE, 0)

    def seal(self):
        """The program's folder becomes read-only, its build included (the whole tmpfs
        holding it; the work directory is a mount of its own and stays writable)."""
        if self.bwrap:
            _mount(None, self.root, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)

    # -- messages ---------------------------------------------------------------------
    def send(self, msg):
        with contextlib.suppress(OSError):  # the server is gone: the loop sees EOF next
            self.ctl.send(json.dumps(msg).encode())

    def receive(self):
        fds = array.array("i")
        data, ancdata, _flags, _addr = self.ctl.recvmsg(1 << 20, socket.CMSG_SPACE(MAX_FDS * 4))
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                usable = len(payload) - len(payload) % fds.itemsize
                fds.frombytes(payload[:usable])
        return data, list(fds)

    def handle(self, data, fds):
        try:
            msg = json.loads(data.decode())
            op = msg.get("op")
            if op == "job" and self.start(msg, fds):
                fds = []  # the job's now
            elif op == "seal":
                error = None
                try:
                    self.seal()
                except OSError as exc:
                    error = f"seal: {exc}"
                self.send({"op": "done", "id": msg["id"], "error": error})
            elif op == "kill":
                job = self._job_by_id(msg["id"])
                if job is not None:
                    job.killed = True
                    self.kill_job(job)
        except Exception as exc:  # a bad message must not end the item's sandbox
            sys.stderr.write(f"runner: bad message: {type(exc).__name__}: {exc}\n")
        finally:
            for fd in fds:
                os.close(fd)

    def _job_by_id(self, job_id):
        for job in self.jobs.values():
            if job.id == job_id:
                return job
        return None

    # -- jobs -------------------------------------------------------------------------
    def start(self, msg, fds):
        """Fork the job; whether it took the descriptors (else the caller closes them)."""
        if len(fds) != 3:
            self.send({"op": "done", "id": msg["id"], "error": "expected 3 pipes"})
            return False
        self.counter += 1
        tdir = None if msg["cwd"] == "prog" else os.path.join(self.work, f"t{self.counter}")
        try:
            if tdir:
                self.make_test_dir(tdir)
        except OSError as exc:
            self.send({"op": "done", "id": msg["id"], "error": f"work dir: {exc}"})
            return False
        # The child reports a failure before the program starts on this pipe; exec (or the
        # Python path, explicitly) closes it, so EOF with no data means the program ran.
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(err_r)
            os.close(err_w)
            self.send({"op": "done", "id": msg["id"], "error": f"fork: {exc}"})
            return False
        if pid == 0:
            child(self, msg, fds, tdir or self.prog, err_w)  # never returns
        for fd in (*fds, err_w):
            os.close(fd)
        self.jobs[pid] = Job(msg, pid, tdir, err_r)
        return True

    def make_test_dir(self, tdir):
        """A fresh directory holding links to the program's files (read-only)."""
        os.mkdir(tdir, 0o700)
        for rel in self.files:
            link = os.path.join(tdir, rel)
            parent = os.path.dirname(link)
            if parent != tdir:
                os.makedirs(parent, exist_ok=True)
            os.symlink(os.path.join(self.prog, rel), link)

    def kill_job(self, job):
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(OSError):
                kill(job.pid, signal.SIGKILL)

    def reap(self):
        """Collect every child that exited; report the jobs among them once whatever they
        left behind is dead."""
        ended = []
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            if pid == 0:
                break
            job = self.jobs.pop(pid, None)
            if job is not None:  # else an orphan we killed, or one that ended on its own
                ended.append((job, status, usage, time.monotonic()))
        if not ended:
            return
        for job, _, _, _ in ended:
            with contextlib.suppress(OSError):  # what is left of the job's group goes with it
                os.killpg(job.pid, signal.SIGKILL)
        self.settle()
        for job, status, usage, ended_at in ended:
            self.finish(job, status, usage, ended_at)

    def settle(self, limit_s=0.25):
        """Kill and reap the runner's children that are not jobs until there are none (their
        parents just died, so they are still being re-parented to the runner), for at most
        ``limit_s``; the periodic scan gets any that come later."""
        deadline = time.monotonic() + limit_s
        while True:
            others = [pid for pid in self.children() if pid not in self.jobs]
            if not others:
                return
            for pid in others:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.waitpid(pid, os.WNOHANG)
            if time.monotonic() > deadline:
                return
            time.sleep(0.002)

    def finish(self, job, status, usage, ended_at):
        wall = ended_at - job.started
        error = None
        try:
            os.set_blocking(job.err_r, False)
            failure = os.read(job.err_r, 4096)
        except OSError:
            failure = b""
        finally:
            os.close(job.err_r)
        if failure:
            error = "job setup: {}".format(failure.decode("utf-8", "replace"))
        elif job.kind == "pycheck" and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            try:
                path = job.path
                with open(path, "rb") as f:
                    self.code = compile(f.read(), path, "exec", dont_inherit=True)
            except BaseException as exc:
                error = f"compile in runner: {exc}"
        if job.seal:
            try:
                self.seal()
            except OSError as exc:
                error = f"seal: {exc}"
        if job.tdir:
            shutil.rmtree(job.tdir, ignore_errors=True)
        self.send(
            {
                "op": "done",
                "id": job.id,
                "status": status,
                "timed_out": job.timed_out,
                "killed": job.killed,
                "cpu_s": usage.ru_utime + usage.ru_stime,
                "maxrss_kb": usage.ru_maxrss,
                "wall_s": wall,
                "error": error,
            }
        )

    def children(self):
        pid = os.getpid()
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                return [int(x) for x in f.read().split()]
        except OSError:
            return []

    def kill_orphans(self):
        """Kill every child that is not a job: it outlived the job that started it."""
        found = False
        for pid in self.children():
            if pid not in self.jobs:
                found = True
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        return found

    def check_deadlines(self):
        now = time.monotonic()
        for job in self.jobs.values():
            if not job.timed_out and now >= job.deadline:
                job.timed_out = True
                self.kill_job(job)

    def next_timeout(self, orphans):
        """Seconds until the loop must look again: the nearest deadline, and a scan for
        escaped processes five times a second while anything runs; None when idle."""
        if not self.jobs and not orphans:
            return None
        timeout = 0.2
        live = [job.deadline for job in self.jobs.values() if not job.timed_out]
        if live:
            timeout = min(timeout, max(0.0, min(live) - time.monotonic()))
        return timeout

    def shutdown(self):
        for job in list(self.jobs.values()):
            self.kill_job(job)
        self.kill_orphans()

    # -- the loop ---------------------------------------------------------------------
    def loop(self):
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        poller = select.poll()
        poller.register(self.ctl.fileno(), select.POLLIN)
        poller.register(wake_r, select.POLLIN)
        self.send({"op": "ready", "pid": os.getpid(), "python": sys.version.split()[0]})
        orphans = False
        while True:
            timeout = self.next_timeout(orphans)
            try:
                events = poller.poll(None if timeout is None else int(timeout * 1000) + 1)
            except InterruptedError:
                events = []
            for fd, _ in events:
                if fd == wake_r:
                    try:
                        while os.read(wake_r, 512):
                            pass
                    except OSError:
                        pass
                    continue
                data, fds = self.receive()
                if not data:
                    for extra in fds:
                        os.close(extra)
                    self.shutdown()
                    return
                self.handle(data, fds)
            self.reap()
            self.check_deadlines()
            orphans = self.kill_orphans()


# -- the forked job's side ------------------------------------------------------------


def child(runner, msg, fds, cwd, err_w):
    """The forked job: isolate, limit, then exec or run the code. Never returns."""
    code = 127
    started = False
    try:
        signal.set_wakeup_fd(-1)
        os.setsid()
        if runner.bwrap:
            # Writing our own uid_map needs /proc/self owned by us again.
            _prctl(PR_SET_DUMPABLE, 1)
            _own_user_namespace(mount_ns=False)
            _write("/proc/sys/user/max_user_namespaces", "0")
        else:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd > 2 and fd != err_w:
                with contextlib.suppress(OSError):
                    os.close(fd)
        os.chdir(cwd)
        set_limits(msg["limits"])
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        kind = msg["kind"]
        if kind == "exec":
            for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            env = dict(runner.env)
            env.update(msg.get("env") or {})
            os.execvpe(msg["argv"][0], msg["argv"], env)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if runner.bwrap:
            _drop_capabilities()
        os.environ.clear()
        os.environ.update(runner.env)
        started = True
        os.close(err_w)
        if kind == "pycheck":
            code = check_python(msg["path"])
        else:
            code = run_python(runner.code, msg["path"])
    except BaseException as exc:
        text = f"{type(exc).__name__}: {exc}"
        try:
            if started:  # the program's own failure (Python path): its stderr
                os.write(2, text.encode() + b"\n")
            else:  # the sandbox's: reported to the runner
                os.write(err_w, text.encode()[:4000])
        except OSError:
            pass
    os._exit(code)


def set_limits(lim):
    def limit(which, value):
        value = int(value)
        hard = resource.getrlimit(which)[1]
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))

    cpu = max(1, math.ceil(float(lim["cpu_s"])))
    # SIGXCPU at the limit, SIGKILL a second later if the program ignores it.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    limit(resource.RLIMIT_AS, lim["as_bytes"])
    limit(resource.RLIMIT_FSIZE, lim["fsize_bytes"])
    limit(resource.RLIMIT_NOFILE, lim["nofile"])
    limit(resource.RLIMIT_STACK, lim["stack_bytes"])
    limit(resource.RLIMIT_CORE, 0)
    if lim.get("nproc"):
        limit(resource.RLIMIT_NPROC, lim["nproc"])


def check_python(path):
    with open(path, "rb") as f:
        source = f.read()
    try:
        compile(source, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as exc:
        text = "".join(traceback.format_exception_only(type(exc), exc))
        os.write(2, text.encode("utf-8", "backslashreplace"))
        return 1
    return 0


def run_python(code, path):
    """Run the compiled program as ``python3 path`` would, in this forked process."""
    import atexit
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = builtins
    main.__cached__ = None
    sys.modules["__main__"] = main
    sys.argv[:] = [path]
    sys.path.insert(0, os.path.dirname(path))
    sys.dont_write_bytecode = True
    # The program's standard streams, as Python opens them for pipes (they live as long
    # as this process: no context manager).
    sys.stdin = sys.__stdin__ = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stderr = sys.__stderr__ = open(  # noqa: SIM115
        2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False
    )
    status = 0
    try:
        exec(code, main.__dict__)
    except SystemExit as exc:
        status = _exit_status(exc)
    except BaseException as exc:
        status = 1
        tb = exc.__traceback__.tb_next if exc.__traceback__ else None  # not our frame
        with contextlib.suppress(BaseException):
            sys.excepthook(type(exc), exc.with_traceback(tb), tb)
    threading = sys.modules.get("threading")
    try:
        if threading is not None:
            threading._shutdown()  # wait for non-daemon threads, as Python's exit does
        atexit._run_exitfuncs()
    except SystemExit as exc:
        status = _exit_status(exc)
    except BaseException:
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            status = status or 120
    return status


def _exit_status(exc):
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(BaseException):
        sys.stderr.write(str(code) + "\n")
    return 1


def main():
    cfg = json.loads(sys.argv[1])
    import site  # with -S, importing site does not run it: only exit() and quit() are wanted

    site.setquit()
    runner = Runner(cfg)
    try:
        runner.setup()
    except BaseException as exc:
        runner.send({"op": "fatal", "error": f"{type(exc).__name__}: {exc}"})
        raise
    runner.loop()


if __name__ == "__main__":
    main()
