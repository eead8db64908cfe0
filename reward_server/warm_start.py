"""The warm launcher's process: it imports torch, transformers and the server once, then forks
a ``reward-server`` for each request, so each server after the first starts in under a second
instead of spending seconds importing the same libraries again.

Started by :func:`reward_server.launcher.start_server` with ``warm=True`` (one per calling
process), never by hand: ``python -P -m reward_server.warm_start FD``, where FD is the
calling process's end of a ``SOCK_SEQPACKET`` socket pair, the control channel. Each request
on it is one message: a JSON object (``argv``, ``env``, ``cwd``) with two descriptors, a
reply socket and the file the server's output goes to. The server is forked with the
request's environment, directory and output; the reply socket gets ``{"pid": N}`` at once,
then ``{"returncode": R}`` (as ``subprocess.Popen`` reports it) when the server has exited.
The process ends when the control channel closes (its caller is gone).

Why the request's environment must match the one this process started with but for
``REWARD_SERVER_*`` settings (the caller checks it, see ``launcher.WARM_FREE_ENV``): libraries read some variables once, at
import (OpenMP's thread count, the hub's offline flag), and those imports happened here.
"""

from __future__ import annotations

import array
import contextlib
import importlib
import json
import logging
import os
import select
import signal
import socket
import sys
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

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
    from reward_server.cli import main as server_main

    sys.argv = argv
    return server_main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
