"""Start the real ``reward-server`` console script in a subprocess and wait until it serves.

Used by the demo, the benchmarks and the tests; handy in a user's own scripts (a notebook
that wants a server next to it). Imports neither torch nor FastAPI.

``spawn`` is the seam for another way of starting the process than ``subprocess.Popen``
(the test suite forks its servers from a process that has imported torch once:
``tests/warm_launcher.py``).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import httpx

#: The console script installed next to the running interpreter.
REWARD_SERVER = Path(sys.executable).parent / "reward-server"


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT and SIGTERM back while the block runs, then act on them as usual.

    A Ctrl-C that lands inside ``subprocess.Popen`` raises after the child exists but before
    the caller gets its handle back: the child runs on, orphaned, and (if it was forked after
    the signal went to the process group) never saw the signal. So start children inside
    this block and keep the handle in a variable the caller's ``finally`` stops::

        proc = None
        try:
            with deferred_signals():
                proc = subprocess.Popen(cmd)
            proc.wait()
        finally:
            if proc is not None:
                stop(proc)  # it may have missed the signal: send it one

    On leaving, the first signal that came is handled by the handler that was in place
    (KeyboardInterrupt for SIGINT by default). Outside the main thread, a plain block.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = {
        sig: signal.signal(sig, lambda signum, _frame: caught.append(signum))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if caught:
        _handle_now(caught[0], previous[caught[0]])


@contextlib.contextmanager
def held_for_children() -> Iterator[None]:
    """Children started in the block begin with SIGINT and SIGTERM blocked (the signal mask
    survives fork and exec); signals this process gets meanwhile wait until the block ends.

    For a child that unblocks them itself once its handlers are in place, as ``ppo-client
    train`` does: a signal that comes while its interpreter starts (before any of its code
    runs, when Python may swallow the KeyboardInterrupt: an error in ``site`` reading a
    ``.pth`` file is reported and skipped) then stays pending and stops it as soon as it can
    act on it. Never for a child that does not unblock them (a ``reward-server``): it could
    not be stopped but by SIGKILL. Outside the main thread, a plain block.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _handle_now(signum: int, handler: Any) -> None:
    """Act on ``signum`` as ``handler`` (what ``signal.signal`` returned) would have."""
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        signal.raise_signal(signum)  # the default action: the process ends


#: Linux's range of ports for the local end of outgoing connections.
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: The lowest port free_port hands out: above the ports Ray gives its workers (10002-19999).
LOWEST_PORT = 20000
#: free_port's own source of chance, seeded by the system: the process-wide ``random`` is
#: seeded alike in every process that calls ``random.seed(42)`` (``transformers.set_seed``
#: does), and two such processes would then pick the same port.
_PORT_CHOICE = random.SystemRandom()


def _ports_below_ephemeral() -> range:
    """The ports from LOWEST_PORT up to the ephemeral range (none where it is unknown)."""
    try:
        low = int(EPHEMERAL_RANGE.read_text(encoding="ascii").split()[0])
    except (OSError, ValueError, IndexError):
        return range(0)
    return range(LOWEST_PORT, low)


def free_port() -> int:
    """A loopback TCP port that was free a moment ago, below the ephemeral range.

    A port the kernel hands out (``bind`` to port 0) lies in the ephemeral range, where any
    outgoing connection may take it as its local port while no server listens there: a
    client retrying a stopped server can then connect to itself, and the server restarted
    on that port fails with "address already in use". So pick one below the range, and fall
    back to the kernel's choice where there is no such port."""
    candidates = _ports_below_ephemeral()
    for port in _PORT_CHOICE.sample(candidates, min(64, len(candidates))):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # in use
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Process(Protocol):
    """What :class:`ServerProcess` needs of a started server's process (``subprocess.Popen``
    has it)."""

    pid: int

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


#: Starts a server's process: ``(argv, env, log_fd)``, where ``log_fd`` is the open file its
#: stdout and stderr go to.
Spawn = Callable[[list[str], dict[str, str], int], Process]


def spawn_process(argv: list[str], env: dict[str, str], log_fd: int) -> subprocess.Popen[bytes]:
    """Run ``argv`` (the console script's) with ``env``, output to ``log_fd``."""
    return subprocess.Popen(argv, stdout=log_fd, stderr=subprocess.STDOUT, env=env)


class ServerProcess:
    """A started ``reward-server`` subprocess with its URL and captured output.

    ``url`` is ``https://`` when the server was started with a certificate; ``verify`` is
    what the readiness poll checks it with (httpx's ``verify``).
    """

    def __init__(
        self,
        proc: Process,
        port: int,
        log_path: Path,
        *,
        tls: bool = False,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self.proc = proc
        self.port = port
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        self.log_path = log_path
        self.verify = verify

    def log(self) -> str:
        """Everything the server wrote to stdout and stderr so far."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Send ``sig``, wait for the exit (killing after ``timeout``) and return the code."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        return int(self.proc.returncode)

    def wait_ready(self, timeout: float) -> None:
        """Poll ``GET /health`` until it answers 200; raise with the log if it never does."""
        deadline = time.monotonic() + timeout
        # One client for every poll: each new client builds an SSL context (about 25 ms of
        # CPU, even for http://), which polling ten times a second would take from the
        # starting server.
        with httpx.Client(timeout=2, verify=self.verify) as http:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"reward-server exited with code {self.proc.returncode} before it was "
                        f"ready:\n{self.log()}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if http.get(f"{self.url}/health").status_code == 200:
                        return
                time.sleep(0.1)
        raise RuntimeError(f"reward-server not healthy after {timeout}s:\n{self.log()}")


def _serves_tls(args: tuple[str, ...], env: dict[str, str]) -> bool:
    """Whether ``reward-server args`` with ``env`` serves HTTPS (a certificate is given)."""
    flag = any(arg == "--ssl-certfile" or arg.startswith("--ssl-certfile=") for arg in args)
    return flag or bool(env.get("REWARD_SERVER_SSL_CERTFILE"))


def start_server(
    model_path: str | Path | None,
    *args: str,
    env: dict[str, str] | None = None,
    port: int | None = None,
    log_path: str | Path | None = None,
    verify: ssl.SSLContext | bool = True,
    spawn: Spawn = spawn_process,
) -> ServerProcess:
    """Start ``reward-server --model model_path --port P *args`` without waiting for it.

    Output goes to ``log_path`` (a temporary file when not given). ``model_path`` may be
    None when the model comes from ``REWARD_SERVER_MODEL`` in ``env``. A server given
    ``--ssl-certfile`` (or ``REWARD_SERVER_SSL_CERTFILE``) gets an ``https://`` URL, polled
    with ``verify`` (an ``ssl.SSLContext`` trusting its CA, or False). ``spawn`` starts the
    process (by default :func:`spawn_process`: ``subprocess.Popen``).
    """
    port = port or free_port()
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="reward-server-", suffix=".log")
        os.close(fd)
        log_path = name
    log_path = Path(log_path)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    cmd = [str(REWARD_SERVER), "--port", str(port), "--host", "127.0.0.1", *args]
    if model_path is not None:
        cmd[1:1] = ["--model", str(model_path)]
    with log_path.open("wb") as log_file:
        proc = spawn(cmd, full_env, log_file.fileno())
    return ServerProcess(proc, port, log_path, tls=_serves_tls(args, full_env), verify=verify)


@contextlib.contextmanager
def running_server(
    model_path: str | Path | None,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 60,
    log_path: str | Path | None = None,
    verify: ssl.SSLContext | bool = True,
    spawn: Spawn = spawn_process,
) -> Iterator[ServerProcess]:
    """Start the real server on a free loopback port, wait for health, stop it on exit.

    ``args`` are extra CLI flags; ``env`` is added to the inherited environment; ``verify``
    checks an HTTPS server's certificate and ``spawn`` starts the process (see
    :func:`start_server`). A port taken between choosing and binding it is retried with
    another port. A temporary log file is removed at the end; a ``log_path`` given by the
    caller is kept.
    """
    keep_log = log_path is not None
    server: ServerProcess | None = None
    try:
        for attempt in range(3):
            with deferred_signals():
                server = start_server(
                    model_path, *args, env=env, log_path=log_path, verify=verify, spawn=spawn
                )
            try:
                server.wait_ready(timeout)
                break
            except BaseException:
                server.stop(signal.SIGKILL)
                in_use = "address already in use" in server.log().lower()
                if not keep_log:
                    server.log_path.unlink(missing_ok=True)
                if not in_use or attempt == 2:
                    raise
        assert server is not None
        yield server
    finally:
        if server is not None:
            server.stop()
            if not keep_log:
                server.log_path.unlink(missing_ok=True)
