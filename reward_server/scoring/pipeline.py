"""The path of one request's items through the served models: select the models, admit the
request, fan the items out to every selected model at once (each: render + tokenize ->
scheduler -> checked results), and combine the models' scores into the answer's.

No HTTP here: the routes (:mod:`reward_server.http.scoring`) watch for the client hanging
up, which cancels the pipeline's work, and count the items by endpoint.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from reward_server.config import AggregateName
from reward_server.config.tenants import current_tenant
from reward_server.errors import (
    ModelNotFoundError,
    NotReadyError,
    ScoringError,
    ServiceError,
    TooManyItemsError,
)
from reward_server.scoring.aggregate import Weighting, combine
from reward_server.scoring.code_runs import CodeRun, CodeRunResult
from reward_server.scoring.items import Items
from reward_server.scoring.registry import ModelRegistry
from reward_server.scoring.scored import Scored
from reward_server.scoring.served import ItemResult, ServedModel

logger = logging.getLogger("reward_server")

__all__ = ["ScoreOptions", "ScoringPipeline"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ScoreOptions:
    """How one request wants its items scored."""

    #: Cut items longer than a model's limit (None: the server's setting, --no-truncate).
    truncate: bool | None = None
    #: Cut each item to at most this many tokens (vLLM's ``truncate_prompt_tokens``).
    max_tokens: int | None = None
    #: Score with this one model only, by its name (None: every model, combined).
    model: str | None = None
    #: False: score every item afresh, neither reading nor filling the score cache.
    cache: bool = True


class ScoringPipeline:
    """Scores items with the registry's models; the first failure cancels the other models'
    rows and fails only this request."""

    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry
        self.settings = registry.settings
        self.metrics = registry.metrics

    @property
    def max_client_batch(self) -> int:
        """Items per request accepted (a request larger than the queue could never fit)."""
        return self.settings.effective_max_client_batch

    async def score(self, items: Items, options: ScoreOptions = ScoreOptions()) -> Scored:
        """Score ``items`` with every model (or the one ``options.model`` names) and combine
        them. Cancelling this drops the request's queued rows."""
        # Draining does not refuse work here: after SIGTERM uvicorn accepts no new
        # connections, so whatever still arrives was already in flight and is finished;
        # the schedulers refuse (503) only once they stop, after those requests are done.
        registry = self.registry
        if not registry.loaded:
            raise NotReadyError("the model is loading")
        models = registry.select(options.model)
        if items.count > self.max_client_batch:
            raise TooManyItemsError(
                f"{items.count} items in one request; the limit is {self.max_client_batch} "
                f"(split the request)"
            )
        truncate = (not self.settings.no_truncate) if options.truncate is None else options.truncate
        results = await _all_or_first_error(
            [_score_one(m, items, truncate, options.max_tokens, options.cache) for m in models]
        )
        scored = self._combine(models, results, selected=options.model is not None)
        self._count(scored)
        return scored

    async def run_code(self, run: CodeRun) -> CodeRunResult:
        """Run one program in the code verifier's sandbox (``/run_code``).
        ModelNotFoundError (404) when no code verifier is served."""
        if not self.registry.loaded:
            raise NotReadyError("the model is loading")
        runs = self.registry.code_runs
        if runs is None:
            raise ModelNotFoundError(
                "this server runs no programs: /run_code needs a 'kind: verifier, verifier: "
                "code' entry in its models file (its sandbox, languages and limits serve it)"
            )
        return await runs.run(run)

    def _combine(
        self, models: Sequence[ServedModel], results: Sequence[list[ItemResult]], *, selected: bool
    ) -> Scored:
        """The answer's scores: one model's own, or every model's combined."""
        by_name = {model.name: rs for model, rs in zip(models, results, strict=True)}
        labels = {model.name: model.labels for model in models}
        aggregate = self.registry.aggregate
        if selected or (len(models) == 1 and not self.registry.from_file):
            (only,) = results
            name = models[0].name
            return Scored(name, [r.score for r in only], by_name, labels)
        scores = _aggregate(models, by_name, aggregate)
        kinds = {model.kind for model in models}
        outcome = None
        if "process" in kinds and "sequence" in kinds:
            outcome = _aggregate([s for s in models if s.kind == "sequence"], by_name, aggregate)
        return Scored(self.registry.name, scores, by_name, labels, outcome)

    def _count(self, scored: Scored) -> None:
        """The server-wide and the tenant's counters of one scored request (the items by
        endpoint are the HTTP layer's)."""
        n_items = len(scored.scores)
        tokens = sum(r.num_tokens for rs in scored.results.values() for r in rs)
        self.metrics.tokens.inc(tokens)
        self.metrics.truncated.inc(sum(scored.truncated))
        # The request's tenant, set by the auth dependency in this very task.
        self.metrics.on_tenant_items(current_tenant.get().name, n_items, tokens)


async def _score_one(
    model: ServedModel, items: Items, truncate: bool, max_tokens: int | None, cache: bool
) -> list[ItemResult]:
    """One model's results; a failure that is not in the error table is a ScoringError."""
    try:
        return await model.score(items, truncate=truncate, max_tokens=max_tokens, cache=cache)
    except ServiceError:  # these answer through the error table at the edge
        raise
    except Exception as exc:
        logger.error("scoring failed (%d items, model %s)", items.count, model.name, exc_info=exc)
        raise ScoringError(
            "the reward model failed on this request; the error is in the server log"
        ) from exc


def _aggregate(
    models: Sequence[ServedModel], by_name: Mapping[str, list[ItemResult]], aggregate: AggregateName
) -> list[float]:
    """The combined score of ``models`` per item (:func:`~reward_server.scoring.aggregate.combine`)."""
    weighting = {}
    for model in models:
        norm = model.spec.normalize
        mean, std = (0.0, 1.0) if norm is None else (norm.mean, norm.std)
        weighting[model.name] = Weighting(weight=model.spec.weight, mean=mean, std=std)
    scores = {model.name: [r.score for r in by_name[model.name]] for model in models}
    return combine(scores, weighting, aggregate)


async def _all_or_first_error(work: Sequence[Awaitable[T]]) -> list[T]:
    """Await every one of ``work`` concurrently; at the first failure cancel the rest and
    raise it (cancelling this cancels them all)."""
    if len(work) == 1:
        return [await work[0]]
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        pending = [t for t in tasks if not t.done()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    return [task.result() for task in tasks]
