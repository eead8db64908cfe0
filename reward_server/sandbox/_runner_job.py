"""The forked side of the Python runner (``_runner.py``): one job, from the fork to the
program (the native runner's jobs, which exec executables, do the same steps in C:
``start_program`` in ``_launch.c``).

The sandbox's interpreter gets this text followed by ``_runner.py``'s as one ``-c`` source
(standard library only, Python 3.8+). A job (the syntax check, a run) is a fork of the
runner that starts a session (its process group is killed as one), enters a user namespace
of its own (``RLIMIT_NPROC`` counts per user namespace, so each run has its own count, and it
may create no further namespaces), takes the three pipes the server passed as 0-2 and keeps
no other descriptor, sets its rlimits, ``no_new_privs`` and default signals in its work
directory, drops its capabilities and runs the code object the runner compiled once, as
``__main__``. A failure before the program starts is written on a pipe the runner reads
(closed once the program starts: EOF with no data means it started).
"""

# Only modules that cost nothing to import (C modules, no enum, no re): the runner starts
# once per item, and json, socket, signal or traceback would double its start-up time.
import _signal as signal
import builtins
import ctypes
import math
import os
import resource
import sys

CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 4, 36, 38

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result, what):
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source, target, fstype, flags, data=None):
    args = [x.encode() if x else None for x in (source, target, fstype)]
    mounted = _libc.mount(*args, ctypes.c_ulong(flags), data.encode() if data else None)
    _check(mounted, f"mount {target}")


def prctl(option, value):
    _check(
        _libc.prctl(option, ctypes.c_ulong(value), ctypes.c_ulong(0), ctypes.c_ulong(0), 0),
        f"prctl {option}",
    )


def quietly(fn, *args):
    """``fn(*args)``, an OSError ignored (a process already gone, a file already closed);
    contextlib would cost start-up time."""
    try:  # noqa: SIM105
        fn(*args)
    except OSError:
        pass


def write_file(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def own_user_namespace(mount_ns):
    """Enter a new user namespace (and mount namespace) mapping only our own ids."""
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(CLONE_NEWUSER | (CLONE_NEWNS if mount_ns else 0)), "unshare")
    write_file("/proc/self/setgroups", "deny")
    write_file("/proc/self/uid_map", f"{uid} {uid} 1")
    write_file("/proc/self/gid_map", f"{gid} {gid} 1")


def _drop_capabilities():
    """Clear every capability (those of the run's own user namespace, for the Python path,
    which does not exec): capset, version 3 header, two empty sets of three masks."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)
    _check(_libc.capset(header, (ctypes.c_uint32 * 6)()), "capset")


def child(runner, msg, fds, cwd, err_w):
    """The forked job: isolate, limit, then run the code. Never returns."""
    code = 127
    started = False
    try:
        _isolate(runner, msg, fds, cwd, err_w)
        default_signals()
        # What Python's own start sets: SIGINT raises KeyboardInterrupt, SIGPIPE and SIGXFSZ
        # are ignored (a write fails with an error instead).
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        if runner.bwrap:
            _drop_capabilities()
        os.environ.clear()
        os.environ.update(runner.env)
        os.environ.update(msg["env"])
        started = True
        os.close(err_w)
        if msg["kind"] == "pycheck":
            code = check_python(msg["path"])
        else:
            code = run_python(runner.code, msg["path"])
    except BaseException as exc:
        text = f"{type(exc).__name__}: {exc}"
        try:
            if started:  # the program's own failure: its stderr
                os.write(2, text.encode() + b"\n")
            else:  # the sandbox's: reported to the runner
                os.write(err_w, text.encode()[:4000])
        except OSError:
            pass
    os._exit(code)


def default_signals():
    """Every signal's action back to the default, whatever the runner inherited from the
    server's start (``nohup`` ignores SIGHUP) or set itself (SIGINT ignored, SIGCHLD
    handled). glibc keeps 32 and 33 for its threads and refuses them here."""
    for sig in range(1, signal.NSIG):
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            try:  # noqa: SIM105 (no contextlib: see the imports)
                signal.signal(sig, signal.SIG_DFL)
            except (OSError, ValueError):
                pass


def _isolate(runner, msg, fds, cwd, err_w):
    """A session, a user namespace, the job's pipes as 0-2 and nothing else, its work
    directory, its limits, no new privileges."""
    signal.set_wakeup_fd(-1)
    os.setsid()
    if runner.bwrap:
        # Writing our own uid_map needs /proc/self owned by us again.
        prctl(PR_SET_DUMPABLE, 1)
        own_user_namespace(mount_ns=False)
        write_file("/proc/sys/user/max_user_namespaces", "0")
    else:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        os.close(fd)
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2 and int(name) != err_w:
            quietly(os.close, int(name))
    os.chdir(cwd)
    set_limits(msg)
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def set_limits(lim):
    def limit(which, value):
        value = int(value)
        hard = resource.getrlimit(which)[1]
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))

    cpu = max(1, math.ceil(lim["cpu_s"]))  # RLIMIT_CPU's whole seconds, at least one
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
        import traceback  # here only: a syntax error is the rare case

        text = "".join(traceback.format_exception_only(type(exc), exc))
        os.write(2, text.encode("utf-8", "backslashreplace"))
        return 1
    return 0


def run_python(code, path):
    """Run the compiled program as ``python3 path`` would, in this forked process."""
    import atexit

    main = type(sys)("__main__")
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
        try:  # noqa: SIM105 (no contextlib: see the imports)
            sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        except BaseException:
            pass
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
    try:  # noqa: SIM105 (no contextlib: see the imports)
        sys.stderr.write(str(code) + "\n")
    except BaseException:
        pass
    return 1
