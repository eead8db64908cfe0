"""The server's end of one item's runner: its process, its control socket, its jobs.

The runner (``_serve.c`` for executables, ``_runner.py`` for Python programs) gets
messages on a SOCK_SEQPACKET socket (NUL-separated fields, :func:`encode`), and with each
job the three pipe ends of its stdin, stdout and stderr (SCM_RIGHTS): the program's output
streams straight into the server's capped buffers (:mod:`._streams`), never through the
runner. Its answers are JSON objects (the server never unpickles or unmarshals what a
sandbox sent). Nothing here blocks the event loop; every process started is reaped.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from typing import Any

from reward_server.sandbox._streams import Drain, Feed

logger = logging.getLogger(__name__)

#: Seconds a sandbox and its runner may take to start (a loaded machine is slow to fork).
START_TIMEOUT_S = 30.0
#: Seconds past a job's own deadline after which the runner is deemed stuck and the whole
#: sandbox is killed (the runner kills a job at its deadline; this is the backstop).
BACKSTOP_S = 5.0
#: Seconds to wait for the end of a job's output after it exited (a process that escaped
#: the job's group may hold the pipe until the runner's next scan kills it).
OUTPUT_GRACE_S = 1.0


#: A job's whole-number limits, in the order the runners read them after its CPU time.
_LIMITS = ("as_bytes", "fsize_bytes", "nofile", "stack_bytes", "nproc")


def encode(msg: dict[str, Any]) -> bytes:
    """A message to a runner: its fields separated by NUL bytes (``_launch.h`` says which;
    the runners check each). ``kind`` ``exec`` goes to the native runner, ``python`` and
    ``pycheck`` (``argv``: the program's path) to the Python runner."""
    op = msg["op"]
    head = [op, str(int(msg["id"]))]
    if op != "job":
        return _nul_fields(head)
    lim = msg["limits"]
    env = [f"{key}={value}" for key, value in (msg.get("env") or {}).items()]
    return _nul_fields(
        [
            *head,
            msg["kind"],
            "prog" if msg["cwd"] == "prog" else "test",
            "1" if msg.get("seal") else "0",
            repr(float(lim["timeout_s"])),
            repr(float(lim["cpu_s"])),  # the runner rounds it up to whole seconds
            *(str(int(lim.get(key) or 0)) for key in _LIMITS),
            str(len(env)),
            *env,
            *msg["argv"],
        ]
    )


def _nul_fields(fields: list[str]) -> bytes:
    if any("\0" in field for field in fields):
        raise ValueError("a NUL byte in a field of a message to the sandbox's runner")
    return b"".join(field.encode("utf-8", "surrogateescape") + b"\0" for field in fields)


class RunnerGone(Exception):
    """The runner is gone or stuck: the item's remaining work cannot run."""


@dataclass
class JobOutcome:
    """A job's report from the runner, and what it wrote."""

    report: dict[str, Any]
    stdout: Drain
    stderr: Drain
    stopped: bool
    """Stopped by the server because its stdout passed the cap."""


class Channel:
    """One runner process and the socket to it."""

    def __init__(self) -> None:
        self._sock, self._theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sock.setblocking(False)
        self.proc: asyncio.subprocess.Process | None = None
        self.broken: str | None = None
        """Why no more jobs can run (the runner exited or stopped answering), else None."""
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self._ready: asyncio.Future[dict[str, Any]] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._stderr: asyncio.Task[bytes] | None = None
        self._closed = False

    @property
    def runner_fd(self) -> int:
        """The runner's end of the socket (pass it to the process)."""
        return self._theirs.fileno()

    # -- start and stop ---------------------------------------------------------------
    async def start(self, argv: list[str], pass_fds: list[int], **popen: Any) -> str | None:
        """Start the process; None once the runner said it is ready, else why not."""
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=[self.runner_fd, *pass_fds],
                cwd="/",
                start_new_session=True,
                **popen,
            )
        except OSError as exc:
            return f"cannot start the sandbox: {exc}"
        finally:
            self._theirs.close()
        assert self.proc.stderr is not None
        self._stderr = asyncio.create_task(_read_capped(self.proc.stderr, 64 * 1024))
        self._reader = asyncio.create_task(self._read_messages())
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), START_TIMEOUT_S)
        except asyncio.TimeoutError:
            return f"the sandbox did not start within {START_TIMEOUT_S:.0f} s"
        except RunnerGone as exc:
            return await self._why_gone(str(exc))
        return None

    async def _why_gone(self, what: str) -> str:
        """The sandbox's own words when it ended early (bwrap's or the runner's stderr)."""
        text = ""
        if self.proc is not None and self._stderr is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 5.0)
                raw = await asyncio.wait_for(asyncio.shield(self._stderr), 2.0)
                text = raw.decode("utf-8", "replace").strip()
        detail = " | ".join(line for line in text.splitlines()[-5:] if line.strip())
        return f"{what}{': ' + detail if detail else ''}"

    async def close(self) -> None:
        """Close the socket (the runner kills everything and exits), then make sure the
        process is gone (SIGKILL to its group: bwrap's child dies with it)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        proc = self.proc
        if proc is not None:
            try:
                await asyncio.wait_for(asyncio.shield(proc.wait()), 2.0)
            except asyncio.TimeoutError:
                kill_group(proc.pid)
            finally:
                if proc.returncode is None:
                    kill_group(proc.pid)
                    await proc.wait()
        for task in (self._reader, self._stderr):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._sock.close()
        self._theirs.close()
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(RunnerGone("the session was closed"))

    async def _read_messages(self) -> None:
        """Dispatch the runner's messages to the waiting jobs; at EOF fail them all."""
        loop = asyncio.get_running_loop()
        assert self._ready is not None
        reason = "the sandbox's runner exited"
        try:
            while True:
                data = await loop.sock_recv(self._sock, 1 << 16)
                if not data:
                    break
                msg = json.loads(data)
                op = msg.get("op")
                if op == "ready" and not self._ready.done():
                    self._ready.set_result(msg)
                elif op == "fatal":
                    reason = f"the sandbox's runner failed to start: {msg.get('error')}"
                elif op == "done":
                    fut = self._pending.get(msg.get("id"))
                    if fut is not None and not fut.done():
                        fut.set_result(msg)
        except (OSError, ValueError) as exc:
            reason = f"lost the sandbox's runner: {exc}"
        self.broken = reason
        if not self._ready.done():
            self._ready.set_exception(RunnerGone(reason))
            self._ready.exception()  # retrieved: a start that timed out never reads it
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(RunnerGone(reason))

    # -- messages and jobs ------------------------------------------------------------
    async def _send(self, msg: dict[str, Any], fds: list[int]) -> None:
        data = encode(msg)
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + BACKSTOP_S
        while True:
            try:
                self._sock.sendmsg([data], ancillary)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RunnerGone("the sandbox's runner stopped reading") from None
                writable = loop.create_future()
                loop.add_writer(self._sock.fileno(), writable.set_result, None)
                try:
                    await asyncio.wait_for(writable, BACKSTOP_S)
                except asyncio.TimeoutError:
                    pass
                finally:
                    loop.remove_writer(self._sock.fileno())
            except OSError as exc:
                raise RunnerGone(f"lost the sandbox's runner: {exc}") from None

    def _send_nowait(self, msg: dict[str, Any]) -> None:
        """Best effort, for a kill on the way out of a cancelled job."""
        if not self._closed:
            with contextlib.suppress(OSError):
                self._sock.send(encode(msg))

    async def control(self, msg: dict[str, Any]) -> dict[str, Any]:
        """A message without pipes, and the runner's answer."""
        job_id = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[job_id] = fut
        try:
            await self._send({**msg, "id": job_id}, [])
            return await asyncio.wait_for(fut, BACKSTOP_S * 2)
        except asyncio.TimeoutError:
            raise RunnerGone("the sandbox's runner did not answer") from None
        finally:
            self._pending.pop(job_id, None)

    async def job(
        self, msg: dict[str, Any], timeout_s: float, stdin: bytes, cap: int, stop_on_output: bool
    ) -> JobOutcome:
        """Run one job: feed ``stdin``, drain stdout and stderr (``cap`` bytes kept each;
        with ``stop_on_output`` the job is killed once stdout passes it), wait for the
        runner's report. Cancelled, it kills the job on the way out."""
        loop = asyncio.get_running_loop()
        job_id = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        self._pending[job_id] = fut
        stopped = False
        pipes = [os.pipe2(os.O_CLOEXEC) for _ in range(3)]
        # The runner gets stdin's read end and the write ends of stdout and stderr.
        theirs = [pipes[0][0], pipes[1][1], pipes[2][1]]
        ours = [pipes[0][1], pipes[1][0], pipes[2][0]]
        streams: list[Feed | Drain] = []

        def over_cap() -> None:
            nonlocal stopped
            stopped = True
            self._send_nowait({"op": "kill", "id": job_id})

        try:
            await self._send({**msg, "op": "job", "id": job_id}, theirs)
            for fd in theirs:
                os.close(fd)
            theirs = []
            feed = Feed(ours[0], stdin)
            out = Drain(ours[1], cap, over_cap if stop_on_output else None)
            err = Drain(ours[2], cap)
            streams, ours = [feed, out, err], []
            try:
                report = await asyncio.wait_for(asyncio.shield(fut), timeout_s + BACKSTOP_S)
            except asyncio.TimeoutError:
                report = self._stuck(timeout_s)
            if not (out.done.done() and err.done.done()):
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.gather(out.done, err.done), OUTPUT_GRACE_S)
            return JobOutcome(report, out, err, stopped)
        finally:
            self._pending.pop(job_id, None)
            if not fut.done():
                fut.cancel()
                self._send_nowait({"op": "kill", "id": job_id})
            for fd in (*theirs, *ours):
                os.close(fd)
            for stream in streams:
                stream.close()

    def _stuck(self, timeout_s: float) -> dict[str, Any]:
        """The runner missed a job's deadline by far: kill the sandbox; the job timed out."""
        self.broken = "the sandbox's runner stopped answering"
        logger.warning("sandbox runner stuck past a job's deadline; killing its sandbox")
        if self.proc is not None:
            kill_group(self.proc.pid)
        return {"status": None, "timed_out": True, "error": None, "wall_s": timeout_s}


def kill_group(pid: int) -> None:
    """SIGKILL to a process and its process group."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            kill(pid, signal.SIGKILL)


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> bytes:
    """Read a stream to its end, keeping its last ``cap`` bytes."""
    kept = bytearray()
    while True:
        chunk = await stream.read(1 << 16)
        if not chunk:
            return bytes(kept)
        kept += chunk
        del kept[:-cap]
