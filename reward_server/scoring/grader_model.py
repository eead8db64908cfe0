"""An OpenAI grader served beside reward models: ``kind: grader`` entries of the models file.

A grader loads no model: its leaves that need none (``string_check``, ``text_similarity``,
``python``) run in a pool of worker processes, the verifiers' pool
(:class:`~reward_server.verifiers.VerifierPool` with ``verifier: grader``, its items in the
server's one fair queue), each worker holding its python graders' warm sandbox
(:mod:`reward_server.verifiers.graders`). Each item's ``sample`` is built from its response,
its ``item`` is its label. The reward is the grader's score (a ``multi`` grader's formula
over its graders' scores, each of which is in the answer's extras as ``sub:NAME``).

An item whose grade fails is not an error of the request: it is masked (``on_error: mask``)
or scores ``on_error`` (``0`` is OpenAI's behaviour), its reason one of OpenAI's error flags
(:data:`~reward_server.config.graders.GRADER_FLAGS`), counted in
``reward_server_verifier_errors_total``. The pool's own reasons are said in those words: a
worker cut at its time limit or dead (``timeout``, ``crash``, ``sandbox_error``) is a
``python_grader_server_error``, anything else an ``other_error``; ``deadline`` stays.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import TYPE_CHECKING

from reward_server.config.grader_entry import GraderEntry
from reward_server.config.graders import GRADER_FLAGS
from reward_server.config.tenants import current_tenant
from reward_server.errors import ModelLoadError, NotReadyError
from reward_server.scoring.deadline import current_deadline
from reward_server.scoring.item_result import ItemResult
from reward_server.scoring.items import Items, tasks
from reward_server.scoring.verifier_model import VerifierModel, _result
from reward_server.verifiers import VerifierOptions, VerifierPool
from reward_server.verifiers.graders.grading import model_leaves
from reward_server.verifiers.graders.python_sandbox import GraderLimits
from reward_server.verifiers.graders.similarity import default_embedding_model

if TYPE_CHECKING:
    from reward_server.verifiers import Verdict

__all__ = ["GRADER_REASONS", "GraderModel", "grader_reason", "load_grader"]

logger = logging.getLogger(__name__)

#: Why a grader's item can fail: OpenAI's flags, and the request's deadline.
GRADER_REASONS: tuple[str, ...] = (*GRADER_FLAGS, "deadline")
#: Seconds a worker has beyond a python grader's own limit before the pool cuts it.
POOL_GRACE_S = 10.0


def grader_reason(reason: str) -> str:
    """The flag of a pool's reason (see the module docstring)."""
    if reason in GRADER_FLAGS or reason == "deadline":
        return reason
    if reason in ("timeout", "crash", "sandbox_error"):
        return "python_grader_server_error"
    return "other_error"


class GraderModel(VerifierModel):
    """A ``kind: grader`` entry, served: its pool of worker processes."""

    kind = "grader"

    async def score(
        self, items: Items, *, truncate: bool, max_tokens: int | None, cache: bool = True
    ) -> list[ItemResult]:
        """Grade every item (never raises for a failing item: it scores ``on_error`` with
        its flag). No score cache."""
        ctx, admission = self._ctx, self._admission
        if ctx is None or admission is None or not self.running:
            raise NotReadyError("the grader is not running")
        work = await asyncio.get_running_loop().run_in_executor(
            ctx.tokenizer, tasks, items, ctx.policy_template
        )
        with admission.admitted(current_tenant.get(), len(work)):
            verdicts: list[Verdict] = await self.pool.verify(work, current_deadline.get())
        results = []
        for verdict in verdicts:
            result = _result(verdict)
            if verdict.error is not None:
                reason = grader_reason(verdict.error)
                result = dataclasses.replace(result, error=reason)
                ctx.metrics.on_verifier_error(self.name, reason)
            results.append(result)
        ctx.metrics.on_model_items(self.name, len(results), 0)
        return results

    def info(self) -> dict[str, object]:
        """The entry's settings for /info (the grader object included)."""
        entry = self.spec.shown()
        return {"name": self.name, "kind": self.kind, "labels": self.labels, **entry}


def grader_options(spec: GraderEntry, grader: dict[str, object] | None = None) -> VerifierOptions:
    """The pool options of a grader entry (``grader``: the object, default the entry's)."""
    limits = GraderLimits(
        timeout_s=spec.timeout_s,
        memory_mb=spec.memory_mb,
        disk_mb=spec.disk_mb,
        sandbox=spec.sandbox,
        bwrap=spec.bwrap,
    )
    assert spec.grader is not None
    return VerifierOptions(
        verifier="grader",
        workers=spec.workers,
        timeout_s=spec.timeout_s + POOL_GRACE_S,
        on_error=spec.error_score,
        grader=grader if grader is not None else spec.grader.model_dump(exclude_none=True),
        grader_limits=limits,
        embedding_model=spec.embedding_model or default_embedding_model(),
    )


def load_grader(spec: GraderEntry) -> GraderModel:
    """Start the worker pool of a ``kind: grader`` entry (ModelLoadError when its grader
    cannot run here: a python grader without a sandbox, a model grader)."""
    assert spec.grader is not None
    models = model_leaves(spec.grader)
    if models:
        names = ", ".join(f"{name} ({leaf.type})" for name, leaf in models.items())
        raise ModelLoadError(
            f"grader {spec.name!r}: model graders are not served yet ({names}); "
            "see the graders guide"
        )
    pool = VerifierPool(grader_options(spec), spec.name)
    pool.start()
    logger.info(
        "grader %s (%s) running on %d worker process(es)",
        spec.name,
        spec.grader.type,
        spec.workers,
    )
    return GraderModel(spec, pool)  # type: ignore[arg-type]
