"""The code verifier: :class:`CodeVerifier` runs each item's program against its tests in a
sandbox (:mod:`reward_server.sandbox`), with the interface of the process pool the other
verifiers use (``start``, ``verify``, ``busy``, ``live_workers``, ``close``).

No worker processes of its own: the items of a call are verified concurrently, each in one
sandbox session (the program written and compiled once), its tests run in parallel, on an
event loop of the verifier's own in a thread of its own. That loop is the standard library's
(a server's loop may be uvloop's, whose subprocesses cannot take a user to run as), and the
sandboxes' pipes (a program's output drained as it comes) stay off the loop that answers
requests and ``/health``. ``workers`` sandbox slots, shared by every item, call and
``/run_code`` run, bound how many programs (builds and test runs) run at once (by default the
machine's cores, never more), and ``workers * SESSIONS_PER_WORKER`` sessions how many items
have a sandbox at once. Both are :class:`~reward_server.scheduling.seats.Seats` of the
server's one fair queue. The sessions are where tenants meet: an item waits for one under its
request's tenant (the caller's context travels with the work onto the verifier's loop), so a
tenant flooding the verifier does not hold the others behind its backlog. The slots serve the
items that have a session in the order their programs ask (one flow, no tenants): were they
fair too, a light tenant's tests would overtake the flooding tenant's items that hold the
sessions it waits for, and it would wait longer for each session (measured: its latency 2.2x
its latency alone, against 1.2x in order; ``python -m bench.tenants --kind code``). A test
takes a slot, then checks the item's time
budget (``timeout_s``: the run time of its compilation and tests so far) and, with
``stop_on_failure``, whether a test of the item already failed; otherwise it runs.

An item's outcome: one verdict per test (:data:`~reward_server.verifiers.code.TEST_VERDICTS`),
its score (the pass rate, or all-pass) and the extras ``passed`` and ``total``. An item
without usable tests in its label, or whose sandbox failed, scores ``on_error`` with the
reason ``error`` or ``sandbox_error`` (both logged), as any verifier's failing item.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from concurrent.futures import Future
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from reward_server.config.tenants import Tenant, current_tenant
from reward_server.errors import ModelLoadError, NotRunningError
from reward_server.sandbox import (
    LANGUAGES,
    CompileResult,
    Limits,
    RunResult,
    Sandbox,
    SandboxUnavailable,
    Session,
    language,
)
from reward_server.scheduling.seats import Seats
from reward_server.verifiers.code import harness
from reward_server.verifiers.code.compare import outputs_match, values_match
from reward_server.verifiers.code.options import CodeOptions, TestVerdict
from reward_server.verifiers.code.program import Program, extract_program
from reward_server.verifiers.code.suite import Case, Suite, parse_suite
from reward_server.verifiers.deadline import settle_by
from reward_server.verifiers.items import Task, Verdict

__all__ = ["CodeVerifier", "canonical_languages", "judge"]

logger = logging.getLogger("reward_server.verifiers")

T = TypeVar("T")

#: The longest compilation an item may take (its time budget bounds it too).
COMPILE_TIMEOUT_S = 30.0
#: Items in a sandbox session at once, per test slot: enough to keep the slots busy while
#: others compile, without a work directory for every item of a large request at once.
SESSIONS_PER_WORKER = 2
#: The sessions (items) a light tenant's request may take first, per unit of weight (the fair
#: queue's burst).
SESSION_BURST = 64
#: The one flow of the sandbox slots: programs of items that have their session, served in
#: the order they ask (the tenants' shares are applied to the sessions).
IN_SESSION = Tenant("items in session")
#: The longest detail of a failure the log carries.
_LOG_CHARS = 300

#: RunResult statuses that are a test's verdict as they are.
_STATUS_VERDICTS: dict[str, TestVerdict] = {
    "timeout": "timeout",
    "runtime_error": "runtime_error",
    "memory_exceeded": "memory_exceeded",
    "output_exceeded": "output_exceeded",
    "sandbox_error": "sandbox_error",
}


def canonical_languages(names: Sequence[str]) -> tuple[str, ...]:
    """The sandbox's names of ``names`` (aliases resolved, repeats dropped); ValueError
    naming the languages it runs for one it does not."""
    out: list[str] = []
    for name in names:
        try:
            canonical = language(name).name
        except ValueError:
            known = ", ".join(sorted(LANGUAGES))
            raise ValueError(f"unknown language {name!r}; the sandbox runs {known}") from None
        if canonical not in out:
            out.append(canonical)
    return tuple(out)


def _resolve(tag: str) -> str | None:
    try:
        return language(tag).name
    except ValueError:
        return None


def judge(
    suite: Suite,
    case: Case,
    result: RunResult,
    marker: str | None,
    tolerance: float | None,
) -> TestVerdict:
    """A finished run's verdict (``marker``: the harness's, None for stdin/stdout tests)."""
    if result.status != "ok":
        return _STATUS_VERDICTS.get(result.status, "sandbox_error")
    if marker is None:
        return (
            "passed" if outputs_match(result.stdout, case.expected, tolerance) else "wrong_answer"
        )
    outcome = harness.read_outcome(result.stdout, marker)
    if not outcome.finished:
        return "runtime_error"  # it exited (status 0) before the test was done
    if outcome.syntax_error:
        return "compile_error"
    if suite.format == "call":
        if outcome.unserialisable is not None:
            return "wrong_answer"
        return "passed" if values_match(outcome.value, case.expected, tolerance) else "wrong_answer"
    return "passed" if outcome.ok else "wrong_answer"


@dataclass(slots=True)
class _Item:
    """One item's run: its tests' verdicts as they come, and its time budget."""

    suite: Suite
    budget_s: float
    verdicts: list[TestVerdict | None] = field(default_factory=list)
    failed: bool = False
    detail: str | None = None  # why the sandbox failed, for the log

    def spend(self, seconds: float) -> None:
        self.budget_s -= max(0.0, seconds)


class _LoopThread:
    """An asyncio event loop (the standard library's) running in a daemon thread."""

    #: Seconds close() waits for the loop's work to be cancelled and the thread to end.
    CLOSE_WAIT_S = 30.0

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    async def call(self, work: Coroutine[Any, Any, T]) -> T:
        """Await ``work`` on this loop from another one (cancelling the caller cancels it)."""
        future: Future[T] = asyncio.run_coroutine_threadsafe(work, self.loop)
        return await asyncio.wrap_future(future)

    def close(self) -> None:
        """Cancel what runs on the loop (its sandboxes end with it), then stop the thread."""

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if self.loop.is_closed():
            return
        try:
            asyncio.run_coroutine_threadsafe(cancel_all(), self.loop).result(self.CLOSE_WAIT_S)
        except Exception:  # pragma: no cover - a sandbox that would not stop
            logger.exception("code verifier: its runs did not stop")
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(self.CLOSE_WAIT_S)
        if not self.thread.is_alive():
            self.loop.close()


class CodeVerifier:
    """A ``verifier: code`` entry's runner: see the module docstring."""

    def __init__(self, options: CodeOptions, name: str) -> None:
        """Check the options (ValueError with a one-line reason: an unknown language, a
        limit out of range)."""
        options.check()
        self.options = replace(options, languages=canonical_languages(options.languages))
        self.name = name
        self.sandbox: Sandbox | None = None
        self._busy = 0
        self._closed = False
        workers = self.options.workers
        closed = f"verifier {name!r} is closed"
        self._slots = Seats(workers, closed=closed)
        self._sessions = Seats(workers * SESSIONS_PER_WORKER, burst=SESSION_BURST, closed=closed)
        self._runner: _LoopThread | None = None

    def __repr__(self) -> str:
        return (
            f"CodeVerifier({self.name!r}, {list(self.options.languages)}, {self.options.sandbox})"
        )

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def limits(self) -> Limits:
        """The limits of one test's run."""
        o = self.options
        return Limits(
            run_timeout_s=o.test_timeout_s,
            compile_timeout_s=min(COMPILE_TIMEOUT_S, o.timeout_s),
            memory_mb=o.memory_mb,
            output_bytes=o.output_bytes,
        )

    def start(self) -> None:
        """Make the sandbox: ModelLoadError (one line: why, and what to do) when no sandbox
        can be made here; ``sandbox: none`` is logged as a warning, at every start."""
        if self._closed:
            raise NotRunningError(f"verifier {self.name!r} is closed")
        if self.sandbox is not None:
            return
        o = self.options
        if o.sandbox == "none":
            logger.warning(
                "verifier %r runs programs WITHOUT a sandbox (sandbox: none): each one runs as "
                "this server's user, and can read its files and reach its network; use this "
                "only for programs you trust",
                self.name,
            )
        try:
            sandbox = Sandbox(o.sandbox, bwrap=o.bwrap, workers=o.workers)
        except SandboxUnavailable as exc:
            raise ModelLoadError(
                f"verifier {self.name!r} cannot make a sandbox for programs: {exc}"
            ) from None
        # A language whose toolchain is missing would fail every item: say so now.
        missing = [why for name in o.languages if (why := sandbox.why_unavailable(name))]
        if missing:
            raise ModelLoadError(
                f"verifier {self.name!r} cannot run {missing[0]}; install it, or take the "
                "language out of the entry's languages"
            )
        self.sandbox = sandbox
        self._runner = _LoopThread(f"code-{self.name}")

    def close(self) -> None:
        """Refuse new items; cancel those in progress (their sandboxes end) (idempotent)."""
        self._closed = True
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.close()

    @property
    def busy(self) -> int:
        """Items being verified now."""
        return self._busy

    @property
    def live_workers(self) -> int:
        """Test slots: tests that can run at once (0 before start and once closed)."""
        return self.options.workers if self.sandbox is not None and not self._closed else 0

    # -- verification --------------------------------------------------------------------

    def _running(self) -> tuple[Sandbox, _LoopThread]:
        if self.sandbox is None or self._runner is None or self._closed:
            state = "closed" if self._closed else "not started"
            raise NotRunningError(f"verifier {self.name!r} is {state}")
        return self.sandbox, self._runner

    async def verify(self, tasks: Sequence[Task], deadline: float | None = None) -> list[Verdict]:
        """Each task's verdict, in order (never raises for a failing item); the items still
        running at ``deadline`` are cancelled (their sandboxes end) with reason ``deadline``."""
        if not tasks:
            return []
        _, runner = self._running()
        return await runner.call(self._verify_all(tasks, deadline))

    async def run_once(
        self, language_name: str, files: dict[str, str | bytes], stdin: str, limits: Limits
    ) -> tuple[CompileResult, RunResult | None]:
        """Build and run one program once in the sandbox (``/run_code``), in a session and
        slots as an item's, on the verifier's loop; no run when the build failed."""
        compiled, runs = await self.run_program(language_name, files, [stdin], limits)
        return compiled, runs[0] if runs else None

    async def run_program(
        self,
        language_name: str,
        files: Mapping[str, str | bytes],
        stdins: Sequence[str],
        limits: Limits | None = None,
    ) -> tuple[CompileResult, list[RunResult]]:
        """The item runner of :meth:`verify` for a ready-made program (a python verifier's
        function and its harness, not a response's): built once in one item's sandbox, run
        on each of ``stdins`` concurrently, each run in a test slot, on the verifier's loop;
        no runs when the build failed. ``limits``: each run's (default :attr:`limits`)."""
        _, runner = self._running()
        return await runner.call(
            self._run_program(language_name, dict(files), stdins, limits or self.limits)
        )

    async def _run_program(
        self,
        language_name: str,
        files: dict[str, str | bytes],
        stdins: Sequence[str],
        limits: Limits,
    ) -> tuple[CompileResult, list[RunResult]]:
        async def run(session: Session, stdin: str) -> RunResult:
            async with self._slot():
                return await session.run(stdin, limits=limits)

        async with self._session(language_name, files, limits) as session:
            compiled = session.compile_result
            assert compiled is not None
            if not compiled.ok:
                return compiled, []
            results = await asyncio.gather(*(run(session, stdin) for stdin in stdins))
        return compiled, list(results)

    @asynccontextmanager
    async def _session(
        self, language_name: str, files: dict[str, str | bytes], limits: Limits
    ) -> AsyncIterator[Session]:
        """One item's sandbox, its program built in a slot, once a session is free for it:
        the one place the verifier opens the sandbox for an item."""
        assert self.sandbox is not None
        async with self._sessions.seat(current_tenant.get()), AsyncExitStack() as stack:
            async with self._slot():
                session = self.sandbox.session(language_name, files, limits)
                await stack.enter_async_context(session)
            yield session

    def _slot(self) -> AbstractAsyncContextManager[None]:
        """A sandbox slot for one program (a build or a test run) of an item that has its
        session, in the order asked (see the module docstring)."""
        return self._slots.seat(IN_SESSION)

    async def _verify_all(self, tasks: Sequence[Task], deadline: float | None) -> list[Verdict]:
        work = [self._verify_item(i, t) for i, t in enumerate(tasks)]
        return await settle_by(work, deadline, self.options.on_error)

    async def _verify_item(self, position: int, task: Task) -> Verdict:
        self._busy += 1
        try:
            return await self._verify(position, task)
        finally:
            self._busy -= 1

    async def _verify(self, position: int, task: Task) -> Verdict:
        try:
            suite = parse_suite(task.label)
        except ValueError as exc:
            self._log(position, "error", str(exc))
            extras = {"passed": 0.0, "total": 0.0}  # objectives stay complete
            return Verdict(score=self.options.on_error, extras=extras, error="error")
        program = extract_program(task.response, self.options.languages, _resolve)
        if program.refused is None and suite.format != "stdio" and program.language != "python":
            program = replace(
                program, refused=f"{suite.format}-based tests run Python, not {program.language}"
            )
        item = _Item(suite, self.options.timeout_s, [None] * len(suite.cases))
        if program.refused is not None:
            item.verdicts = ["compile_error"] * len(suite.cases)
        else:
            await self._run_item(item, program)
        return self._verdict(position, item)

    async def _run_item(self, item: _Item, program: Program) -> None:
        lang = LANGUAGES[program.language]
        files: dict[str, str | bytes] = dict(harness.files(item.suite, program.source, lang.source))
        async with self._session(lang.name, files, self.limits) as session:
            compiled = session.compile_result
            assert compiled is not None
            item.spend(compiled.elapsed_s)
            if not compiled.ok:
                verdict: TestVerdict = "compile_error"
                if compiled.status == "sandbox_error":
                    verdict, item.detail = "sandbox_error", compiled.stderr
                item.verdicts = [verdict] * len(item.suite.cases)
                return
            await asyncio.gather(
                *(self._run_test(item, session, i) for i in range(len(item.suite.cases)))
            )

    async def _run_test(self, item: _Item, session: Session, index: int) -> None:
        case = item.suite.cases[index]
        async with self._slot():
            if self.options.stop_on_failure and item.failed:
                item.verdicts[index] = "skipped"
                return
            if item.budget_s <= 0:
                item.verdicts[index] = "timeout"
                item.failed = True
                return
            stdin, marker = harness.stdin(item.suite, case)
            # The last test of an item gets what is left of its budget, if that is less.
            run_timeout_s = min(self.options.test_timeout_s, item.budget_s)
            limits = replace(self.limits, run_timeout_s=run_timeout_s)
            result = await session.run(stdin, limits=limits)
        item.spend(result.elapsed_s)
        verdict = judge(item.suite, case, result, marker, self.options.float_tolerance)
        item.verdicts[index] = verdict
        if verdict != "passed":
            item.failed = True
        if verdict == "sandbox_error" and item.detail is None:
            item.detail = result.message or result.stderr

    def _verdict(self, position: int, item: _Item) -> Verdict:
        tests = tuple(v or "skipped" for v in item.verdicts)
        total = len(tests)
        passed = sum(v == "passed" for v in tests)
        extras = {"passed": float(passed), "total": float(total)}
        if "sandbox_error" in tests:
            self._log(position, "sandbox_error", item.detail)
            return Verdict(
                score=self.options.on_error, extras=extras, error="sandbox_error", tests=tests
            )
        if self.options.score == "all_pass":
            score = 1.0 if passed == total else 0.0
        else:
            score = passed / total
        return Verdict(score=score, extras=extras, tests=tests)

    def _log(self, position: int, reason: str, detail: str | None) -> None:
        # A label's problem or the sandbox's reason: one line, never a program's output.
        text = " ".join((detail or "").split())[:_LOG_CHARS] or "no detail"
        logger.warning("verifier %r: item %d: %s: %s", self.name, position, reason, text)
