"""An OpenAI grader served beside reward models: ``kind: grader`` entries of the models file.

A grader loads no model: its leaves that need none (``string_check``, ``text_similarity``,
``python``) run in a pool of worker processes, the verifiers' pool
(:class:`~reward_server.verifiers.VerifierPool` with ``verifier: grader``, its items in the
server's one fair queue), each worker holding its python graders' warm sandbox
(:mod:`reward_server.verifiers.graders`). Each item's ``sample`` is built from its response,
its ``item`` is its label. Its model leaves (``score_model``, ``label_model``) are then
answered by the judges they name, other entries of the file
(:mod:`reward_server.scoring.grader_judges`), for the items whose other leaves passed. The
reward is the grader's score (a ``multi`` grader's formula over its graders' scores, each of
which is in the answer's extras as ``sub:NAME``).

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
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from reward_server.config.grader_entry import GraderEntry
from reward_server.config.graders import GRADER_FLAGS
from reward_server.config.tenants import current_tenant
from reward_server.errors import ModelLoadError, NotReadyError
from reward_server.scoring.deadline import current_deadline
from reward_server.scoring.grader_judges import GraderJudges
from reward_server.scoring.item_result import ItemResult
from reward_server.scoring.items import Items, tasks
from reward_server.scoring.verifier_model import VerifierModel, _result
from reward_server.verifiers import Task, VerifierOptions, VerifierPool
from reward_server.verifiers.graders.check import SUB
from reward_server.verifiers.graders.errors import GradeFailure
from reward_server.verifiers.graders.grading import combine, model_leaves
from reward_server.verifiers.graders.python_sandbox import GraderLimits
from reward_server.verifiers.graders.similarity import default_embedding_model
from reward_server.verifiers.graders.templates import build_sample

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
    """A ``kind: grader`` entry, served: its pool of worker processes, and the judges of its
    model leaves (bound once every model of the file is loaded: :meth:`bind_models`)."""

    kind = "grader"
    judges: GraderJudges | None = None

    def bind_models(self, served: Mapping[str, Any]) -> None:
        """Find the judge of each model leaf among the served models (ModelLoadError naming
        the leaf whose model has none)."""
        spec = self.spec
        assert isinstance(spec, GraderEntry) and spec.grader is not None
        judges = GraderJudges(served, spec.models)
        for name, leaf in model_leaves(spec.grader).items():
            try:
                judges.check(leaf.model)
            except GradeFailure as failure:
                raise ModelLoadError(
                    f"grader {spec.name!r}: {name} ({leaf.type}): {failure.detail}"
                ) from None
        self.judges = judges

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
        results = [_result(verdict) for verdict in verdicts]
        spec = self.spec
        assert isinstance(spec, GraderEntry) and spec.grader is not None
        if self.judges is not None and model_leaves(spec.grader):
            results = await self._model_leaves(work, results, ctx.tokenizer)
        for i, result in enumerate(results):
            if result.error is not None:
                reason = grader_reason(result.error)
                results[i] = dataclasses.replace(result, error=reason)
                ctx.metrics.on_verifier_error(self.name, reason)
        ctx.metrics.on_model_items(self.name, len(results), 0)
        return results

    async def _model_leaves(
        self, work: list[Task], results: list[ItemResult], tokenizer: Any
    ) -> list[ItemResult]:
        """The items whose local leaves passed, with their model leaves graded by their
        judges and the reward combined."""
        spec = self.spec
        assert isinstance(spec, GraderEntry) and spec.grader is not None
        assert self.judges is not None
        leaves = model_leaves(spec.grader)
        pending = [i for i, result in enumerate(results) if result.error is None]
        pairs = [
            (build_sample(work[i].response, work[i].tool_calls), work[i].label) for i in pending
        ]
        graded = await asyncio.gather(
            *(self.judges.grade(leaf, pairs, tokenizer) for leaf in leaves.values())
        )
        out = list(results)
        for k, i in enumerate(pending):
            scores = {
                name.removeprefix(SUB): value
                for name, value in results[i].extras
                if name.startswith(SUB)
            }
            try:
                for name, grades in zip(leaves, graded, strict=True):
                    grade = grades.grades[k]
                    if isinstance(grade, GradeFailure):
                        raise grade
                    scores[name] = grade
                reward = combine(spec.grader, scores)
            except GradeFailure as failure:
                logger.warning("grader %s: item %d: %s", self.name, i, failure)
                out[i] = ItemResult(
                    score=spec.error_score,
                    num_tokens=0,
                    truncated=False,
                    error=failure.flag,
                    note=failure.detail[-300:],
                )
                continue
            extras = tuple(sorted((SUB + name, value) for name, value in scores.items()))
            out[i] = dataclasses.replace(results[i], score=reward, extras=extras)
        return out

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
    cannot run here: a python grader without a sandbox). Its model leaves' judges are found
    once every entry is loaded (:meth:`GraderModel.bind_models`)."""
    assert spec.grader is not None
    pool = VerifierPool(grader_options(spec), spec.name)
    pool.start()
    logger.info(
        "grader %s (%s) running on %d worker process(es)",
        spec.name,
        spec.grader.type,
        spec.workers,
    )
    return GraderModel(spec, pool)  # type: ignore[arg-type]
