"""Graders brought by a request (OpenAI's ``POST /v1/fine_tuning/alpha/graders/run``):
:class:`GraderRuns` grades one sample with the request's own grader object.

The work runs in the graders API's own worker pool (the verifiers' pool with ``verifier:
grader``, each task carrying its grader; its items in the server's one fair queue, under
the request's tenant), started at the first call, so a server that never gets one starts no
process for it. Each worker keeps one warm sandbox for python graders (OpenAI's limits:
:data:`API_LIMITS`). A failed grade is not an error of the request: the answer carries
reward 0 and the flag, as OpenAI's does.

Model graders (``score_model``, ``label_model``) are answered by the served judge their
``model`` names (a ``kind: judge`` entry in ``mode: generate`` of the models file,
:mod:`reward_server.scoring.grader_judges`); a model no entry serves fails the grade with
``model_grader_server_error``. Their tokens are counted in ``token_usage`` and by model.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from reward_server.config.graders import GRADER_FLAGS, GraderObject, MultiGrader
from reward_server.config.tenants import current_tenant
from reward_server.scheduling.fairness import Admission, TokenBuckets
from reward_server.scoring.grader_judges import GraderJudges
from reward_server.scoring.grader_model import grader_reason
from reward_server.verifiers import Task, VerifierOptions, VerifierPool
from reward_server.verifiers.graders.check import SUB
from reward_server.verifiers.graders.errors import GradeFailure
from reward_server.verifiers.graders.grading import combine, local_leaves, model_leaves
from reward_server.verifiers.graders.python_sandbox import GraderLimits
from reward_server.verifiers.graders.similarity import default_embedding_model
from reward_server.verifiers.graders.templates import build_sample

__all__ = ["API_LIMITS", "GraderRun", "GraderRuns"]

logger = logging.getLogger(__name__)

#: A request's python grader's limits: OpenAI's (2 minutes, 2 GiB, 1 GiB of disk).
API_LIMITS = GraderLimits(timeout_s=120.0)
#: Seconds a worker has beyond the python limit before the pool cuts it.
_GRACE_S = 10.0


@dataclass(frozen=True)
class GraderRun:
    """One sample's grade: the reward (0 when it failed), each leaf's score, the flags raised
    (with their details), the seconds it took and the judges' tokens by model."""

    reward: float
    scores: dict[str, float]
    errors: dict[str, str] = field(default_factory=dict)
    execution_time: float = 0.0
    tokens: dict[str, int] = field(default_factory=dict)


class GraderRuns:
    """Grades samples with request-given graders (see the module docstring)."""

    def __init__(
        self,
        max_queue: int,
        workers: int = 1,
        served: Callable[[], Mapping[str, Any]] | None = None,
        tokenizer: Executor | None = None,
        buckets: TokenBuckets | None = None,
    ) -> None:
        """``served``: the registry's served models by name, read at each call (the judges
        of model graders); ``tokenizer``: the registry's tokenizer thread (a judge's messages
        are rendered and tokenized there); ``buckets``: the tenants' rate buckets of the
        app (admission applies them)."""
        self.workers = workers
        self._served = served or dict
        self._tokenizer = tokenizer
        self._admission = Admission(max_queue, buckets)
        self._pool: VerifierPool | None = None
        self._starting = asyncio.Lock()

    async def _started(self) -> VerifierPool:
        async with self._starting:
            if self._pool is None:
                options = VerifierOptions(
                    verifier="grader",
                    workers=self.workers,
                    timeout_s=API_LIMITS.timeout_s + _GRACE_S,
                    grader_limits=API_LIMITS,
                    embedding_model=default_embedding_model(),
                )
                pool = VerifierPool(options, "graders-api")
                await asyncio.to_thread(pool.start)
                self._pool = pool
                logger.info("the graders API's pool started (%d worker(s))", self.workers)
        return self._pool

    async def run(
        self, grader: GraderObject, model_sample: str, item: Any, deadline: float | None = None
    ) -> GraderRun:
        """The grade of ``model_sample`` (the response's text) for ``item``."""
        began = time.monotonic()
        scores: dict[str, float] = {}
        if local_leaves(grader):
            pool = await self._started()
            task = Task(
                prompt=None,
                response=model_sample,
                label=item,
                grader=grader.model_dump(exclude_none=True),
            )
            with self._admission.admitted(current_tenant.get(), 1):
                (verdict,) = await pool.verify([task], deadline)
            if verdict.error is not None:
                flag = grader_reason(verdict.error)
                flag = flag if flag in GRADER_FLAGS else "other_error"
                detail = verdict.note or verdict.error
                return GraderRun(0.0, {}, {flag: detail}, time.monotonic() - began)
            scores = {
                k.removeprefix(SUB): v for k, v in verdict.extras.items() if k.startswith(SUB)
            }
        judges = GraderJudges(self._served())
        sample = build_sample(model_sample)
        tokens: dict[str, int] = {}
        try:
            for name, leaf in model_leaves(grader).items():
                graded = await judges.grade(leaf, [(sample, item)], self._tokenizer)
                tokens[graded.model] = tokens.get(graded.model, 0) + graded.tokens
                (grade,) = graded.grades
                if isinstance(grade, GradeFailure):
                    raise grade
                scores[name] = grade
            reward = combine(grader, scores)
        except GradeFailure as failure:
            return GraderRun(
                0.0, {}, {failure.flag: failure.detail}, time.monotonic() - began, tokens
            )
        return GraderRun(reward, scores, {}, time.monotonic() - began, tokens)

    def sub_rewards(self, grader: GraderObject, run: GraderRun) -> dict[str, float]:
        """A multi grader's graders' scores by their keys (none for another grader)."""
        return dict(run.scores) if isinstance(grader, MultiGrader) else {}

    def close(self) -> None:
        """Stop the pool's workers (idempotent)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None
