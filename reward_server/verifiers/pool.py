"""The process pool that runs a verifier: :class:`VerifierPool`.

Shape: ``workers`` slots, each one worker process (started with multiprocessing's
``spawn`` context: the server holds torch's threads and must never be forked) and one
daemon thread that drives it. ``verify`` cuts its tasks into chunks, puts them in the
server's one fair queue (:class:`~reward_server.scheduling.fair_queue.FairQueue`, under the
request's tenant, each chunk costing its items), from which each slot's thread takes its
next chunk, and awaits one ``concurrent.futures.Future`` per chunk through
``asyncio.wrap_future``: the event loop never blocks, and a pool serves any event loop (or
several in turn). The workers are the seats: a tenant flooding the verifier gets the
workers only as the queue's order gives them (a light tenant's call goes first, backlogged
tenants take turns by weight), never ahead of everyone behind it.

A slot's thread sends a chunk down the worker's pipe and reads the outcomes one by one as
the worker sends them, each with its own deadline of ``timeout_s`` from the previous
outcome (from the send for the first): chunking saves messages (throughput)
without stretching any item's time. ``math`` items get ``MATH_GRACE_S`` on top, because
the worker's own alarm stops them at ``timeout_s`` and reports ``timeout`` itself. When a
deadline passes the worker is killed (SIGTERM, then SIGKILL if it is still there after
``STOP_WAIT_S``), reaped, and a new one started; a worker that dies (crash) is replaced the
same way; the rest of the chunk goes to the new worker. The replacement is started before
the chunk's verdicts are handed back, so when ``verify`` returns the pool is whole again.
A worker that dies while its slot waits for work (killed between calls, out of memory) is
replaced within ``IDLE_CHECK_S``, not when a chunk next comes to that slot: the workers
gauge reads true between calls and the next call does not wait for a start.

A function that hangs must not hold a call for items x timeout: once one call has seen
``BREAKER_TIMEOUTS`` timeouts and they are more than half of its items settled so far, the
call's items not sent to a worker yet are not tried (their reason ``timeout``, one warning
line for the call). The breaker is per call: the next call tries every item again, so a
function that hung on one batch is not shut off for the rest of the run, and a call where
a few items time out among many good ones never trips it.

A request's deadline (``verify(..., deadline=)``) bounds the whole call: no item starts
after it; at the deadline a worker still on one of the call's items is killed like one that
timed out, and that item and the rest of its chunk get the reason ``deadline``, as do chunks
no worker took yet. Items settled before keep their verdicts. There the verdicts go back
before the replacement workers start (they start right after, ahead of the next call), so
the answer is not held up by process start-up.

Cancelling ``verify`` (the client went away) takes its chunks still queued out of the
queue; chunks already running finish on their workers and their verdicts are dropped, so the
pool stays consistent and usable. ``close`` fails queued chunks with NotRunningError, kills busy
workers, stops idle ones, and joins every thread and process.
"""

from __future__ import annotations

import asyncio
import logging
import math
import multiprocessing
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Literal

from reward_server.config.tenants import current_tenant
from reward_server.errors import ModelLoadError, NotRunningError
from reward_server.scheduling.fair_queue import FairQueue
from reward_server.verifiers.call import Call
from reward_server.verifiers.deadline import past, remaining
from reward_server.verifiers.items import REASONS, Task, Verdict
from reward_server.verifiers.options import VerifierOptions, check_options
from reward_server.verifiers.worker import Outcome, worker_main

__all__ = ["VerifierPool", "outcome_verdict"]

logger = logging.getLogger("reward_server.verifiers")

_CONTEXT = multiprocessing.get_context("spawn")

#: Seconds a worker may take to start and build its verifier (imports included).
LOAD_TIMEOUT_S = 120.0
#: Extra seconds the server waits for a math item beyond timeout_s (see the docstring).
MATH_GRACE_S = 0.5
#: Seconds between SIGTERM and SIGKILL for a worker that must stop.
STOP_WAIT_S = 0.2
#: How often an idle slot checks that its worker is still there (seconds).
IDLE_CHECK_S = 0.5
#: Seconds an idle worker has to exit on its own when the pool closes.
EXIT_WAIT_S = 1.0
#: Chunking: about this many chunks per worker for one call, at most MAX_CHUNK items each.
CHUNKS_PER_WORKER = 4
MAX_CHUNK = 32
#: The fair queue's turn and a light tenant's first helping, in items per unit of weight.
QUANTUM_ITEMS = 4
BURST_ITEMS = 64
#: The longest reason a failed item's log line carries.
_LOG_CHARS = 300
#: Seconds to wait for another thread to record the exit code of a worker it collected.
REAP_WAIT_S = 1.0

#: Positions and tasks of one chunk, and the verdicts coming back (by position).
_Items = list[tuple[int, Task]]
_Verdicts = list[tuple[int, Verdict]]


class _Job:
    """One chunk of one ``verify`` call and the future its verdicts go to."""

    __slots__ = ("call", "future", "items")

    def __init__(self, items: _Items, call: Call) -> None:
        self.items = items
        self.call = call
        self.future: Future[_Verdicts] = Future()


def chunk_size(items: int, workers: int) -> int:
    """Items per chunk for a call of ``items``: about CHUNKS_PER_WORKER chunks per worker."""
    return max(1, min(MAX_CHUNK, math.ceil(items / (workers * CHUNKS_PER_WORKER))))


class VerifierPool:
    """``workers`` processes running one verifier, with a per-item timeout.

    ``__init__`` checks the options (ValueError with a one-line reason), ``start`` spawns the
    workers and raises ModelLoadError when the verifier does not load (a python verifier's
    import error), ``verify`` scores tasks in order and never raises for a failing item,
    ``close`` stops everything (idempotent).
    """

    def __init__(
        self, options: VerifierOptions, name: str, *, idle_check_s: float | None = IDLE_CHECK_S
    ) -> None:
        """``idle_check_s``: how often an idle slot looks for its worker's death (None: it
        replaces a dead worker only when it next takes a chunk)."""
        self.options = check_options(options)
        self.name = name
        self.idle_check_s = idle_check_s
        self._jobs: FairQueue[_Job] = FairQueue(
            QUANTUM_ITEMS, burst=BURST_ITEMS, closed_message=f"verifier {name!r} is closed"
        )
        self._slots = [_Slot(self, i) for i in range(self.options.workers)]
        self._lock = threading.Lock()
        self._busy = 0
        self._started = False
        self._closed = False
        grace = MATH_GRACE_S if self.options.verifier == "math" else 0.0
        self.deadline_s = self.options.timeout_s + grace

    def __repr__(self) -> str:
        return (
            f"VerifierPool({self.name!r}, {self.options.verifier}, workers={self.options.workers})"
        )

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the workers and wait until each has built its verifier."""
        with self._lock:
            if self._closed:
                raise NotRunningError(f"verifier {self.name!r} is closed")
            if self._started:
                return
            self._started = True
        for slot in self._slots:
            slot.thread.start()
        reasons = [slot.ready.result() for slot in self._slots]
        failed = [reason for reason in reasons if reason is not None]
        if failed:
            self.close()
            raise ModelLoadError(f"cannot load verifier {self.name!r}: {failed[0]}")
        logger.debug(
            "verifier %r (%s) started %d worker(s), timeout %.3g s",
            self.name,
            self.options.verifier,
            len(self._slots),
            self.options.timeout_s,
        )

    def close(self) -> None:
        """Stop every worker and wait for them (queued chunks fail with NotRunningError)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
        for job in self._jobs.close():  # the slots' threads see the queue closed and stop
            if job.future.set_running_or_notify_cancel():
                job.future.set_exception(self._closed_error())
        if not started:
            return
        for slot in self._slots:
            slot.interrupt()
        for slot in self._slots:
            slot.thread.join(timeout=LOAD_TIMEOUT_S)
            if slot.thread.is_alive():  # pragma: no cover - a worker stuck in the kernel
                logger.warning("verifier %r: %s did not stop", self.name, slot.thread.name)

    @property
    def closed(self) -> bool:
        return self._closed

    def _closed_error(self) -> NotRunningError:
        return NotRunningError(f"verifier {self.name!r} is closed")

    # -- gauges --------------------------------------------------------------------------

    @property
    def live_workers(self) -> int:
        """Worker processes alive now."""
        return sum(slot.alive() for slot in self._slots)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the live workers."""
        return [pid for slot in self._slots if (pid := slot.pid()) is not None]

    @property
    def busy(self) -> int:
        """Items being verified now (sent to a worker, outcome not back yet)."""
        return self._busy

    @property
    def queued(self) -> int:
        """Items waiting for a worker (in chunks no worker has taken yet)."""
        return round(self._jobs.queued)

    def _count_busy(self, delta: int) -> None:
        with self._lock:
            self._busy += delta

    # -- verification --------------------------------------------------------------------

    async def verify(self, tasks: Sequence[Task], deadline: float | None = None) -> list[Verdict]:
        """Each task's verdict, in order, verified concurrently over the workers; with a
        ``deadline`` (``time.monotonic()``), the items unsettled at it get ``deadline``."""
        if not tasks:
            return []
        if not self._started or self._closed:
            raise NotRunningError(
                f"verifier {self.name!r} is {'closed' if self._closed else 'not started'}"
            )
        if past(deadline):
            return [self._deadline_verdict() for _ in tasks]
        size = chunk_size(len(tasks), len(self._slots))
        indexed = list(enumerate(tasks))
        call = Call(self.name, deadline)
        jobs = [_Job(indexed[i : i + size], call) for i in range(0, len(indexed), size)]
        entries = self._jobs.put(current_tenant.get(), [(job, len(job.items)) for job in jobs])
        waiting = [asyncio.wrap_future(job.future) for job in jobs]
        for future in waiting:  # the first failure is raised; the others need no log line
            future.add_done_callback(_seen)
        results: list[_Verdicts] = []
        try:
            await asyncio.wait(waiting, timeout=remaining(deadline))
            for job, future in zip(jobs, waiting, strict=True):
                if not future.done() and job.future.cancel():  # no worker took it: none will
                    results.append([(i, self._deadline_verdict()) for i, _ in job.items])
                else:  # a running chunk ends at the deadline on its slot's thread
                    results.append(await future)
        finally:
            for job, entry in zip(jobs, entries, strict=True):
                if job.future.cancel():  # cancelled: queued chunks leave the queue
                    self._jobs.discard(entry)  # (running ones finish, their verdicts dropped)
        verdicts: list[Verdict | None] = [None] * len(tasks)
        for result in results:
            for position, verdict in result:
                verdicts[position] = verdict
        assert all(v is not None for v in verdicts)
        return verdicts  # type: ignore[return-value]

    def _verdict(self, position: int, outcome: Outcome) -> Verdict:
        return outcome_verdict(self.name, position, outcome, self.options.on_error)

    def _deadline_verdict(self) -> Verdict:
        return Verdict(self.options.on_error, {}, "deadline")


def _seen(future: asyncio.Future[_Verdicts]) -> None:
    """Mark a chunk's failure as read (asyncio logs one nobody read when it is collected)."""
    if not future.cancelled():
        future.exception()


def outcome_verdict(name: str, position: int, outcome: Outcome, on_error: float) -> Verdict:
    """The verdict of one item's outcome; a failure is logged (one line, a traceback at
    DEBUG) and scores ``on_error``."""
    reason, score, extras, detail = outcome
    if reason is None:  # the detail of a success is the rule's note (why not full marks)
        return Verdict(score=score, extras=extras, error=None, note=detail)
    text = (detail or "").strip()
    last = text.splitlines()[-1] if text else ""
    last = last if len(last) <= _LOG_CHARS else last[: _LOG_CHARS - 3] + "..."
    logger.warning(
        "verifier %r: item %d: %s%s", name, position, reason, f": {last}" if last else ""
    )
    if reason == "error" and text:
        logger.debug("verifier %r: item %d raised:\n%s", name, position, text)
    # A built-in's own failure (a grader's flag) keeps its last line: the graders API
    # answers with it (python_grader_runtime_error_details).
    own = last if reason not in REASONS else None
    return Verdict(score=on_error, extras={}, error=reason, note=own or None)


def _exited(process: BaseProcess) -> bool:
    """Whether the worker has ended, by its sentinel, not is_alive(): a killed process closes
    its end of the sentinel pipe before the kernel lets waitpid see it, so in that window
    is_alive() still says True and a chunk would go to a dead worker (its first item then
    failing as a crash it never had)."""
    return bool(wait([process.sentinel], 0))


class _Slot:
    """One worker process and the thread that drives it.

    Only the slot's thread starts, reads, reaps and replaces its worker; other threads
    only signal it (``interrupt``) or read its state, under the slot's lock.
    """

    def __init__(self, pool: VerifierPool, index: int) -> None:
        self.pool = pool
        self.ready: Future[str | None] = Future()
        self.thread = threading.Thread(
            target=self._run, name=f"verifier-{pool.name}-{index}", daemon=True
        )
        self._index = index
        self._lock = threading.Lock()
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None
        self._idle = False  # waiting for a chunk (its worker then has nothing to lose)

    def alive(self) -> bool:
        return self.pid() is not None

    def pid(self) -> int | None:
        """The worker's process id while it runs (its sentinel is still open: no reaping
        here, only the slot's thread waits for its worker)."""
        with self._lock:
            process = self._process
            if process is None or _exited(process):
                return None
            return process.pid

    def interrupt(self) -> None:
        """Kill the worker unless it waits for a chunk (the pool is closing: an idle worker
        is asked to exit instead)."""
        with self._lock:
            if not self._idle and self._process is not None:
                self._process.kill()

    # -- the slot's thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            reason = self._spawn()
            self.ready.set_result(reason)
            if reason is None:
                self._serve()
        except BaseException as exc:  # pragma: no cover - a bug: never leave start() waiting
            logger.exception("verifier %r: slot %d failed", self.pool.name, self._index)
            if not self.ready.done():
                self.ready.set_result(f"the worker thread failed: {exc!r}")
        finally:
            self._stop_worker(graceful=True)

    def _serve(self) -> None:
        while True:
            with self._lock:
                self._idle = True
            job = self._next_job()
            with self._lock:
                self._idle = False
            if job is None:
                return
            if not job.future.set_running_or_notify_cancel():
                continue
            try:
                job.future.set_result(self._run_job(job))
            except BaseException as exc:
                job.future.set_exception(exc)
            if not self.pool.closed:  # a worker killed at a deadline: replaced now
                self._ensure_worker()

    def _next_job(self) -> _Job | None:
        """The next chunk in the fair queue's order (None: the pool is closing). While none
        comes, a worker that died idle is replaced (once: a start that fails is retried by
        the next chunk, not in a loop)."""
        jobs = self.pool._jobs
        while True:
            job = jobs.take(self.pool.idle_check_s)
            if job is not None or jobs.closed:
                return job
            with self._lock:
                process = self._process
            if process is not None and _exited(process) and not self.pool.closed:
                self._ensure_worker()

    def _run_job(self, job: _Job) -> _Verdicts:
        verdicts: _Verdicts = []
        pending = job.items
        self.pool._count_busy(len(pending))
        resend = True  # one chunk the worker never received may go to a new one uncharged
        try:
            while pending:
                if self.pool.closed:
                    raise self.pool._closed_error()
                if past(job.call.deadline):  # the request's time is up: nothing more starts
                    verdicts.extend((i, self.pool._deadline_verdict()) for i, _ in pending)
                    break
                if job.call.open():  # the function hangs on most of this call's items
                    untried = Verdict(self.pool.options.on_error, {}, "timeout")
                    verdicts.extend((position, untried) for position, _ in pending)
                    break
                if not self._ensure_worker():
                    if self.pool.closed:
                        raise self.pool._closed_error()
                    for position, _ in pending:
                        outcome: Outcome = ("crash", 0.0, {}, "no worker: it cannot be restarted")
                        verdicts.append((position, self.pool._verdict(position, outcome)))
                    break
                before = len(verdicts)
                settled = self._exchange(pending, verdicts, resend, job.call.deadline)
                for _, verdict in verdicts[before:]:
                    job.call.record(verdict)
                resend = resend and settled > 0
                pending = pending[settled:]
            if not self.pool.closed and not past(job.call.deadline):
                self._ensure_worker()  # a replacement before the verdicts go back
        finally:
            self.pool._count_busy(-len(pending))
        return verdicts

    def _exchange(
        self, items: _Items, verdicts: _Verdicts, resend: bool, deadline: float | None
    ) -> int:
        """Send ``items`` to the worker and collect their outcomes; returns how many items
        were settled (all, or up to and including the one whose worker had to go).

        When the send itself fails the worker died before it got the chunk: with ``resend``
        nothing is settled (the chunk goes to its replacement), otherwise the first item
        fails, so a worker that keeps dying cannot hold a chunk forever."""
        process, conn = self._process, self._conn
        assert process is not None and conn is not None
        outcome: Outcome
        try:
            conn.send([task for _, task in items])
        except OSError:
            if resend:
                self._stop_worker(graceful=False)
                return 0
            outcome = self._lost_item("crash")
            verdicts.append((items[0][0], self.pool._verdict(items[0][0], outcome)))
            self.pool._count_busy(-1)
            return 1
        except Exception as exc:  # the chunk does not pickle: an item no worker can take
            for position, _ in items:
                outcome = ("error", 0.0, {}, f"cannot send the item: {exc!r}")
                verdicts.append((position, self.pool._verdict(position, outcome)))
            self.pool._count_busy(-len(items))
            return len(items)
        for done, (position, _) in enumerate(items):
            own = time.monotonic() + self.pool.deadline_s
            received = self._receive(process, conn, own if deadline is None else min(own, deadline))
            if received == "timeout" and past(deadline) and time.monotonic() < own:
                # The request's deadline, not the item's timeout: the worker goes the same
                # way, the item (and the rest of the chunk, in _run_job) is a deadline.
                self._stop_worker(graceful=False)
                verdicts.append((position, self.pool._deadline_verdict()))
                self.pool._count_busy(-1)
                return done + 1
            outcome = self._lost_item(received) if isinstance(received, str) else received
            verdicts.append((position, self.pool._verdict(position, outcome)))
            self.pool._count_busy(-1)
            if isinstance(received, str):  # the worker is gone: the rest go to a new one
                return done + 1
        return len(items)

    def _lost_item(self, why: Literal["timeout", "crash"]) -> Outcome:
        """Stop (kill if needed) and reap the worker that kept or lost an item: its outcome."""
        exitcode = self._stop_worker(graceful=False)
        if why == "timeout":
            detail = f"no outcome within {self.pool.deadline_s:.3g} s: worker {self._index} killed"
            return ("timeout", 0.0, {}, detail)
        return ("crash", 0.0, {}, f"worker {self._index} died (exit code {exitcode})")

    @staticmethod
    def _receive(
        process: BaseProcess, conn: Connection, deadline: float
    ) -> Outcome | Literal["timeout", "crash"]:
        """The worker's next outcome, or why none came: the deadline passed, or it died."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            ready = wait([conn, process.sentinel], remaining)
            if conn in ready or (ready and conn.poll()):
                try:
                    outcome: Outcome = conn.recv()
                except (EOFError, OSError):
                    return "crash"
                return outcome
            if ready:
                return "crash"

    def _ensure_worker(self) -> bool:
        """True when a live worker is there, starting one if needed."""
        with self._lock:
            process = self._process
        if process is not None:
            if not _exited(process):
                return True
            exitcode = self._stop_worker(graceful=False)
            logger.warning(
                "verifier %r: worker %d exited (code %s); starting a new one",
                self.pool.name,
                self._index,
                exitcode,
            )
        reason = self._spawn()
        if reason is not None and not self.pool.closed:
            logger.error(
                "verifier %r: cannot restart worker %d: %s", self.pool.name, self._index, reason
            )
        return reason is None

    def _spawn(self) -> str | None:
        """Start a worker and wait until it is ready: None, or why it is not."""
        with self._lock:
            if self.pool.closed:
                return "the pool is closed"
            conn, child = _CONTEXT.Pipe(duplex=True)
            process = _CONTEXT.Process(
                target=worker_main,
                args=(child, self.pool.options, os.getpid()),
                name=f"verifier-{self.pool.name}-{self._index}",
                daemon=True,
            )
            process.start()
            child.close()
            self._process, self._conn = process, conn
        reason = self._await_ready(process, conn)
        if reason is not None:
            self._stop_worker(graceful=False)
        return reason

    @staticmethod
    def _await_ready(process: BaseProcess, conn: Connection) -> str | None:
        ready = wait([conn, process.sentinel], LOAD_TIMEOUT_S)
        if conn in ready or (ready and conn.poll()):
            try:
                kind, reason = conn.recv()
            except (EOFError, OSError):
                kind, reason = "died", None
            if kind == "ready":
                return None
            if kind == "load_error":
                return str(reason)
        if ready:
            return "its worker process exited while loading"
        return f"its worker did not load within {LOAD_TIMEOUT_S:.0f} s"

    def _stop_worker(self, graceful: bool) -> int | None:
        """Stop (``graceful``: ask it to exit first; else SIGTERM, then SIGKILL), reap and
        forget the worker; its exit code (None when there was none)."""
        with self._lock:
            process, conn = self._process, self._conn
            self._process = self._conn = None
        if process is None or conn is None:
            return None
        if graceful and process.is_alive():
            try:
                conn.send(None)
                process.join(EXIT_WAIT_S)
            except OSError:
                pass
        if process.is_alive():
            process.terminate()
            process.join(STOP_WAIT_S)
        if process.is_alive():
            process.kill()
        conn.close()
        return _reap(process)


def _reap(process: BaseProcess) -> int | None:
    """Wait for a stopped worker and release it: its exit code (None: not known).

    Every Process.start() in the interpreter collects all of multiprocessing's exited
    children, so another thread may collect this one first; join() then returns before that
    thread records the exit code, and close() would raise ValueError. So wait a moment for
    the record; if none comes (a waitpid(-1) elsewhere), leave it to the garbage collector.
    """
    process.join()
    give_up = time.monotonic() + REAP_WAIT_S
    while process.exitcode is None and time.monotonic() < give_up:
        time.sleep(0.001)
    exitcode = process.exitcode
    if exitcode is not None:
        process.close()
    return exitcode
