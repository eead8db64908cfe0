"""A verifier worker process: :func:`worker_main` runs in a spawned process, one per slot
of a :class:`~reward_server.verifiers.VerifierPool`.

The protocol over its pipe (a ``multiprocessing`` connection, pickled values):

1. the worker builds its verifier and sends ``("ready", None)`` or ``("load_error",
   "one-line reason")`` (then exits);
2. the server sends a chunk, a list of :class:`~reward_server.verifiers.items.Task`; the
   worker verifies them in order, in its main thread, and sends one :data:`Outcome` per item
   *as each finishes*, so that the server times every item on its own;
3. ``None`` (or the pipe closing) stops it.

An exception in the verifier is caught here (the worker lives on) and sent as ``"error"``
with its traceback, for the server's log. A ``math`` item runs under a SIGALRM of
``timeout_s`` seconds (the worker's main thread, where math-verify's own alarms also run,
but those are switched off so that one alarm bounds the whole item): a slow SymPy
simplification is interrupted and reported as ``"timeout"`` without killing the worker.
User functions get no alarm (it could fire inside their own handlers): the server's
deadline kills the worker instead. SIGINT is ignored (Ctrl-C reaches the whole process
group: the server decides when its workers stop), and on Linux the worker asks the kernel
to SIGKILL it when the server's thread that started it ends, so that a killed server
leaves no orphans. Numerical libraries get one thread each (``OMP_NUM_THREADS`` etc.,
unless the server's environment sets them): a worker verifies one item at a time.
"""

from __future__ import annotations

import ctypes
import math
import numbers
import os
import signal
import sys
import traceback
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

from reward_server.errors import one_line
from reward_server.verifiers.items import Failed, Graded, Task
from reward_server.verifiers.options import VerifierOptions

__all__ = ["Outcome", "coerce", "worker_main"]

#: One item's outcome on the wire: (reason or None, score, extras, detail): the detail of a
#: failure is for the log; of a success, the rule's note (why it gave less than full marks).
Outcome = tuple[str | None, float, dict[str, float], str | None]

_PR_SET_PDEATHSIG = 1
#: Thread pools of numerical libraries a user's function may import: one thread each,
#: unless the server's environment says otherwise.
_ONE_THREAD = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class _ItemTimeout(BaseException):
    """Raised by the alarm in the middle of a math item (a BaseException, so that neither
    math-verify's nor SymPy's ``except Exception`` swallows it)."""


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise _ItemTimeout


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - no prctl: daemon flag only
            pass
    if os.getppid() != parent_pid:  # the server died before prctl took effect
        os._exit(0)


def _real(value: Any) -> float | None:
    if not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except (OverflowError, TypeError, ValueError):
        return None


def coerce(value: Any) -> Outcome:
    """A verifier's return value as an outcome: a number, a dict of numbers with "score", or a
    built-in's :class:`~reward_server.verifiers.items.Graded` (or its
    :class:`~reward_server.verifiers.items.Failed`)."""
    if isinstance(value, Failed):
        return (value.reason, 0.0, {}, value.detail)
    if isinstance(value, Graded):
        if not math.isfinite(value.score):
            return ("non_finite", 0.0, {}, f"returned {value.score!r}")
        return (None, float(value.score), {}, value.note)
    if isinstance(value, dict):
        if "score" not in value:
            return (
                "bad_result",
                0.0,
                {},
                f"a dict without 'score' (keys: {sorted(map(str, value))})",
            )
        numbers_: dict[str, float] = {}
        for key, item in value.items():
            number = _real(item)
            if not isinstance(key, str) or number is None:
                return (
                    "bad_result",
                    0.0,
                    {},
                    f"entry {key!r} is {type(item).__name__}, not a number",
                )
            numbers_[key] = number
        score = numbers_.pop("score")
        extras = numbers_
    else:
        number = _real(value)
        if number is None:
            return ("bad_result", 0.0, {}, f"returned {type(value).__name__}, not a number")
        score, extras = number, {}
    if not math.isfinite(score) or not all(math.isfinite(v) for v in extras.values()):
        return ("non_finite", 0.0, {}, f"returned {value!r}")
    return (None, score, extras, None)


def _run_item(check: Any, task: Task, alarm_s: float | None) -> Outcome:
    try:
        try:
            if alarm_s is not None:
                signal.setitimer(signal.ITIMER_REAL, alarm_s)
            try:
                value = check(task)
            finally:
                if alarm_s is not None:
                    signal.setitimer(signal.ITIMER_REAL, 0)
        except _ItemTimeout:
            return ("timeout", 0.0, {}, f"interrupted after {alarm_s} s")
    except (Exception, SystemExit):
        return ("error", 0.0, {}, traceback.format_exc())
    return coerce(value)


def _load(options: VerifierOptions) -> Any:
    from reward_server.verifiers.rules import build

    return build(options)


def worker_main(conn: Connection, options: VerifierOptions, parent_pid: int) -> None:
    """Build the verifier, then verify chunks until told to stop (see the module docstring)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(parent_pid)
    for name in _ONE_THREAD:  # a worker verifies one item at a time: no thread pools
        os.environ.setdefault(name, "1")
    try:
        check = _load(options)
    except BaseException as exc:
        conn.send(("load_error", f"{type(exc).__name__}: {one_line(exc)}"))
        conn.close()
        return
    alarm_s: float | None = None
    if options.verifier == "math":
        signal.signal(signal.SIGALRM, _on_alarm)
        alarm_s = options.timeout_s
    conn.send(("ready", None))
    while True:
        try:
            chunk = conn.recv()
        except (EOFError, OSError):
            return
        if chunk is None:
            return
        for item in chunk:
            try:
                outcome = _run_item(check, item, alarm_s)
            except _ItemTimeout:  # the alarm fired just as the item ended
                outcome = ("timeout", 0.0, {}, f"interrupted after {alarm_s} s")
            conn.send(outcome)
