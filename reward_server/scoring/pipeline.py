"""The path of one request's items through the served models: select the models, admit the
request, fan the items out to every selected model at once (each: render + tokenize ->
scheduler -> checked results), and combine the models' scores into the answer's.

Masks: an item a model failed on (its result has an ``error``) is masked when the model's
entry says ``on_error: mask`` (the default of verifiers, judges and remotes); with a number
it scores that number instead. In a combined score, an item masked by any model with a
non-zero weight is masked (a weight-0 model's term is 0 whatever its score).

Deadlines: a request's deadline (``ScoreOptions.deadline``) bounds its work. Past it, no
model is asked; before it, the models run with the deadline in
:data:`~reward_server.scoring.deadline.current_deadline` (a verifier settles what it can by
then and masks the rest itself); at the deadline plus :data:`DEADLINE_GRACE_S` the models
still running are cancelled (their queued rows dropped before reaching the model) and their
items masked ``deadline``. Items masked for a deadline are masked whatever ``on_error`` says.

No HTTP here: the routes (:mod:`reward_server.http.scoring`) watch for the client hanging
up, which cancels the pipeline's work, and count the items by endpoint.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from reward_server.config import AggregateName, ModelSpec
from reward_server.config.tenants import current_tenant
from reward_server.errors import (
    GroupsError,
    ModelNotFoundError,
    NotReadyError,
    ScoringError,
    ServiceError,
    TooManyItemsError,
    UnrenderableError,
)
from reward_server.scoring.aggregate import Weighting, combine
from reward_server.scoring.code_runs import CodeRun, CodeRunResult
from reward_server.scoring.deadline import current_deadline
from reward_server.scoring.groups import Groups, current_groups, normalize_in_groups
from reward_server.scoring.item_result import UNCLOSED_REASONING, ItemResult
from reward_server.scoring.items import Items, response_chars, without_reasoning
from reward_server.scoring.registry import ModelRegistry
from reward_server.scoring.scored import Scored
from reward_server.scoring.served import ServedModel

logger = logging.getLogger("reward_server")

__all__ = ["ScoreOptions", "ScoringPipeline"]

T = TypeVar("T")

#: Seconds past a request's deadline that the pipeline waits for a model that settles by the
#: deadline itself (a verifier killing its workers) before cancelling it outright.
DEADLINE_GRACE_S = 0.5


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
    #: When the answer is due, a ``time.monotonic()`` instant (None: no deadline).
    deadline: float | None = None
    #: Which items form a group (checked: :func:`~reward_server.scoring.groups.check_groups`).
    groups: Groups | None = None


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
        if options.groups is None:
            grouped = [m.name for m in models if _needs_groups(m)]
            if grouped:
                raise GroupsError(
                    f"{', '.join(grouped)} score(s) within groups: send groups (lists of the "
                    "indices of the items that share a prompt)"
                )
        truncate = (not self.settings.no_truncate) if options.truncate is None else options.truncate
        deadline = options.deadline
        if deadline is not None and time.monotonic() >= deadline:
            done: list[list[ItemResult] | None] = [None] * len(models)  # no work starts
        else:
            token = current_deadline.set(deadline)  # the models' tasks copy it
            groups_token = current_groups.set(options.groups)
            views = _Views(items)
            try:
                done = await _all_or_first_error(
                    [
                        _score_one(m, views.of(m), truncate, options.max_tokens, options.cache)
                        for m in models
                    ],
                    None if deadline is None else deadline + DEADLINE_GRACE_S,
                )
            finally:
                current_groups.reset(groups_token)
                current_deadline.reset(token)
        results = [self._masked(m, rs, items.count) for m, rs in zip(models, done, strict=True)]
        scored = self._combine(
            models, results, selected=options.model is not None, groups=options.groups
        )
        self._count(scored)
        self._watch(items, models, scored)
        return scored

    def _watch(self, items: Items, models: Sequence[ServedModel], scored: Scored) -> None:
        """Add the request's rewards to the reward signals' windows
        (:mod:`~reward_server.scoring.signals`): each model's, the combined reward's when it
        is not one model's own, and the agreement of the models scored together."""
        signals = self.metrics.signals
        if signals.window <= 0:
            return
        tenant = current_tenant.get().name
        chars = response_chars(items)
        components = scored.components()
        for name, results in scored.results.items():
            failed = [r.error is not None for r in results]
            signals.record(tenant, name, components[name], failed, chars)
            judged = [r.failed_categories for r in results if r.failed_categories]
            if judged:
                signals.record_rubric(tenant, name, judged)
        if scored.name not in scored.results:
            # Failed: any model failed on the item (masked, or filled with its on_error).
            failed = [
                any(r.error is not None for r in rs)
                for rs in zip(*scored.results.values(), strict=True)
            ]
            signals.record(tenant, scored.name, scored.scores, failed, chars)
        if len(models) > 1:
            signals.record_agreement(tenant, components)

    def _masked(
        self, model: ServedModel, results: list[ItemResult] | None, count: int
    ) -> list[ItemResult]:
        """One model's results with its failed items masked where its entry masks (every
        item when the deadline cut it off: ``results`` None), the masks counted."""
        if results is None:
            cut = ItemResult(
                model.spec.error_score, 0, truncated=False, error="deadline", masked=True
            )
            results = [cut] * count
        else:
            results = [
                dataclasses.replace(r, masked=True) if _masks(model.spec, r.error) else r
                for r in results
            ]
        for r in results:
            if r.masked:
                self.metrics.on_masked(model.name, r.error or "error")
        return results

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
        self,
        models: Sequence[ServedModel],
        results: Sequence[list[ItemResult]],
        *,
        selected: bool,
        groups: Groups | None,
    ) -> Scored:
        """The answer's scores: one model's own, or every model's combined."""
        by_name = {model.name: rs for model, rs in zip(models, results, strict=True)}
        labels = {model.name: model.labels for model in models}
        aggregate = self.registry.aggregate
        if selected or (len(models) == 1 and not self.registry.from_file):
            (only,) = results
            name = models[0].name
            reasons = tuple(r.error if r.masked else None for r in only)
            scores = [None if r.masked else r.score for r in only]
            return Scored(name, scores, by_name, labels, reasons=reasons)
        combined, reasons = _aggregate(models, by_name, aggregate, groups)
        kinds = {model.kind for model in models}
        outcome = None
        if "process" in kinds and "sequence" in kinds:
            sequence = [s for s in models if s.kind == "sequence"]
            outcome, _ = _aggregate(sequence, by_name, aggregate, groups)
        return Scored(self.registry.name, combined, by_name, labels, outcome, tuple(reasons))

    def _count(self, scored: Scored) -> None:
        """The server-wide and the tenant's counters of one scored request (the items by
        endpoint are the HTTP layer's)."""
        n_items = len(scored.scores)
        tokens = sum(r.num_tokens for rs in scored.results.values() for r in rs)
        self.metrics.tokens.inc(tokens)
        self.metrics.truncated.inc(sum(scored.truncated))
        # The request's tenant, set by the auth dependency in this very task.
        self.metrics.on_tenant_items(current_tenant.get().name, n_items, tokens)


def _masks(spec: ModelSpec, error: str | None) -> bool:
    """Whether a result that failed with ``error`` is masked by the entry ``spec``."""
    if error is None:
        return False
    if error == UNCLOSED_REASONING:
        return spec.unclosed_reasoning == "mask"
    return spec.masks or error == "deadline"


class _Views:
    """A request's items as each model reads them: with the thinking removed (once per set
    of tags) or kept, and which items' responses never closed their thinking."""

    def __init__(self, items: Items) -> None:
        self.items = items
        self._stripped: dict[tuple[str, str], tuple[Items, list[bool]]] = {}

    def of(self, model: ServedModel) -> tuple[Items, list[bool] | None]:
        """``model``'s view: its items, and per item whether it is unclosed (None: keeps)."""
        spec = model.spec
        if spec.reasoning_mode == "keep":
            return self.items, None
        tags = spec.reasoning_tags
        if tags not in self._stripped:
            self._stripped[tags] = without_reasoning(self.items, tags)
        return self._stripped[tags]


async def _score_one(
    model: ServedModel,
    view: tuple[Items, list[bool] | None],
    truncate: bool,
    max_tokens: int | None,
    cache: bool,
) -> list[ItemResult]:
    """One model's results on its view of the items (an item whose thinking never closed
    fails with ``unclosed_reasoning``: its score is the entry's number, else masked); a
    failure that is not in the error table is a ScoringError."""
    items, unclosed = view
    try:
        results = await model.score(items, truncate=truncate, max_tokens=max_tokens, cache=cache)
    except UnrenderableError as exc:
        raise UnrenderableError(f"model {model.name!r}: {exc}") from None
    except ServiceError:  # these answer through the error table at the edge
        raise
    except Exception as exc:
        logger.error("scoring failed (%d items, model %s)", items.count, model.name, exc_info=exc)
        raise ScoringError(
            "the reward model failed on this request; the error is in the server log"
        ) from exc
    if unclosed is None or not any(unclosed):
        return results
    given = model.spec.unclosed_reasoning
    score = 0.0 if isinstance(given, str) else float(given)
    failed = {"score": score, "error": UNCLOSED_REASONING, "note": None}
    return [
        dataclasses.replace(r, **failed) if cut else r
        for r, cut in zip(results, unclosed, strict=True)
    ]


def _needs_groups(model: ServedModel) -> bool:
    """Whether ``model`` scores within groups (a pairwise judge, group normalisation)."""
    return model.spec.scores_in_groups


def _aggregate(
    models: Sequence[ServedModel],
    by_name: Mapping[str, list[ItemResult]],
    aggregate: AggregateName,
    groups: Groups | None,
) -> tuple[list[float | None], list[str | None]]:
    """The combined score of ``models`` per item
    (:func:`~reward_server.scoring.aggregate.combine`), None where a model with a non-zero
    weight masked the item; and per item the first such model's reason. A model with
    ``normalize: group``/``group_rank`` has its scores normalised within ``groups`` first."""
    weighting = {}
    scores: dict[str, list[float]] = {}
    for model in models:
        norm = model.spec.normalize
        results = by_name[model.name]
        # A masked result still holds a finite score (the entry's on_error number, or 0.0),
        # so the arithmetic runs on every item; a weight-0 model's term is 0 whatever it holds.
        scores[model.name] = [r.score for r in results]
        mean, std = 0.0, 1.0
        if isinstance(norm, str):
            masked = [r.masked for r in results]
            scores[model.name] = normalize_in_groups(scores[model.name], masked, groups, norm)
        elif norm is not None:
            mean, std = norm.mean, norm.std
        weighting[model.name] = Weighting(weight=model.spec.weight, mean=mean, std=std)
    combined: list[float | None] = list(combine(scores, weighting, aggregate))
    reasons: list[str | None] = [None] * len(combined)
    for model in models:
        if model.spec.weight == 0:
            continue
        for i, r in enumerate(by_name[model.name]):
            if r.masked and reasons[i] is None:
                reasons[i] = r.error or "error"
                combined[i] = None
    return combined, reasons


async def _all_or_first_error(work: Sequence[Awaitable[T]], cutoff: float | None) -> list[T | None]:
    """Await every one of ``work`` concurrently; at the first failure cancel the rest and
    raise it (cancelling this cancels them all). At ``cutoff`` (``time.monotonic()``; None:
    never) the ones still running are cancelled: None in their place."""
    if len(work) == 1 and cutoff is None:
        return [await work[0]]
    tasks = [asyncio.ensure_future(w) for w in work]
    timeout = None if cutoff is None else max(0.0, cutoff - time.monotonic())
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        pending = [t for t in tasks if not t.done()]
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    return [None if task.cancelled() else task.result() for task in tasks]
