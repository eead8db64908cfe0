"""A ``python`` grader's ``grade(sample, item)``, run in a warm sandboxed interpreter:
:class:`PythonSandbox`.

One sandbox per worker process of the grader's pool, kept for many items: a bubblewrap
sandbox (every namespace new: no network, no view of the host's files or processes, an
empty environment) holding one Python interpreter that reads a request per line on stdin
(a grader's source to load, or an item to grade) and answers a line of JSON on a descriptor
of its own (the grader's prints go nowhere). The source is compiled once per sandbox; each
item is one call, so a grader that imports numpy pays for it once, not per item.

OpenAI's limits are the defaults: 2 GiB of memory (``RLIMIT_AS``), 1 GiB of disk (the
sandbox's only writable place is a tmpfs of that size; ``RLIMIT_FSIZE`` the same), no
network, a time limit per item (wall clock, checked by the host: past it the sandbox is
killed, its whole PID namespace with it, and a new one starts for the next item), and a
process limit (``RLIMIT_NPROC``, counted for a uid of the sandbox's own when the server is
root). The interpreter is the sandbox's (Python's standard library, ``-I -S``) plus the
server's site-packages mounted read-only at :data:`PACKAGES_INSIDE`, so the packages of
OpenAI's grader image that are installed here import (numpy, scipy, sympy, pandas,
rapidfuzz, rouge-score, nltk, jsonschema, pydantic, pyyaml, ...; the graders guide lists
them).

``sandbox="none"`` runs the same interpreter as a plain subprocess with the same rlimits
(trusted graders only: it sees the host).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import select
import signal
import subprocess
import sysconfig
import time
from dataclasses import dataclass
from typing import Any, Literal

from reward_server.sandbox import SANDBOX_ENV, SANDBOX_UID, find_bwrap
from reward_server.sandbox._host import bwrap_argv, default_python, drop_privileges, reachable
from reward_server.verifiers.graders.errors import GradeFailure

__all__ = ["PACKAGES_INSIDE", "GraderLimits", "PythonSandbox"]

logger = logging.getLogger("reward_server.verifiers")

#: Where the server's site-packages appear inside the sandbox.
PACKAGES_INSIDE = "/opt/grader-packages"
#: Seconds the sandbox has to start and answer that it is ready.
START_TIMEOUT_S = 60.0
#: The longest traceback sent back.
_TRACEBACK_CHARS = 4000
_MB = 1 << 20

#: The interpreter's program: set the limits, then answer requests until stdin closes.
HARNESS = r"""
import json, math, numbers, os, resource, sys, traceback
config = json.loads(sys.argv[1])
reply = os.fdopen(os.dup(1), "w", encoding="utf-8")
null = os.open(os.devnull, os.O_WRONLY)
os.dup2(null, 1)
os.dup2(null, 2)
if config["packages"]:
    sys.path.append(config["packages"])
for name, value in config["rlimits"].items():
    resource.setrlimit(getattr(resource, name), (value, value))
graders = {}


def answer(value):
    reply.write(json.dumps(value) + "\n")
    reply.flush()


answer({"ready": True})
for line in sys.stdin:
    request = json.loads(line)
    try:
        if "source" in request:
            namespace = {"__name__": "grader", "__builtins__": __builtins__}
            exec(compile(request["source"], "grader.py", "exec"), namespace)
            if not callable(namespace.get("grade")):
                raise TypeError("the source defines no function grade(sample, item)")
            graders[request["id"]] = namespace["grade"]
            answer({"loaded": True})
            continue
        value = graders[request["id"]](request["sample"], request["item"])
        if isinstance(value, numbers.Real):
            answer({"value": float(value)})
        else:
            answer({"error": "grade returned %s, not a number" % type(value).__name__})
    except BaseException:
        answer({"error": traceback.format_exc()[-LIMIT:]})
""".replace("LIMIT", str(_TRACEBACK_CHARS))


@dataclass(frozen=True, slots=True)
class GraderLimits:
    """A python grader's limits: OpenAI's by default (2 GiB memory, 1 GiB disk, no network)."""

    timeout_s: float = 10.0
    memory_mb: int = 2048
    disk_mb: int = 1024
    processes: int = 32
    sandbox: Literal["bwrap", "none"] = "bwrap"
    bwrap: str | None = None


def _packages() -> str | None:
    """The server's site-packages (its real path), or None."""
    path = sysconfig.get_paths().get("purelib")
    return os.path.realpath(path) if path and os.path.isdir(path) else None


class PythonSandbox:
    """A warm sandboxed interpreter for python graders (see the module docstring).

    ``start`` makes it (GradeFailure ``python_grader_server_error`` when it cannot),
    ``grade(source, sample, item)`` one item's score (GradeFailure
    ``python_grader_runtime_error`` when ``grade`` raised or gave no finite number,
    ``python_grader_server_error`` when it was cut at its time limit or the sandbox died),
    ``close`` ends it. Not thread-safe: one per worker process.
    """

    def __init__(self, limits: GraderLimits) -> None:
        self.limits = limits
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._loaded: set[str] = set()
        #: Sources by id, loaded again after a restart.
        self._sources: dict[str, str] = {}

    # -- lifecycle ---------------------------------------------------------------------

    def _argv(self) -> tuple[list[str], str | None]:
        """The command that starts the interpreter, and the packages' path inside."""
        limits = self.limits
        packages = _packages()
        rlimits = {
            "RLIMIT_AS": limits.memory_mb * _MB,
            "RLIMIT_FSIZE": limits.disk_mb * _MB,
            "RLIMIT_CORE": 0,
            "RLIMIT_NOFILE": 256,
        }
        if limits.sandbox == "none":
            python = default_python(None)[0] or "python3"
            config = {"packages": packages, "rlimits": rlimits}
            return [python, "-I", "-S", "-c", HARNESS, json.dumps(config)], packages
        bwrap, why = find_bwrap(limits.bwrap)
        if bwrap is None:
            raise GradeFailure("python_grader_server_error", f"no sandbox: {why}")
        # A uid of this worker's own (root's processes are not counted by RLIMIT_NPROC, and
        # another sandbox's processes must not count against this one's).
        uid = SANDBOX_UID + 1 + os.getpid() % 1_000_000 if os.geteuid() == 0 else None
        python, why = default_python(uid)
        if python is None:
            raise GradeFailure("python_grader_server_error", why)
        mounts = []
        if packages is not None and reachable(packages, uid):
            mounts.append((packages, PACKAGES_INSIDE))
        else:
            logger.warning("python graders: %s is not readable in the sandbox", packages)
        rlimits["RLIMIT_NPROC"] = limits.processes
        config = {"packages": PACKAGES_INSIDE if mounts else None, "rlimits": rlimits}
        argv = bwrap_argv(bwrap, binds=[], root_bytes=limits.disk_mb * _MB, files=[], mounts=mounts)
        # bwrap's own init is PID 1 (it reaps what the grader forks); the interpreter is its
        # child, killed with the whole namespace when bwrap dies.
        argv = [arg for arg in argv if arg != "--as-pid-1"]
        prefix = drop_privileges(uid)[0] if uid is not None else []
        return [*prefix, *argv, python, "-I", "-S", "-c", HARNESS, json.dumps(config)], None

    def start(self) -> None:
        """Start the interpreter and wait for it to say it is ready."""
        self.close()
        argv, _ = self._argv()
        env = {**SANDBOX_ENV, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        if self.limits.sandbox == "bwrap":
            argv[argv.index("--clearenv") + 1 : argv.index("--clearenv") + 1] = [
                "--setenv",
                "OMP_NUM_THREADS",
                "1",
                "--setenv",
                "OPENBLAS_NUM_THREADS",
                "1",
            ]
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            raise GradeFailure("python_grader_server_error", f"cannot start: {exc}") from None
        self._buffer = b""
        self._loaded = set()
        answer = self._read(time.monotonic() + START_TIMEOUT_S)
        if answer is None or not answer.get("ready"):
            self.close()
            raise GradeFailure("python_grader_server_error", "the sandbox did not start")

    def close(self) -> None:
        """Kill the interpreter (and its sandbox) if it runs."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
        proc.wait()

    @property
    def pid(self) -> int | None:
        """The host pid of the sandbox's outer process (None when not running)."""
        return self._proc.pid if self._proc is not None else None

    # -- the protocol ------------------------------------------------------------------

    def _send(self, request: dict[str, Any]) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(request, allow_nan=True).encode() + b"\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # dead: the read sees its end

    def _read(self, deadline: float) -> dict[str, Any] | None:
        """The next answer, or None when the interpreter ended or the deadline passed."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            answer = json.loads(line)
        except json.JSONDecodeError:
            return None
        return answer if isinstance(answer, dict) else None

    def _call(self, request: dict[str, Any], timeout_s: float, what: str) -> dict[str, Any]:
        """One request's answer; GradeFailure (and a killed sandbox) when none comes."""
        if self._proc is None:
            self.start()
        self._send(request)
        answer = self._read(time.monotonic() + timeout_s)
        if answer is None:
            alive = self._proc is not None and self._proc.poll() is None
            self.close()
            why = f"cut at its time limit ({timeout_s:g} s)" if alive else "its sandbox died"
            raise GradeFailure("python_grader_server_error", f"{what}: {why}")
        return answer

    def grade(self, source: str, sample: Any, item: Any) -> float:
        """``grade(sample, item)`` of ``source`` for one item (see the class docstring)."""
        key = hashlib.sha256(source.encode()).hexdigest()[:16]
        self._sources.setdefault(key, source)
        if self._proc is None or key not in self._loaded:
            answer = self._call({"id": key, "source": source}, self.limits.timeout_s, "loading")
            if "error" in answer:
                raise GradeFailure("python_grader_runtime_error", str(answer["error"]))
            self._loaded.add(key)
        answer = self._call(
            {"id": key, "sample": sample, "item": item}, self.limits.timeout_s, "grade"
        )
        if "error" in answer:
            raise GradeFailure("python_grader_runtime_error", str(answer["error"]))
        value = answer.get("value")
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise GradeFailure("python_grader_runtime_error", f"grade returned {value!r}")
        return float(value)
