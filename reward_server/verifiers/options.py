"""What a verifier pool runs (:class:`VerifierOptions`, plain picklable data: it travels
to the worker processes) and how the options are checked."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, get_args

from reward_server.verifiers.formats import FormatOptions
from reward_server.verifiers.graders.python_sandbox import GraderLimits
from reward_server.verifiers.tool_calls import ToolCallOptions

__all__ = [
    "FunctionSandbox",
    "VerifierName",
    "VerifierOptions",
    "check_options",
    "split_function",
]

#: The verifiers a :class:`~reward_server.verifiers.VerifierPool` runs (``code`` runs in
#: :mod:`reward_server.verifiers.code` instead).
VerifierName = Literal["math", "exact", "regex", "python", "tool_call", "format", "grader"]
#: Where a python verifier's function runs: ``none``, in the pool's worker processes (with
#: the server's rights); ``bwrap``, each item's call in a bubblewrap sandbox of its own
#: (:mod:`reward_server.verifiers.sandboxed`).
FunctionSandbox = Literal["none", "bwrap"]


@dataclass(frozen=True, slots=True)
class VerifierOptions:
    """What a :class:`~reward_server.verifiers.VerifierPool` runs and how.

    ``function`` (python only): ``"module:function"`` importable in the workers (they get
    the server's ``sys.path``), or ``"path/to/file.py:function"`` (a relative path is
    taken from the server's working directory); the function is called as
    ``f(prompt, response, label)`` and returns a number or a dict of numbers holding
    ``"score"``. ``sandbox`` (python only): ``"none"`` (the workers run the function) or
    ``"bwrap"`` (each call in a sandbox; ``bwrap``: its binary, ``memory_mb``: the call's
    address space). ``pattern`` (regex only): a response that matches it (``re.search``) scores
    1.0, else 0.0; without it, each item's label (a string) is its pattern. ``tool_call`` and
    ``format``: the options of :mod:`reward_server.verifiers.tool_calls` and
    :mod:`reward_server.verifiers.formats` (their defaults when None).
    """

    verifier: VerifierName
    function: str | None = None
    pattern: str | None = None
    workers: int = 1
    timeout_s: float = 5.0
    on_error: float = 0.0
    sandbox: FunctionSandbox = "none"
    bwrap: str | None = None
    memory_mb: int = 1024
    #: tool_call only: its rules' options, and whether every call of the trajectory after the
    #: last user message counts (else the response message's calls).
    tool_call: ToolCallOptions | None = None
    trajectory: bool = False
    #: format only: the shape asked for.
    format: FormatOptions | None = None
    #: grader only: the OpenAI grader object (None: each task brings its own), its python
    #: leaves' limits, and the embedding model of its cosine leaves (a local folder).
    grader: dict[str, Any] | None = None
    grader_limits: GraderLimits | None = None
    embedding_model: str | None = None


def split_function(spec: str) -> tuple[str, str]:
    """``"pkg.mod:func"`` or ``"dir/file.py:func"`` -> (module or file, attribute path).

    A file path is made absolute here, from the current working directory.
    """
    where, sep, attr = spec.rpartition(":")
    if not sep or not where.strip() or not attr.strip():
        raise ValueError(
            f"function {spec!r} is not 'module:function' or 'path/to/file.py:function'"
        )
    where, attr = where.strip(), attr.strip()
    if where.endswith(".py") or "/" in where:
        where = str(Path(where).expanduser().resolve())
    return where, attr


def check_options(options: VerifierOptions) -> VerifierOptions:
    """``options`` with a python file path made absolute, or ValueError with a one-line reason."""
    names = get_args(VerifierName)
    if options.verifier not in names:
        raise ValueError(f"unknown verifier {options.verifier!r}; choose one of {list(names)}")
    _check_numbers(options)
    _check_owners(options)
    if options.sandbox not in get_args(FunctionSandbox):
        raise ValueError(f"sandbox must be none or bwrap, not {options.sandbox!r}")
    if options.sandbox != "none" and options.verifier != "python":
        raise ValueError(f"sandbox is for the python verifier, not {options.verifier!r}")
    if options.bwrap is not None and options.sandbox != "bwrap":
        raise ValueError("bwrap is only for sandbox: bwrap")
    if options.verifier == "python":
        if not options.function:
            raise ValueError("the python verifier needs function: 'module:function'")
        where, attr = split_function(options.function)
        return replace(options, function=f"{where}:{attr}")
    if options.pattern is not None and options.verifier != "regex":
        raise ValueError(f"pattern is for the regex verifier, not {options.verifier!r}")
    if options.pattern is not None:
        if not options.pattern:
            raise ValueError("pattern is empty (omit it to take each item's label as its pattern)")
        try:
            re.compile(options.pattern)
        except re.error as exc:
            raise ValueError(f"pattern {options.pattern!r} does not compile: {exc}") from None
    return options


def _check_owners(options: VerifierOptions) -> None:
    """ValueError for an option of one verifier given to another."""
    owners = (
        ("function", "python"),
        ("tool_call", "tool_call"),
        ("format", "format"),
        ("grader", "grader"),
        ("grader_limits", "grader"),
        ("embedding_model", "grader"),
    )
    for field, verifier in owners:
        if getattr(options, field) is not None and options.verifier != verifier:
            raise ValueError(f"{field} is for the {verifier} verifier, not {options.verifier!r}")
    if options.trajectory and options.verifier != "tool_call":
        raise ValueError(f"trajectory is for the tool_call verifier, not {options.verifier!r}")


def _check_numbers(options: VerifierOptions) -> None:
    if isinstance(options.workers, bool) or not isinstance(options.workers, int):
        raise ValueError(f"workers must be an integer, not {options.workers!r}")
    if options.workers < 1:
        raise ValueError(f"workers must be at least 1, not {options.workers}")
    if not options.timeout_s > 0 or not math.isfinite(options.timeout_s):
        raise ValueError(f"timeout_s must be a positive number of seconds, not {options.timeout_s}")
    if isinstance(options.memory_mb, bool) or not isinstance(options.memory_mb, int):
        raise ValueError(f"memory_mb must be an integer, not {options.memory_mb!r}")
    if options.memory_mb < 16:
        raise ValueError(f"memory_mb must be at least 16, not {options.memory_mb}")
    if not math.isfinite(options.on_error):
        raise ValueError(f"on_error must be a finite number, not {options.on_error}")
