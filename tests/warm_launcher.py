"""The warm launcher: the test suite's servers forked from one process that has imported
torch, transformers and the server once, so each server after the first starts in under a
second instead of spending seconds importing the same libraries again (the suite starts over
a hundred). Test machinery, not the product's: a user's server runs the console script.

:func:`spawn` is a :data:`reward_server.launcher.Spawn`: ``server_proc.start_server`` and
``running_server`` pass it to :func:`reward_server.launcher.start_server` (``warm=True``, their
default). It forks the server from this process's warm launcher where the server's
environment differs from the one the launcher started with only in ``REWARD_SERVER_*``
settings and vLLM's variables (:data:`WARM_FREE_ENV`), and runs the console script otherwise.

The launcher's own process is this file run as a script, one per calling process, never by
hand: ``python -P tests/warm_launcher.py FD``, where FD is the calling process's end of a
``SOCK_SEQPACKET`` socket pair, the control channel. Each request on it is one message: a
JSON object (``argv``, ``env``, ``cwd``) with two descriptors, a reply socket and the file
the server's output goes to. The server is forked with the request's environment, directory
and output; the reply socket gets ``{"pid": N}`` at once, then ``{"returncode": R}`` (as
``subprocess.Popen`` reports it) when the server has exited. The process ends when the
control channel closes (its caller is gone).

Why the request's environment must match the one the launcher started with but for
those: libraries read some variables once, at import (OpenMP's
thread count, the hub's offline flag), and those imports happened in the launcher.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import importlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from reward_server.launcher import spawn_process

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------- the caller's side


class WarmProcess:
    """A server forked by the warm launcher: what ``subprocess.Popen`` offers for it.

    The launcher, not this process, is its parent: it sends the return code on ``reply``
    once the server has exited. Where the launcher ends first (killed), the server lives on
    and is watched by its pid; its return code is then unknown: ``LOST_RETURNCODE``.
    """

    #: The return code of a server whose launcher ended before it did.
    LOST_RETURNCODE = 255

    def __init__(self, reply: socket.socket, pid: int, args: list[str]) -> None:
        self.reply: socket.socket | None = reply
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def _collect(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds (None: for ever) for the exit; whether it came."""
        if self.returncode is not None:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.reply is not None:
            ready, _, _ = select.select([self.reply], [], [], timeout)
            if not ready:
                return False
            data = self.reply.recv(4096)
            self.reply.close()
            self.reply = None
            if data:
                self.returncode = int(json.loads(data)["returncode"])
                return True
            logger.warning("warm launcher gone before server %d exited", self.pid)
        while _alive(self.pid):
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        self.returncode = self.LOST_RETURNCODE
        return True

    def poll(self) -> int | None:
        self._collect(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._collect(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs: a zombie (an orphan whose new parent does not reap
    it, as a container's first process may not) counts as ended."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except (OSError, IndexError):  # no /proc here
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


#: The variables a warm server's environment may change (prefixes): the server's settings,
#: the name of the running test that pytest sets anew for every test, and vLLM's (vLLM reads
#: its variables when it uses them, and the launcher never imports it: see _preload).
WARM_FREE_ENV = ("REWARD_SERVER_", "PYTEST_CURRENT_TEST", "VLLM_")


class WarmLauncher:
    """The process that forks warm servers (this file run as a script), for one caller.

    It serves requests whose environment is the one it started with but for the variables
    of ``WARM_FREE_ENV`` (see :meth:`serves`).
    """

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.owner = os.getpid()
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-P", str(Path(__file__).resolve()), str(theirs.fileno())],
                env=env,
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )

    @staticmethod
    def _base(env: dict[str, str]) -> dict[str, str]:
        return {k: v for k, v in env.items() if not k.startswith(WARM_FREE_ENV)}

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a server with ``env`` may be forked here: the libraries imported here read
        some variables at import, so all but those of ``WARM_FREE_ENV`` must be the same."""
        return self._base(env) == self._base(self.env)

    def start(self, argv: list[str], env: dict[str, str], log_fd: int) -> WarmProcess:
        """Fork ``argv`` (the console script's) with ``env``, output to ``log_fd``."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        request = json.dumps({"argv": argv, "env": env, "cwd": os.getcwd()}).encode()
        fds = array.array("i", [theirs.fileno(), log_fd])
        with theirs:  # one SEQPACKET record: sent whole, never interleaved with another's
            self.control.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        # The launcher answers at once, after its imports on the first request.
        ready, _, _ = select.select([mine], [], [], 300)
        data = mine.recv(4096) if ready else b""
        if not data:
            mine.close()
            raise RuntimeError(
                f"the warm launcher did not start {argv[0]} (code {self.proc.poll()})"
            )
        return WarmProcess(mine, int(json.loads(data)["pid"]), argv)

    def close(self) -> None:
        if self.owner != os.getpid():  # a forked copy of the caller: not its launcher
            return
        self.control.close()  # the launcher ends on it
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


#: This process's warm launchers, one per environment this process has had (a variable set
#: since the first started, by a test or a library): each lives until this process ends. A
#: forked copy of this process starts its own.
_WARM: list[WarmLauncher] = []
_WARM_LOCK = threading.Lock()
#: At most this many launchers per process (each holds its own torch and transformers):
#: beyond, servers start cold.
MAX_WARM_LAUNCHERS = 4


def _warm_launcher(env: dict[str, str]) -> WarmLauncher | None:
    """A warm launcher with this process's environment as it is now (started if there is
    none) when it can start a server with ``env``; None where it cannot: ``env`` changes more
    than ``WARM_FREE_ENV``, this process has had too many environments, or this platform
    has no fork."""
    if not hasattr(os, "fork") or not hasattr(socket, "SOCK_SEQPACKET"):
        return None
    base = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with _WARM_LOCK:
        mine = [w for w in _WARM if w.owner == os.getpid() and w.proc.poll() is None]
        launcher = next((w for w in mine if w.serves(base)), None)
        if launcher is None and len(mine) < MAX_WARM_LAUNCHERS:
            launcher = WarmLauncher(base)
            _WARM.append(launcher)
            atexit.register(launcher.close)
        if launcher is not None and launcher.serves(env):
            return launcher
    logger.debug("starting reward-server cold: no warm launcher has its environment")
    return None


def spawn(
    argv: list[str], env: dict[str, str], log_fd: int
) -> WarmProcess | subprocess.Popen[bytes]:
    """Start ``argv`` (the console script's) from a warm launcher where one can take ``env``,
    else (or when the launcher has gone) as the console script."""
    launcher = _warm_launcher(env)
    if launcher is not None:
        try:
            return launcher.start(argv, env, log_fd)
        except (OSError, RuntimeError):  # the launcher has gone: a cold start still works
            logger.warning("warm launcher failed; starting reward-server cold", exc_info=True)
    return spawn_process(argv, env, log_fd)


# --------------------------------------------------------------------- the launcher's process

#: What a server loads while it starts: imported once here (the transformers model modules
#: are what from_pretrained imports on first use, most of a cold start).
PRELOAD = (
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.generation.utils",
    "transformers.masking_utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "transformers.models.bert.modeling_bert",
    "transformers.models.gpt2.modeling_gpt2",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen2.modeling_qwen2",
    "peft",
    "reward_server.cli",
    "reward_server.http.app",
)
#: The largest request: the environment of a process, with room to spare.
MAX_REQUEST_BYTES = 1 << 20


def _preload() -> None:
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional part not installed: the server loads what it has
            logger.debug("warm start: %s not importable", name)
    # WARM_FREE_ENV lets a server change vLLM's variables because vLLM is not imported here.
    if "vllm" in sys.modules:
        raise RuntimeError("the warm launcher's imports brought in vLLM: VLLM_ is not warm-free")


def _send(sock: socket.socket, message: dict[str, int]) -> None:
    with contextlib.suppress(OSError):  # the caller has gone: nobody to tell
        sock.send(json.dumps(message).encode())


def _reap(replies: dict[int, socket.socket]) -> None:
    """Collect every exited server and tell its caller the return code."""
    while replies:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        reply = replies.pop(pid, None)
        if reply is not None:
            # As subprocess.Popen.returncode has it: minus the signal number for a signal.
            _send(reply, {"returncode": os.waitstatus_to_exitcode(status)})
            reply.close()


def _receive(control: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """One request and its descriptors; None when the control channel has closed."""
    fds = array.array("i")
    data, ancillary, _flags, _addr = control.recvmsg(
        MAX_REQUEST_BYTES, socket.CMSG_SPACE(2 * fds.itemsize)
    )
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    if not data:
        return None
    return json.loads(data), list(fds)


def _become_server(
    request: dict[str, Any], log_fd: int, keep_closed: list[socket.socket | int]
) -> list[str]:
    """In the forked child: drop the launcher's state, take the request's output, environment
    and directory, and return the server's argv."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a fresh interpreter
    for item in keep_closed:
        if isinstance(item, socket.socket):
            item.close()
        else:
            os.close(item)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(devnull)
    os.close(log_fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = [str(arg) for arg in request["argv"]]
    # Its name in ps, top and pkill: the console script's (its command line stays this
    # launcher's, which Python cannot change).
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_text(Path(argv[0]).name[:15], encoding="utf-8")
    return argv


def serve(control: socket.socket) -> list[str] | None:
    """Fork a server per request until the control channel closes (then None). Returns, in
    a forked child only, the argv the server is to run with."""
    # A Ctrl-C at a terminal reaches the whole process group: the servers stop on it, and
    # this process stays to tell their callers the return codes (it ends with its caller).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    replies: dict[int, socket.socket] = {}
    while True:
        ready, _, _ = select.select([control, wake_read], [], [])
        if wake_read in ready:
            os.read(wake_read, 4096)
            _reap(replies)
        if control not in ready:
            continue
        received = _receive(control)
        if received is None:
            return None
        request, fds = received
        reply = socket.socket(fileno=fds[0])
        pid = os.fork()
        if pid == 0:
            others: list[socket.socket | int] = [control, reply, wake_read, wake_write]
            return _become_server(request, fds[1], [*others, *replies.values()])
        os.close(fds[1])
        replies[pid] = reply
        _send(reply, {"pid": pid})


def main() -> int:
    control = socket.socket(fileno=int(sys.argv[1]))
    _preload()
    argv = serve(control)
    if argv is None:
        return 0
    # A forked server from here on: what the reward-server console script does.
    from reward_server.cli import run

    sys.argv = argv
    run()


if __name__ == "__main__":
    # As the servers it forks: without the teardown of the torch it preloaded (1 s of CPU).
    from settings_cli.exit import exit_now

    exit_now(main())
