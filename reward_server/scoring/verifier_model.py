"""A verifier served beside reward models: ``kind: verifier`` entries of the models file.

A verifier loads no model: it reads each item's prompt, response and label and runs a rule
(:mod:`reward_server.verifiers`: ``math``, ``exact``, ``regex`` or a user's ``python``
function) in a pool of worker processes, each item under its own time limit; ``code`` runs
the response's program against the label's tests in a sandbox instead
(:mod:`reward_server.verifiers.code`, each test's verdict in the answer's ``tests``), and a
``python`` function with ``sandbox: bwrap`` is called in one
(:mod:`reward_server.verifiers.sandboxed`). It serves like
a reward model (its score weighted, normalised and combined with the others, shown in
``components``), with one difference: an item whose verification fails (a timeout, a
crashed worker, an exception, a non-finite result) is not an error of the request. It scores
the entry's ``on_error``, its reason is counted in ``/metrics``
(``reward_server_verifier_errors_total``) and returned in the answer's ``verifier_errors``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from reward_server.config.tenants import current_tenant
from reward_server.config.verifier_entries import (
    CodeVerifierEntry,
    FormatVerifier,
    PooledVerifier,
    PythonVerifier,
    RegexVerifier,
    ToolCallVerifier,
    VerifierEntry,
)
from reward_server.errors import ModelLoadError, NotReadyError
from reward_server.scheduling.fairness import Admission
from reward_server.scoring.deadline import current_deadline
from reward_server.scoring.item_result import ItemResult
from reward_server.scoring.items import Items, tasks
from reward_server.scoring.metrics import ModelState
from reward_server.verifiers import Task, Verdict, VerifierOptions, VerifierPool
from reward_server.verifiers.code import (
    CodeOptions,
    CodeVerifier,
    default_workers,
)
from reward_server.verifiers.formats import FormatOptions
from reward_server.verifiers.sandboxed import SandboxedFunction
from reward_server.verifiers.tool_calls import ToolCallOptions

if TYPE_CHECKING:
    from reward_server.scoring.served import ServingContext

__all__ = ["Verifier", "VerifierModel", "code_options", "load_verifier", "rule_options"]

logger = logging.getLogger(__name__)


def _result(verdict: Verdict) -> ItemResult:
    return ItemResult(
        score=verdict.score,
        num_tokens=0,  # a verifier reads text, not tokens
        truncated=False,
        error=verdict.error,
        extras=tuple(sorted(verdict.extras.items())),
        tests=verdict.tests,
        note=verdict.note,
    )


def rule_options(spec: VerifierEntry) -> dict[str, Any]:
    """A tool_call or format entry's own options, as its verifier takes them (ValueError
    for a bad combination)."""
    if isinstance(spec, ToolCallVerifier):
        options = ToolCallOptions(spec.credit, spec.tool_call_tags, spec.check_schema)
        return {"tool_call": options, "trajectory": spec.calls == "trajectory"}
    if isinstance(spec, FormatVerifier):
        shape = FormatOptions(
            spec.reasoning_tags, spec.answer_tags, spec.require_reasoning, spec.pattern
        )
        return {"format": shape}
    return {}


class Verifier(Protocol):
    """What runs a verifier's items: a :class:`~reward_server.verifiers.VerifierPool` of
    worker processes, a :class:`~reward_server.verifiers.code.CodeVerifier`, or a
    :class:`~reward_server.verifiers.sandboxed.SandboxedFunction`."""

    @property
    def busy(self) -> int:
        """Items being verified now."""
        ...

    @property
    def live_workers(self) -> int:
        """Workers (processes, or a code verifier's test slots) ready now."""
        ...

    def start(self) -> None:
        """Start; ModelLoadError when it cannot run here."""
        ...

    async def verify(self, tasks: Sequence[Task], deadline: float | None = None) -> list[Verdict]:
        """Each task's verdict, in order (a failing item is a verdict, not an exception);
        the items unsettled at ``deadline`` (``time.monotonic()``) get ``deadline``."""
        ...

    def close(self) -> None:
        """Stop (idempotent)."""
        ...


class VerifierModel:
    """A ``kind: verifier`` entry, served: its pool of worker processes."""

    kind = "verifier"
    scorer = None
    scheduler = None
    max_batch_tokens: int | None = None
    #: Its one value: the score.
    labels: ClassVar[list[str]] = ["score"]

    def __init__(self, spec: VerifierEntry, pool: Verifier) -> None:
        self.spec = spec
        self.name = spec.name
        self.pool = pool
        #: True once started, until stop() begins.
        self.running = False
        self._ctx: ServingContext | None = None
        self._admission: Admission | None = None

    @property
    def queued(self) -> int:
        """Items being verified now."""
        return self.pool.busy

    async def start(self, ctx: ServingContext) -> None:
        """Take the registry's context (the pool's workers started at load time) and admit
        as every scheduler does (--max-queue items at once, a tenant's share of them)."""
        self._ctx = ctx
        self._admission = Admission(ctx.settings.max_queue, ctx.buckets)
        self.running = True

    def snapshot(self) -> ModelState | None:
        """Items being verified and workers ready, for /metrics at a scrape; None until
        started."""
        if self._ctx is None:
            return None
        return ModelState(self.name, self.pool.busy, live_workers=self.pool.live_workers)

    async def stop(self, *, drain: bool = True) -> None:
        """Refuse new work; the pool itself ends in close()."""
        self.running = False

    async def score(
        self, items: Items, *, truncate: bool, max_tokens: int | None, cache: bool = True
    ) -> list[ItemResult]:
        """Verify every item (never raises for a failing item: it scores ``on_error``).
        No score cache: ``cache`` is ignored (see score_cache.caches_kind)."""
        ctx, admission = self._ctx, self._admission
        if ctx is None or admission is None or not self.running:
            raise NotReadyError("the verifier is not running")
        template = ctx.policy_template
        work = await asyncio.get_running_loop().run_in_executor(
            ctx.tokenizer, tasks, items, template
        )
        with admission.admitted(current_tenant.get(), len(work)):
            verdicts = await self.pool.verify(work, current_deadline.get())
        results = [_result(v) for v in verdicts]
        for verdict in verdicts:
            if verdict.error is not None:
                ctx.metrics.on_verifier_error(self.name, verdict.error)
        ctx.metrics.on_model_items(self.name, len(results), 0)
        return results

    def info(self) -> dict[str, object]:
        """The entry's settings for /info (a python verifier's function path, no label; a
        code verifier's limits as it applies them; never a path of the server's machine such
        as bwrap)."""
        entry = self.spec.shown()
        entry.pop("bwrap", None)
        if isinstance(self.pool, CodeVerifier):
            options = self.pool.options
            entry.update(
                languages=list(options.languages),
                parallel_tests=options.workers,
                timeout_s=options.timeout_s,
            )
        elif getattr(self.spec, "sandbox", "none") == "none":
            entry.pop("memory_mb", None)  # a python function in the workers: no limit of its own
        return {"name": self.name, "kind": self.kind, "labels": self.labels, **entry}

    def close(self) -> None:
        """Stop the worker processes."""
        self.pool.close()


def code_options(spec: CodeVerifierEntry) -> CodeOptions:
    """A ``verifier: code`` entry's options, ``parallel_tests`` the machine's cores unless the
    entry gives it."""
    return CodeOptions(
        languages=tuple(spec.languages),
        score=spec.score,
        stop_on_failure=spec.stop_on_failure,
        test_timeout_s=spec.test_timeout_s,
        timeout_s=spec.timeout_s,
        memory_mb=spec.memory_mb,
        output_bytes=spec.output_bytes,
        float_tolerance=spec.float_tolerance,
        sandbox=spec.sandbox,
        bwrap=spec.bwrap,
        workers=spec.parallel_tests or default_workers(),
        on_error=spec.error_score,
    )


def _load_code(spec: CodeVerifierEntry) -> VerifierModel:
    try:
        verifier = CodeVerifier(code_options(spec), spec.name)
    except ValueError as exc:
        raise ModelLoadError(f"verifier {spec.name!r}: {exc}") from None
    verifier.start()
    o = verifier.options
    logger.info(
        "verifier %s (code: %s) runs up to %d test(s) at once, sandbox %s",
        spec.name,
        ", ".join(o.languages),
        o.workers,
        o.sandbox,
    )
    return VerifierModel(spec, verifier)


def load_verifier(spec: VerifierEntry) -> VerifierModel:
    """Start the worker pool of a ``kind: verifier`` entry (ModelLoadError when its function
    cannot be imported, or a code verifier's sandbox, or a sandboxed python function's,
    cannot be made)."""
    if isinstance(spec, CodeVerifierEntry):
        return _load_code(spec)
    assert isinstance(spec, PooledVerifier)
    python = isinstance(spec, PythonVerifier)
    sandboxed = python and spec.sandbox == "bwrap"
    pool: Verifier
    try:
        options = VerifierOptions(
            verifier=spec.verifier,  # type: ignore[arg-type]
            function=spec.function if python else None,
            pattern=spec.pattern if isinstance(spec, RegexVerifier) else None,
            workers=spec.workers,
            timeout_s=spec.timeout_s,
            on_error=spec.error_score,
            sandbox="bwrap" if sandboxed else "none",
            bwrap=spec.bwrap if sandboxed else None,
            memory_mb=spec.memory_mb if python else 1024,
            **rule_options(spec),
        )
        pool = (
            SandboxedFunction(options, spec.name) if sandboxed else VerifierPool(options, spec.name)
        )
    except ValueError as exc:
        raise ModelLoadError(f"verifier {spec.name!r}: {exc}") from None
    pool.start()
    if not sandboxed:  # a sandboxed function logs where it runs itself
        logger.info(
            "verifier %s (%s) running on %d worker process(es)",
            spec.name,
            spec.verifier,
            spec.workers,
        )
    return VerifierModel(spec, pool)
