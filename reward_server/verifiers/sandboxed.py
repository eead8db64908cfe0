"""A python verifier's function in the sandbox (``verifier: python``, ``sandbox: bwrap``):
:class:`SandboxedFunction`, with the interface of the pool (``start``, ``verify``, ``busy``,
``live_workers``, ``close``).

Each item's call runs in a bubblewrap sandbox of its own, through the code verifier's item
runner (:meth:`~reward_server.verifiers.code.CodeVerifier.run_program`: one place opens the
sandbox): the program is the function's source file, copied as ``reward_function.py``
(a ``path/file.py`` as given; a ``module``'s file as Python's import system finds it on the
server's ``sys.path``, nothing of the module imported in the server), beside a harness,
``main.py``, that reads ``{"marker", "prompt", "response", "label"}`` as one JSON line on
stdin, imports the file, calls the function and writes the marker and the result as JSON
on a line of its own (on a copy of stdout taken first: the function may print). The host
turns that result into the same :class:`~reward_server.verifiers.Verdict` as the worker
processes do (:func:`~reward_server.verifiers.worker.coerce`): a number, or a dict of
numbers holding ``"score"``; ``error`` when it raised, ``timeout`` past ``timeout_s``,
``crash`` when the run ended without the marker (killed, out of memory, ``os._exit``),
``sandbox_error`` when the sandbox failed.

What the function sees: the sandbox's interpreter (the server's own base interpreter when
the sandbox's user can run it, else ``/usr/bin/python3``: possibly another version than the
server's) started with ``-I -S``: its standard library, no site-packages, no ``PYTHONPATH``,
nothing of the server's virtual environment; its own file, nothing beside it (no sibling
module, no package); the host's ``/usr`` read-only; an empty environment, no network, no
view of the server's files or processes. ``start`` imports the file once in a sandbox, so a
function that needs more (``import numpy``) stops the server at start-up with its import
error instead of failing every item.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import json
import logging
import secrets
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from typing import Any

from reward_server.errors import ModelLoadError, NotRunningError
from reward_server.sandbox import Limits, RunResult
from reward_server.verifiers.call import Call
from reward_server.verifiers.code import CodeOptions, CodeVerifier
from reward_server.verifiers.code.harness import REPORTER
from reward_server.verifiers.deadline import settle_by
from reward_server.verifiers.items import Task, Verdict
from reward_server.verifiers.options import VerifierOptions, check_options, split_function
from reward_server.verifiers.pool import outcome_verdict
from reward_server.verifiers.worker import Outcome, coerce

__all__ = ["FUNCTION_FILE", "HARNESS", "SandboxedFunction", "module_source", "read_outcome"]

logger = logging.getLogger("reward_server.verifiers")

#: The function's source file in the sandbox (a name no standard module has).
FUNCTION_FILE = "reward_function.py"
#: Seconds start-up gives the trial import (the sandbox's start included).
LOAD_TIMEOUT_S = 60.0
#: The most characters of a traceback the harness sends back.
_TRACEBACK_CHARS = 4000

#: The harness's code, less its constants and the reporter (:func:`_harness` puts them in).
HARNESS = """\
import json, numbers, os, sys, traceback


def _number(value):
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(type(value).__name__)


def _run():
    request = json.loads(sys.stdin.readline())
    report = _reporter(request.pop("marker"))
    try:
        target = __import__(MODULE)
        for part in ATTRIBUTE.split("."):
            target = getattr(target, part)
        if not callable(target):
            raise TypeError(f"{ATTRIBUTE} is a {type(target).__name__}, not a function")
        if request.get("load"):
            report(json.dumps({"loaded": True}))
            return
        value = target(request["prompt"], request["response"], request["label"])
    except (Exception, SystemExit):
        report(json.dumps({"error": traceback.format_exc()[-LIMIT:]}))
        return
    if isinstance(value, dict) and not all(isinstance(key, str) for key in value):
        report(json.dumps({"unserialisable": "a dict with a key that is not a string"}))
        return
    try:
        text = json.dumps({"value": value}, allow_nan=True, default=_number)
    except (TypeError, ValueError, OverflowError):
        text = json.dumps({"unserialisable": type(value).__name__})
    report(text)


if __name__ == "__main__":
    _run()
"""


def _find_spec(name: str, path: Sequence[str] | None) -> ModuleSpec | None:
    """The spec of module ``name`` (``path``: its parent package's folders), found by the
    import system's finders without importing anything."""
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__spec__", None) is not None:
        return module.__spec__
    if path is None:
        return importlib.util.find_spec(name)  # a top-level name: nothing is imported
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        spec = find(name, path) if find is not None else None
        if spec is not None:
            return spec
    return None


def module_source(module: str) -> Path:
    """The source file of ``module`` on the server's ``sys.path`` (its parent packages are
    not imported); ImportError when it has none (a built-in, an extension module)."""
    parts = module.split(".")
    spec: ModuleSpec | None = None
    path: Sequence[str] | None = None
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        spec = _find_spec(name, path)
        if spec is None:
            raise ImportError(f"no module named {name!r}")
        path = spec.submodule_search_locations
        if i < len(parts) - 1 and path is None:
            raise ImportError(f"{name!r} is not a package")
    assert spec is not None
    origin = spec.origin
    if not spec.has_location or origin is None or not origin.endswith(".py"):
        raise ImportError(f"module {module!r} has no Python source file ({origin})")
    return Path(origin)


def _reported(data: object) -> Outcome | None:
    """The outcome of what the harness reported (None: not a report of its own)."""
    if not isinstance(data, dict):
        return None
    if "value" in data:
        return coerce(data["value"])
    if "error" in data:
        return ("error", 0.0, {}, str(data["error"]))
    if "unserialisable" in data:
        return ("bad_result", 0.0, {}, f"returned {data['unserialisable']}, not a number")
    if data.get("loaded"):
        return (None, 0.0, {}, None)
    return None


def read_outcome(result: RunResult, marker: str) -> Outcome:
    """The outcome of one sandboxed call, from its run and the harness's marker line."""
    prefix = marker + " "
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(prefix):
            try:
                reported = _reported(json.loads(line[len(prefix) :]))
            except json.JSONDecodeError:
                reported = None
            if reported is not None:
                return reported
            break
    status = result.status
    if status == "timeout":
        return ("timeout", 0.0, {}, "no result within timeout_s: its sandbox was killed")
    if status == "sandbox_error":
        return ("sandbox_error", 0.0, {}, result.message or result.stderr)
    if status == "output_exceeded":
        return ("error", 0.0, {}, "the function wrote more than its output limit")
    how = f"signal {result.signal}" if result.signal is not None else f"status {result.exit_code}"
    detail = f"the call ended without a result ({status}, {how})"
    stderr = result.stderr.strip()
    if stderr:
        detail += ": " + stderr[-_TRACEBACK_CHARS:]
    return ("crash", 0.0, {}, detail)


class SandboxedFunction:
    """A ``verifier: python`` entry with ``sandbox: bwrap``: see the module docstring.

    ``__init__`` checks the options and reads the function's file (ValueError with a
    one-line reason), ``start`` makes the sandbox and imports the file once in it
    (ModelLoadError: no sandbox here, or the function does not load there), ``verify``
    scores tasks in order and never raises for a failing item, ``close`` stops it all.
    """

    def __init__(self, options: VerifierOptions, name: str) -> None:
        options = check_options(options)
        if options.verifier != "python" or options.sandbox != "bwrap":
            raise ValueError("a sandboxed function is a python verifier with sandbox: bwrap")
        assert options.function is not None
        where, self.attribute = split_function(options.function)
        try:
            path = Path(where) if where.endswith(".py") or "/" in where else module_source(where)
            source = path.read_text(encoding="utf-8")
        except (ImportError, OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"cannot read the function's source: {exc}") from None
        self.options = options
        self.name = name
        self.source_path = path
        self.files: dict[str, str | bytes] = {
            "main.py": _harness(self.attribute),
            FUNCTION_FILE: source,
        }
        self.runner = CodeVerifier(
            CodeOptions(
                languages=("python",),
                test_timeout_s=options.timeout_s,
                timeout_s=options.timeout_s,
                memory_mb=options.memory_mb,
                sandbox="bwrap",
                bwrap=options.bwrap,
                workers=options.workers,
                on_error=options.on_error,
            ),
            name,
        )
        self._busy = 0

    def __repr__(self) -> str:
        return f"SandboxedFunction({self.name!r}, {self.options.function!r})"

    @property
    def limits(self) -> Limits:
        """The limits of one call."""
        return self.runner.limits

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Make the sandbox and import the function in it once (ModelLoadError with one
        line: no sandbox can be made here, or the function does not load in one)."""
        self.runner.start()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # start may run in a loop
            outcome = pool.submit(asyncio.run, self._call(None)).result(LOAD_TIMEOUT_S)
        reason, _, _, detail = outcome
        if reason is not None:
            self.close()
            lines = (detail or "").strip().splitlines()
            why = lines[-1] if lines else reason
            raise ModelLoadError(
                f"cannot load verifier {self.name!r} in its sandbox ({self.source_path}): "
                f"{why}; the sandbox has Python's standard library and the function's own "
                "file, nothing else (or run it unsandboxed with sandbox: none)"
            )
        logger.info(
            "verifier %s (python: %s) runs each call in a sandbox, %d at once",
            self.name,
            self.options.function,
            self.options.workers,
        )

    def close(self) -> None:
        """Refuse new items; cancel those in progress (idempotent)."""
        self.runner.close()

    @property
    def busy(self) -> int:
        """Items being verified now."""
        return self._busy

    @property
    def live_workers(self) -> int:
        """Calls that can run at once (0 before start and once closed)."""
        return self.runner.live_workers

    # -- verification --------------------------------------------------------------------

    async def verify(self, tasks: Sequence[Task], deadline: float | None = None) -> list[Verdict]:
        """Each task's verdict, in order (never raises for a failing item); the calls still
        running at ``deadline`` are cancelled (their sandboxes end) with reason ``deadline``."""
        if not tasks:
            return []
        if self.runner.live_workers == 0:
            raise NotRunningError(f"verifier {self.name!r} is not running")
        # The breaker of the worker pool (verifiers/call.py), per call: the call's items go
        # ``workers`` at a time, and once most of those settled timed out the rest are not
        # tried (reason timeout), so a function that hangs cannot hold the call for
        # items x timeout_s / workers.
        call, turns = Call(self.name, deadline), asyncio.Semaphore(self.options.workers)
        work = [self._verify(i, t, call, turns) for i, t in enumerate(tasks)]
        return await settle_by(work, deadline, self.options.on_error)

    async def _verify(
        self, position: int, task: Task, call: Call, turns: asyncio.Semaphore
    ) -> Verdict:
        async with turns:
            if call.open():
                return Verdict(self.options.on_error, {}, "timeout")
            self._busy += 1
            try:
                outcome = await self._call(task)
            finally:
                self._busy -= 1
        verdict = outcome_verdict(self.name, position, outcome, self.options.on_error)
        call.record(verdict)
        return verdict

    async def _call(self, task: Task | None) -> Outcome:
        """One call of the function in a sandbox of its own (None: import it only)."""
        marker = secrets.token_hex(16)
        request: dict[str, Any] = {"marker": marker}
        if task is None:
            request["load"] = True
        else:
            request.update(prompt=task.prompt, response=task.response, label=task.label)
        try:
            stdin = json.dumps(request, allow_nan=True) + "\n"
        except (TypeError, ValueError) as exc:
            return ("error", 0.0, {}, f"cannot send the item: {exc!r}")
        compiled, runs = await self.runner.run_program("python", self.files, [stdin])
        if not runs:  # the harness is ours: only the sandbox can fail here
            return ("sandbox_error", 0.0, {}, compiled.stderr or compiled.status)
        return read_outcome(runs[0], marker)


def _harness(attribute: str) -> str:
    """The harness of ``attribute`` (its constants and the reporter put in)."""
    constants = (
        f"MODULE = {FUNCTION_FILE.removesuffix('.py')!r}\n"
        f"ATTRIBUTE = {attribute!r}\n"
        f"LIMIT = {_TRACEBACK_CHARS}\n\n\n"
    )
    head, _, tail = HARNESS.partition("\n\n\ndef _number")
    return head + "\n\n" + constants + REPORTER + "\n\ndef _number" + tail
