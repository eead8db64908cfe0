"""The sandbox's value objects: limits in, results out, one exception."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

#: How one run of a program ended. ``ok`` means it exited with status 0 in time (whether
#: its output is right is the caller's business); ``sandbox_error`` means the sandbox, not
#: the program, failed (the item's reward cannot be computed).
RunStatus = Literal[
    "ok", "timeout", "runtime_error", "memory_exceeded", "output_exceeded", "sandbox_error"
]

#: How building a program ended (a syntax check for interpreted languages).
CompileStatus = Literal["ok", "compile_error", "timeout", "sandbox_error"]


class SandboxUnavailable(RuntimeError):
    """No sandbox can be made here; the message is one line saying why and what to do."""


@dataclass(frozen=True)
class Limits:
    """What one program may use. Time and output limits are per run (one test); the work
    directory is per item (all runs of one program share the item's sandbox)."""

    run_timeout_s: float = 10.0
    """Wall clock of one run; past it everything the run started is killed."""
    compile_timeout_s: float = 30.0
    """Wall clock (and CPU seconds) of the build."""
    cpu_s: float | None = None
    """CPU seconds of one run (``RLIMIT_CPU``, per process); default ``run_timeout_s``."""
    memory_mb: int = 1024
    """Address space of each process (``RLIMIT_AS``); a language runtime that reserves
    address space it does not use (the JVM) gets a fixed allowance on top."""
    processes: int = 64
    """Processes and threads of one run (``RLIMIT_NPROC``, counted in the run's own user
    namespace, so concurrent runs do not share the count)."""
    file_size_mb: int = 16
    """Largest file a run may write (``RLIMIT_FSIZE``)."""
    open_files: int = 256
    """Open file descriptors of each process (``RLIMIT_NOFILE``)."""
    output_bytes: int = 1 << 20
    """Cap of stdout and of stderr, each. A run whose stdout passes it is stopped
    (``output_exceeded``); stderr past it is dropped and reported as truncated."""
    workdir_mb: int = 64
    """Size of the item's writable work directory (a tmpfs; ``ENOSPC`` past it)."""

    def __post_init__(self) -> None:
        for name in ("run_timeout_s", "compile_timeout_s"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(
                    f"Limits.{name} must be > 0 and finite, got {getattr(self, name)!r}"
                )
        if self.cpu_s is not None and not 0 < self.cpu_s < math.inf:
            raise ValueError(f"Limits.cpu_s must be > 0 and finite, or None, got {self.cpu_s!r}")
        for name in (
            "memory_mb",
            "processes",
            "file_size_mb",
            "open_files",
            "output_bytes",
            "workdir_mb",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Limits.{name} must be a positive integer, got {value!r}")

    @property
    def cpu_limit_s(self) -> float:
        """CPU seconds of one run: ``cpu_s``, else ``run_timeout_s``."""
        return self.cpu_s if self.cpu_s is not None else self.run_timeout_s


@dataclass(frozen=True)
class RunResult:
    """One run of a program on one input."""

    status: RunStatus
    exit_code: int | None
    """The exit status when the program exited, None when a signal ended it."""
    signal: int | None
    """The signal that ended the program, else None."""
    stdout: str
    stderr: str
    stdout_truncated: bool
    stderr_truncated: bool
    elapsed_s: float
    """Wall time of the run inside the sandbox (fork to exit)."""
    cpu_s: float = 0.0
    """CPU time (user + system) of the run's main process and the children it waited for."""
    message: str = ""
    """Why, in a few words, when the status alone does not say it (a sandbox error)."""


@dataclass(frozen=True)
class CompileResult:
    """The build of a program (``python``: a syntax check with ``compile()``; languages with
    nothing to check: ``ok`` at no cost)."""

    ok: bool
    status: CompileStatus
    stdout: str
    stderr: str
    elapsed_s: float
    exit_code: int | None
