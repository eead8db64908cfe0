"""What a code verifier runs and how (:class:`CodeOptions`), and the names of a test's
verdicts."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Literal, get_args

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "TEST_VERDICTS",
    "CodeOptions",
    "SandboxMode",
    "ScoreRule",
    "TestVerdict",
    "default_workers",
]

#: One test's verdict:
#:
#: - ``passed``: the answer is the expected one;
#: - ``wrong_answer``: it is not (or an assert of the test failed);
#: - ``timeout``: the test ran past ``test_timeout_s``, or the item's ``timeout_s`` was spent
#:   before it started;
#: - ``runtime_error``: the program exited with an error or a signal (or, call- and
#:   assert-based, exited before the test finished);
#: - ``compile_error``: the program did not compile (or its compilation timed out), or it is
#:   in a language the entry does not allow or the tests' format cannot run (call- and
#:   assert-based tests are Python);
#: - ``memory_exceeded``, ``output_exceeded``: it went past ``memory_mb`` or
#:   ``output_bytes``;
#: - ``sandbox_error``: the sandbox failed to run it (not the program's doing: the item is
#:   then scored ``on_error`` with the reason ``sandbox_error``);
#: - ``skipped``: not run, because an earlier test failed (``stop_on_failure``).
TestVerdict = Literal[
    "passed",
    "wrong_answer",
    "timeout",
    "runtime_error",
    "compile_error",
    "memory_exceeded",
    "output_exceeded",
    "sandbox_error",
    "skipped",
]
TEST_VERDICTS: tuple[TestVerdict, ...] = get_args(TestVerdict)

#: ``pass_rate``: the share of the item's tests passed; ``all_pass``: 1.0 when every test
#: passed, else 0.0.
ScoreRule = Literal["pass_rate", "all_pass"]
#: ``bwrap``: every program in a bubblewrap sandbox; ``none``: unsandboxed subprocesses with
#: the same limits, for trusted programs only.
SandboxMode = Literal["bwrap", "none"]

#: The item's total run time when the entry gives no ``timeout_s``.
DEFAULT_TIMEOUT_S = 60.0


def default_workers() -> int:
    """Tests run at once by default: the cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True, slots=True)
class CodeOptions:
    """A ``verifier: code`` entry's settings (the models file's keys of the same names).

    ``languages``: the languages a program may be in (sandbox names or aliases; the first is
    the default of a program without a language tag). ``timeout_s``: the run time of all of
    an item's tests together (the compilation included); ``test_timeout_s``: one test's.
    ``workers``: tests run at once, over all items. ``bwrap``: the bubblewrap binary (None:
    the sandbox's own choice).
    """

    languages: tuple[str, ...] = ("python",)
    score: ScoreRule = "pass_rate"
    stop_on_failure: bool = False
    test_timeout_s: float = 10.0
    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int = 1024
    output_bytes: int = 1 << 20
    float_tolerance: float | None = None
    sandbox: SandboxMode = "bwrap"
    bwrap: str | None = None
    workers: int = 1
    on_error: float = 0.0

    def check(self) -> None:
        """ValueError with a one-line reason when a setting is out of range."""
        if not self.languages:
            raise ValueError("languages is empty: name at least one (python, cpp, javascript)")
        if self.score not in get_args(ScoreRule):
            raise ValueError(f"score must be pass_rate or all_pass, not {self.score!r}")
        if self.sandbox not in get_args(SandboxMode):
            raise ValueError(f"sandbox must be bwrap or none, not {self.sandbox!r}")
        for name in ("test_timeout_s", "timeout_s"):
            value = getattr(self, name)
            if not value > 0 or not math.isfinite(value):
                raise ValueError(f"{name} must be a positive number of seconds, not {value}")
        if self.float_tolerance is not None and not (
            self.float_tolerance >= 0 and math.isfinite(self.float_tolerance)
        ):
            raise ValueError(f"float_tolerance must be >= 0, not {self.float_tolerance}")
        for name in ("memory_mb", "output_bytes", "workers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, not {getattr(self, name)}")
        if not math.isfinite(self.on_error):
            raise ValueError(f"on_error must be a finite number, not {self.on_error}")
