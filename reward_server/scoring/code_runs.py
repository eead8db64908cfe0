"""One program run on request (SandboxFusion's ``/run_code``), in the sandbox of the server's
code verifier: :class:`CodeRuns` admits runs, applies that verifier's languages and limits
and gives back the sandbox's results as plain data (no HTTP here).

The runs come from the first ``verifier: code`` entry of the models file: its sandbox (and
whose workers bound the runs of both), its languages, and its limits as ceilings:
a request's compile and run timeouts are honoured up to ``COMPILE_TIMEOUT_S`` and the
entry's ``timeout_s``, its memory limit up to the entry's ``memory_mb`` (the entry's when the
request gives none), its output up to ``output_bytes``. Admission is the server's one
(:class:`~reward_server.scheduling.fairness.Admission`): at most ``--max-queue`` runs waiting
or running at once, a tenant with a ``queue_share`` at most its share of them (429 beyond,
with a Retry-After from the runs' measured rate); ``tokens_per_s`` does not apply (a run has
no tokens). An admitted run then waits for the verifier's session and sandbox slot in the
fair queue, beside its items' tests.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from reward_server.config.tenants import current_tenant
from reward_server.errors import RunRefusedError
from reward_server.sandbox import LANGUAGES, CompileResult, Limits, RunResult, language
from reward_server.scheduling.fairness import Admission
from reward_server.verifiers.code.verifier import COMPILE_TIMEOUT_S, CodeVerifier

__all__ = ["CodeRun", "CodeRunResult", "CodeRuns"]


@dataclass(frozen=True, slots=True)
class CodeRun:
    """One run as asked: the program, its language (a sandbox name or alias, or one of
    SandboxFusion's: ``nodejs``), its other files (name -> content), stdin, and the limits
    asked for (None: the entry's)."""

    code: str
    language: str
    files: Mapping[str, bytes]
    stdin: str | None = None
    compile_timeout_s: float | None = None
    run_timeout_s: float | None = None
    memory_mb: int | None = None


@dataclass(frozen=True, slots=True)
class CodeRunResult:
    """The sandbox's results: ``compile`` for a language with a build (None otherwise, as
    SandboxFusion), ``run`` unless the build failed; ``limits`` the run had."""

    language: str
    compile: CompileResult | None
    run: RunResult | None
    limits: Limits


class CodeRuns:
    """Runs programs in a code verifier's sandbox on request (see the module docstring)."""

    def __init__(self, verifier: CodeVerifier, max_queue: int) -> None:
        """``verifier``: the first code verifier served."""
        self.verifier = verifier
        self.max_queue = max_queue
        self._admission = Admission(max_queue, unit="runs")

    @property
    def running(self) -> int:
        """Runs admitted and not finished."""
        return self._admission.queued

    def _language(self, verifier: CodeVerifier, name: str) -> str:
        allowed = verifier.options.languages
        try:
            canonical = language(name).name
        except ValueError:
            canonical = None
        if canonical is None or canonical not in allowed:
            raise RunRefusedError(
                f"language {name!r} is not run here; this server runs {', '.join(allowed)} "
                f"(the languages of its code verifier {verifier.name!r})"
            )
        return canonical

    def limits(self, verifier: CodeVerifier, run: CodeRun) -> Limits:
        """The run's limits: what it asks for, within the entry's."""
        o = verifier.options

        def within(asked: float | None, ceiling: float) -> float:
            if asked is None or not asked > 0 or not math.isfinite(asked):
                return ceiling
            return min(asked, ceiling)

        memory = o.memory_mb if run.memory_mb is None or run.memory_mb <= 0 else run.memory_mb
        return Limits(
            run_timeout_s=within(run.run_timeout_s, o.timeout_s),
            compile_timeout_s=within(run.compile_timeout_s, COMPILE_TIMEOUT_S),
            memory_mb=min(memory, o.memory_mb),
            output_bytes=o.output_bytes,
        )

    async def run(self, run: CodeRun) -> CodeRunResult:
        """Run one program (RunRefusedError for a run that cannot be made, QueueFullError when too many are in progress)."""
        verifier = self.verifier
        name = self._language(verifier, run.language)
        main = LANGUAGES[name].source
        files: dict[str, str | bytes] = {}
        for path, content in run.files.items():
            parts = PurePosixPath(path).parts
            if not parts or parts[0] == "/" or ".." in parts:
                raise RunRefusedError(f"files: {path!r} is not a path inside the work directory")
            if path == main:
                raise RunRefusedError(f"files: {path!r} is the program's own file ({name})")
            files[path] = content
        files[main] = run.code
        limits = self.limits(verifier, run)
        with self._admission.admitted(current_tenant.get(), 1):
            compiled, result = await verifier.run_once(name, files, run.stdin or "", limits)
        if LANGUAGES[name].compile is not None:
            return CodeRunResult(name, compiled, result if compiled.ok else None, limits)
        if compiled.status == "compile_error":
            # A language without a build (Python's syntax check) fails as it would when run:
            # SandboxFusion runs `python main.py` and reports its exit code and traceback.
            result = RunResult(
                status="runtime_error",
                exit_code=1,
                signal=None,
                stdout=compiled.stdout,
                stderr=compiled.stderr,
                stdout_truncated=False,
                stderr_truncated=False,
                elapsed_s=compiled.elapsed_s,
            )
        elif not compiled.ok:  # the check timed out, or the sandbox failed: say so
            return CodeRunResult(name, compiled, None, limits)
        return CodeRunResult(name, None, result, limits)
