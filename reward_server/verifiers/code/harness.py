"""What runs in the sandbox for each test: the files of an item's program and each test's
stdin, and how a finished run reads back.

Standard input/output tests run the program itself (the language's main file) with the
test's input. Call-based and assert-based tests (Python) run a harness, ``main.py``, beside
the program, ``solution.py``: the harness reads one JSON line from stdin (the test and a
random marker), runs the program as a module named ``solution`` (its ``if __name__ ==
"__main__"`` block does not run: it is tested, not run), then calls the function, or runs
the test's asserts (HumanEval: ``check(entry_point)``), and writes the marker and the outcome
as JSON on a line of its own, on a copy of stdout taken before the program ran.

The marker is what tells a finished test from a program that exits early with status 0
(``sys.exit(0)`` before the asserts, a reward hack): the outcome counts only when the line
with this run's marker is there. A program that reads the harness's memory could forge it:
the harness guards against early exits, not against a program that attacks the
interpreter it runs in (the sandbox bounds what that can do, not what it reports).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from reward_server.verifiers.code.suite import Case, Suite

__all__ = [
    "HARNESS",
    "HARNESS_FILE",
    "PROGRAM_FILE",
    "REPORTER",
    "Outcome",
    "files",
    "read_outcome",
    "stdin",
]

#: The harness's and the program's file names (Python).
HARNESS_FILE = "main.py"
PROGRAM_FILE = "solution.py"

#: Names a program may use without importing them, as APPS's and verl's harnesses give
#: them (LeetCode-style solutions write ``List[int]`` with no import).
_PRELUDE = """\
import bisect, collections, copy, functools, heapq, itertools, math, random, re, string, sys
from bisect import bisect_left, bisect_right, insort
from collections import Counter, OrderedDict, defaultdict, deque
from functools import cache, lru_cache, reduce
from heapq import heapify, heappop, heappush, heappushpop, heapreplace, nlargest, nsmallest
from itertools import accumulate, combinations, permutations, product
from math import ceil, floor, gcd, inf, sqrt
from typing import *
"""

#: The harnesses' way back (this one's and a sandboxed python verifier's): ``_reporter(marker)``
#: takes a copy of stdout before the program runs and gives ``report(outcome)``, which writes
#: the marker and the outcome (JSON text) on a line of their own there. Needs ``os`` and ``sys``.
REPORTER = """\
def _reporter(marker):
    out = os.dup(1)

    def report(outcome):
        for stream in (sys.stdout, sys.__stdout__):
            try:
                stream.flush()
            except Exception:
                pass
        os.write(out, ("\\n" + marker + " " + outcome + "\\n").encode())

    return report
"""

HARNESS = (
    """\
import json, os, sys, traceback


"""
    + REPORTER
    + """

def _run():
    test = json.loads(sys.stdin.readline())
    report = _reporter(test.pop("marker"))
    # A real module, so that what looks a class up by its module (dataclasses, pickle,
    # typing) finds the program's namespace.
    module = type(sys)("solution")
    module.__file__ = "solution.py"
    sys.modules["solution"] = module
    namespace = module.__dict__
    exec(compile(PRELUDE, "<prelude>", "exec"), namespace)
    with open("solution.py", encoding="utf-8") as file:
        source = file.read()
    try:
        code = compile(source, "solution.py", "exec")
    except (SyntaxError, ValueError) as exc:
        report(json.dumps({"syntax_error": str(exc)[:200]}))
        return
    exec(code, namespace)
    if test["mode"] == "call":
        name = test["fn_name"]
        target = namespace.get(name)
        if not callable(target) and "Solution" in namespace:
            target = getattr(namespace["Solution"](), name)
        if not callable(target):
            raise NameError(f"the program defines no function {name!r}")
        value = target(*test["args"])
        try:
            text = json.dumps({"value": value}, allow_nan=True)
        except (TypeError, ValueError):
            text = json.dumps({"unserialisable": type(value).__name__})
        report(text)
        return
    exec(compile(test.get("setup", ""), "<setup>", "exec"), namespace)
    try:
        exec(compile(test["code"], "<test>", "exec"), namespace)
        entry = test.get("entry_point")
        if entry is not None and callable(namespace.get("check")):
            namespace["check"](namespace[entry])
    except AssertionError as exc:
        report(json.dumps({"failed": str(exc)[:200]}))
        return
    report(json.dumps({"ok": True}))


PRELUDE = """
    + repr(_PRELUDE)
    + """

if __name__ == "__main__":
    try:
        _run()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
"""
)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a harness run reported: ``finished`` (its marker line was there), and then the
    call's ``value`` (``unserialisable``: the type of a value JSON cannot carry), the
    asserts' ``ok``, or ``syntax_error``: the program does not compile."""

    finished: bool
    value: Any = None
    unserialisable: str | None = None
    ok: bool = False
    syntax_error: bool = False


def files(suite: Suite, source: str, main_file: str) -> dict[str, str]:
    """The files of an item's runs: the program alone as the language's ``main_file``
    (stdin/stdout tests), or the harness and the program (call- and assert-based)."""
    if suite.format == "stdio":
        return {main_file: source}
    return {HARNESS_FILE: HARNESS, PROGRAM_FILE: source}


def stdin(suite: Suite, case: Case) -> tuple[str, str | None]:
    """A test's stdin, and the marker its harness will write (None: no harness)."""
    if suite.format == "stdio":
        return case.stdin, None
    marker = secrets.token_hex(16)
    test: dict[str, Any] = {"marker": marker, "mode": suite.format}
    if suite.format == "call":
        test.update(fn_name=suite.fn_name, args=list(case.args))
    else:
        test.update(code=case.code, setup=suite.setup, entry_point=suite.entry_point)
    return json.dumps(test) + "\n", marker


def read_outcome(stdout: str, marker: str) -> Outcome:
    """The outcome a harness wrote on ``stdout`` (the last line with ``marker``)."""
    prefix = marker + " "
    for line in reversed(stdout.splitlines()):
        if line.startswith(prefix):
            try:
                data = json.loads(line[len(prefix) :])
            except json.JSONDecodeError:
                return Outcome(finished=False)
            if not isinstance(data, dict):
                return Outcome(finished=False)
            return Outcome(
                finished=True,
                value=data.get("value"),
                unserialisable=data.get("unserialisable"),
                ok=bool(data.get("ok")),
                syntax_error="syntax_error" in data,
            )
    return Outcome(finished=False)
