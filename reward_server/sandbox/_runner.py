"""The Python runner inside one item's sandbox whose program is in Python: it checks the
program once, then starts each run as a fork of itself that runs the code compiled once (the
warm path: no interpreter start per run). Items whose programs are executables have the
native runner (``_serve.c``), which does this module's job for them without an interpreter;
the two read the same messages (``_launch.h``) and write the same reports.

Not imported by the server: the sandbox's interpreter gets ``_runner_job.py``'s text then
this one's as ``python3 -I -S -c SOURCE MODE ROOT CONTROL_FD WORKDIR_BYTES INODES -- FILE...``
(the native runner's arguments). In ``bwrap`` mode it is PID 1 of the item's PID namespace
(``--as-pid-1``): the kernel drops signals to a namespace's init that has no handler for
them (SIGKILL included), so programs cannot kill it; orphans are re-parented to it and
killed; when it exits, everything left in the namespace dies. At start it enters a user and
mount namespace of its own, with the right to mount: the work directory becomes a tmpfs
with a size and an inode cap (bwrap cannot cap inodes), and the program's folder is
remounted read-only once built. It kills a job at its wall-clock deadline (its process
group, then whatever escaped it) and reports its wait status, CPU and wall time over the
control socket (SOCK_SEQPACKET: NUL-separated fields from the server, every one checked,
JSON to it; a job's pipes come with SCM_RIGHTS). When the socket closes, it kills
everything and exits.
"""

# Cheap imports only (see _runner_job.py).
import _signal as signal
import _sitebuiltins
import _socket as socket
import builtins
import os
import select
import sys
import time

if __name__ != "__main__":  # imported by the server's checks; in the sandbox, defined above
    from reward_server.sandbox._runner_job import (
        MS_BIND,
        MS_NODEV,
        MS_NOSUID,
        MS_PRIVATE,
        MS_RDONLY,
        MS_REC,
        MS_REMOUNT,
        PR_SET_CHILD_SUBREAPER,
        PR_SET_DUMPABLE,
        PR_SET_PDEATHSIG,
        child,
        mount,
        own_user_namespace,
        prctl,
        quietly,
        write_file,
    )

MAX_FDS = 3
SCAN_S = 0.2  # seconds between scans for processes that escaped their job's group
# What a message may hold (_launch.h): the same bounds as the native runner's.
MAX_MESSAGE, MAX_FIELDS, MAX_ENV, JOB_FIELDS = 1 << 20, 4096, 64, 13
MAX_SECONDS, MAX_LIMIT = 1e9, 1 << 48
LIMITS = ("as_bytes", "fsize_bytes", "nofile", "stack_bytes", "nproc")


def _rmtree(top):
    """Remove a job's directory, whatever the program did to it (modes, depth, links)."""
    stack, folders = [top], []
    while stack:
        folder = stack.pop()
        folders.append(folder)
        quietly(os.chmod, folder, 0o700)
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            else:
                quietly(os.unlink, entry.path)
    for folder in reversed(folders):
        quietly(os.rmdir, folder)


def _json(value):
    """JSON of a message: a flat dict of strings, numbers, booleans and None."""
    parts = []
    for key, item in value.items():
        if item is None or item is True or item is False:
            text = "null" if item is None else "true" if item else "false"
        elif isinstance(item, (int, float)):
            text = repr(item)
        else:  # a string: escape what JSON needs escaped, keep the rest
            chars = (c if c >= " " and c not in '"\\' else "\\u%04x" % ord(c) for c in str(item))  # noqa: UP031
            text = '"' + "".join(chars) + '"'
        parts.append(f'"{key}":{text}')
    return "{" + ",".join(parts) + "}"


class BadMessage(Exception):
    """A message the runner refuses; its text is the answer."""


def _count(text, top, what="bad job message"):
    """A whole number in decimal digits only (no sign, no space, no underscore), <= top."""
    if not (text.isascii() and text.isdigit() and len(text) <= 20) or int(text) > top:
        raise BadMessage(what)
    return int(text)


def _seconds(text, what):
    """Seconds as repr() writes a float: digits first, finite, from 0 to MAX_SECONDS."""
    try:
        if not (text[:1].isdigit() and text.isascii() and not set(text) - set("0123456789.eE+-")):
            raise ValueError(text)
        value = float(text)
    except ValueError:
        raise BadMessage(what) from None
    if not 0.0 <= value <= MAX_SECONDS:  # NaN is neither
        raise BadMessage(what)
    return value


def fields_of(data):
    """A message's fields (NUL-separated), decoded as the server encoded them."""
    fields = data.split(b"\0")
    if fields and not fields[-1]:
        fields.pop()
    if len(data) >= MAX_MESSAGE or len(fields) > MAX_FIELDS:
        raise BadMessage("bad message")
    return [os.fsdecode(field) for field in fields]


def parse_id(text):
    job_id = _count(text, (1 << 63) - 1, "bad message")
    if job_id == 0:
        raise BadMessage("bad message")
    return job_id


def parse_job(f):
    """job ID KIND CWD SEAL TIMEOUT_S CPU_S AS FSIZE NOFILE STACK NPROC NENV ENV... PATH,
    checked as the native runner checks it (``parse_job`` in ``_message.c``)."""
    n = len(f)
    if n < JOB_FIELDS + 1:
        raise BadMessage("bad job message")
    nenv = _count(f[12], MAX_ENV)
    if n != JOB_FIELDS + nenv + 1:
        raise BadMessage("bad job message")
    if f[2] not in ("python", "pycheck"):
        raise BadMessage("bad job message: the Python runner runs Python programs")
    if f[3] not in ("prog", "test") or f[4] not in ("0", "1"):
        raise BadMessage("bad job message")
    job = {"id": parse_id(f[1]), "kind": f[2], "in_test": f[3] == "test", "seal": f[4] == "1"}
    job["timeout_s"] = _seconds(f[5], "bad job message: timeout_s")
    job["cpu_s"] = _seconds(f[6], "bad job message: cpu_s")
    for i, name in enumerate(LIMITS):
        job[name] = _count(f[7 + i], MAX_LIMIT, "bad job message: limits")
    env = f[JOB_FIELDS : JOB_FIELDS + nenv]
    if not all("=" in entry for entry in env):
        raise BadMessage("bad job message: environment")
    job["env"] = dict(entry.split("=", 1) for entry in env)
    job["path"] = f[-1]
    return job


class Job:
    """One forked job, from its start to its report."""

    def __init__(self, msg, pid, tdir, err_r):
        self.id = msg["id"]
        self.kind = msg["kind"]
        self.seal = msg["seal"]
        self.path = msg["path"]
        self.pid = pid
        self.started = time.monotonic()
        self.deadline = self.started + msg["timeout_s"]
        self.timed_out = False
        self.killed = False
        self.tdir = tdir
        self.err_r = err_r


class Runner:
    def __init__(self, args):
        """``args``: MODE ROOT CONTROL_FD WORKDIR_BYTES INODES -- FILE..."""
        if len(args) < 6 or args[0] not in ("bwrap", "none") or args[5] != "--":
            raise ValueError("usage: MODE ROOT CONTROL_FD WORKDIR_BYTES INODES -- FILE...")
        self.bwrap = args[0] == "bwrap"
        self.root = args[1]
        control_fd = _count(args[2], (1 << 31) - 1, "bad control descriptor")
        self.workdir_bytes = _count(args[3], MAX_LIMIT, "bad work directory size")
        self.inodes = _count(args[4], MAX_LIMIT, "bad inode count")
        self.files = list(args[6:])
        self.prog = os.path.join(self.root, "prog")
        self.work = os.path.join(self.root, "work")
        self.ctl = socket.socket(fileno=control_fd)
        self.ctl.setblocking(True)
        # Every descriptor of the runner is close-on-exec (Python's default for its own;
        # this one came from bwrap).
        os.set_inheritable(control_fd, False)
        self.jobs = {}
        self.code = None
        self.counter = 0
        self.env = dict(os.environ)  # the sandbox's: the programs' environment

    # -- setup ------------------------------------------------------------------------
    def setup(self):
        # The out-of-memory killer takes the sandbox's processes before the server.
        quietly(write_file, "/proc/self/oom_score_adj", "1000")
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if self.bwrap:
            own_user_namespace(mount_ns=True)
            mount(None, "/", None, MS_REC | MS_PRIVATE)
            mount(
                "tmpfs",
                self.work,
                "tmpfs",
                MS_NOSUID | MS_NODEV,
                f"size={self.workdir_bytes},nr_inodes={self.inodes},mode=0700",
            )
        else:
            # Orphans of the programs come back to the runner, which kills them.
            prctl(PR_SET_CHILD_SUBREAPER, 1)
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            os.makedirs(self.work, exist_ok=True)
        os.makedirs(os.path.join(self.work, "tmp"), exist_ok=True)
        # Programs must not touch the runner: no ptrace, no /proc/1/mem, no core dumps
        # (last: writing our own uid_map above needs /proc/self to be ours).
        prctl(PR_SET_DUMPABLE, 0)

    def seal(self):
        """The program's folder becomes read-only, its build included (the whole tmpfs
        holding it; the work directory is a mount of its own and stays writable)."""
        if self.bwrap:
            mount(None, self.root, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)

    # -- messages ---------------------------------------------------------------------
    def send(self, msg):
        # If the server is gone, the loop sees EOF next.
        quietly(self.ctl.send, _json(msg).encode("utf-8", "backslashreplace"))

    def receive(self):
        fds = []  # native ints (no array module: its import costs a few ms per item)
        data, ancdata, _flags, _addr = self.ctl.recvmsg(1 << 20, socket.CMSG_SPACE(MAX_FDS * 4))
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                for i in range(0, len(payload) - len(payload) % 4, 4):
                    fds.append(int.from_bytes(payload[i : i + 4], sys.byteorder, signed=True))
        return data, fds

    def handle(self, data, fds):
        job_id = None
        try:
            f = fields_of(data)
            if len(f) < 2:
                raise BadMessage("bad message")
            job_id = parse_id(f[1])
            if f[0] == "job":
                if self.start(parse_job(f), fds):
                    fds = []  # the job's now
            elif f[0] == "seal" and len(f) == 2:
                error = None
                try:
                    self.seal()
                except OSError as exc:
                    error = f"seal: {exc}"
                self.send({"op": "done", "id": job_id, "error": error})
            elif f[0] == "kill" and len(f) == 2:
                job = self._job_by_id(job_id)
                if job is not None:
                    job.killed = True
                    self.kill_job(job)
            else:
                raise BadMessage("bad message")
        except Exception as exc:  # a bad message must not end the item's sandbox
            if isinstance(exc, BadMessage) and job_id is not None:
                self.send({"op": "done", "id": job_id, "error": str(exc)})
            else:
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
        tdir = os.path.join(self.work, f"t{self.counter}") if msg["in_test"] else None
        try:
            if tdir:
                self.make_test_dir(tdir)
        except OSError as exc:
            self.send({"op": "done", "id": msg["id"], "error": f"work dir: {exc}"})
            return False
        # The child reports a failure before the program starts on this pipe; exec (or the
        # Python path, explicitly) closes it, so EOF with no data means the program ran.
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        cwd = tdir or self.prog
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(err_r)
            os.close(err_w)
            self.send({"op": "done", "id": msg["id"], "error": f"fork: {exc}"})
            return False
        if pid == 0:
            child(self, msg, fds, cwd, err_w)  # never returns
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
        quietly(os.killpg, job.pid, signal.SIGKILL)
        quietly(os.kill, job.pid, signal.SIGKILL)

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
        for job, _, _, _ in ended:  # what is left of the job's group goes with it
            quietly(os.killpg, job.pid, signal.SIGKILL)
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
                quietly(os.kill, pid, signal.SIGKILL)
                quietly(os.waitpid, pid, os.WNOHANG)
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
            _rmtree(job.tdir)
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
                quietly(os.kill, pid, signal.SIGKILL)
        return found

    def check_deadlines(self):
        now = time.monotonic()
        for job in self.jobs.values():
            if not job.timed_out and now >= job.deadline:
                job.timed_out = True
                self.kill_job(job)

    def next_timeout(self, orphans):
        """Seconds until the loop must look again: the nearest deadline, or the next scan
        for escaped processes (five a second while anything runs); None when idle."""
        if not self.jobs and not orphans:
            return None
        wake = [self.next_scan]
        wake += [job.deadline for job in self.jobs.values() if not job.timed_out]
        return max(0.0, min(wake) - time.monotonic())

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
        self.send({"op": "ready", "pid": os.getpid(), "runner": "python"})
        orphans = False
        self.next_scan = 0.0
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
            if time.monotonic() >= self.next_scan:  # jobs that end are settled at once
                orphans = self.kill_orphans()
                self.next_scan = time.monotonic() + SCAN_S


def main():
    # What site would add with -S left out: exit() and quit().
    builtins.exit = _sitebuiltins.Quitter("exit", "Ctrl-D (i.e. EOF)")
    builtins.quit = _sitebuiltins.Quitter("quit", "Ctrl-D (i.e. EOF)")
    runner = Runner(sys.argv[1:])
    try:
        runner.setup()
    except BaseException as exc:
        runner.send({"op": "fatal", "error": f"{type(exc).__name__}: {exc}"})
        raise
    runner.loop()


if __name__ == "__main__":
    main()
