"""From what the runner reported to a verdict: RunResult and CompileResult."""

from __future__ import annotations

import math
import os
import signal
import time
from typing import Any

from reward_server.sandbox._channel import JobOutcome
from reward_server.sandbox._languages import Language
from reward_server.sandbox._types import CompileResult, CompileStatus, Limits, RunResult, RunStatus

_SIGNALS = {int(s) for s in signal.Signals}


def _text(data: bytes | bytearray) -> str:
    return bytes(data).decode("utf-8", "replace")


def decode_status(status: int | None) -> tuple[int | None, int | None]:
    """(exit code, signal) of a wait status (None, None when unknown)."""
    if status is None:
        return None, None
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    return None, None


def _cpu_killed(sig: int | None, report: dict[str, Any], cpu_s: float) -> bool:
    """Ended by its CPU limit: SIGXCPU at the soft limit, SIGKILL at the hard one."""
    if sig == signal.SIGXCPU:
        return True
    limit = max(1, math.ceil(cpu_s))
    return sig == signal.SIGKILL and float(report.get("cpu_s") or 0.0) >= limit - 0.05


def run_result(outcome: JobOutcome, lim: Limits, lang: Language) -> RunResult:
    """The verdict of one run. Precedence: the sandbox's failure, stopped for its output,
    past its deadline or CPU time, out of memory (the language's message on stderr), a
    non-zero exit or a signal, else ``ok``."""
    report = outcome.report
    exit_code, sig = decode_status(report.get("status"))
    status: RunStatus
    message = ""
    if report.get("error"):
        status, message = "sandbox_error", str(report["error"])
    elif outcome.stopped:
        status = "output_exceeded"
        message = f"stdout passed {lim.output_bytes} bytes; the run was stopped"
    elif report.get("timed_out"):
        status, message = "timeout", f"ran past {lim.run_timeout_s:g} s"
    elif _cpu_killed(sig, report, lim.cpu_limit_s):
        status, message = "timeout", f"used {lim.cpu_limit_s:g} CPU seconds"
    elif (exit_code or sig) and any(m in _text(outcome.stderr.tail) for m in lang.memory_markers):
        status, message = "memory_exceeded", f"ran out of its {lim.memory_mb} MB"
    elif exit_code or sig:
        status = "runtime_error"
        if sig:
            message = (
                f"killed by {signal.Signals(sig).name}" if sig in _SIGNALS else f"signal {sig}"
            )
    else:
        status = "ok"
    return RunResult(
        status=status,
        exit_code=exit_code,
        signal=sig,
        stdout=_text(outcome.stdout.head),
        stderr=_text(outcome.stderr.head),
        stdout_truncated=outcome.stdout.truncated,
        stderr_truncated=outcome.stderr.truncated,
        elapsed_s=float(report.get("wall_s") or 0.0),
        cpu_s=float(report.get("cpu_s") or 0.0),
        message=message,
    )


def build_result(outcome: JobOutcome, timeout_s: float, began: float) -> CompileResult:
    """The verdict of a build (or a syntax check)."""
    report = outcome.report
    exit_code, sig = decode_status(report.get("status"))
    stderr = _text(outcome.stderr.head)
    status: CompileStatus
    if report.get("error"):
        status, stderr = "sandbox_error", str(report["error"])
    elif report.get("timed_out") or _cpu_killed(sig, report, timeout_s):
        status = "timeout"
    elif exit_code == 0:
        status = "ok"
    else:
        status = "compile_error"
    return CompileResult(
        ok=status == "ok",
        status=status,
        stdout=_text(outcome.stdout.head),
        stderr=stderr,
        elapsed_s=float(report.get("wall_s", time.monotonic() - began)),
        exit_code=exit_code,
    )


def run_error(message: str) -> RunResult:
    """A run the sandbox could not make."""
    return RunResult("sandbox_error", None, None, "", "", False, False, 0.0, message=message)


def build_error(status: CompileStatus, message: str, began: float) -> CompileResult:
    """A build that did not happen."""
    return CompileResult(False, status, "", message, time.monotonic() - began, None)
