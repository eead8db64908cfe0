"""Served models: one per reward model the server serves, each turning a request's items
into per-item results with its own scorer, rendering and scheduler (no torch, no HTTP).

A served model renders and tokenizes on the registry's tokenizer thread (reading the
request's plain :mod:`~reward_server.scoring.items`), queues the token-id rows on its own
scheduler (:func:`~reward_server.scheduling.make_scheduler`: the micro-batcher whose passes
run on the registry's one compute thread, or admission around an engine that batches by
itself) and gives back one
:class:`ItemResult` per item. Rows whose exact token ids the score cache holds, that another
request is scoring, or that repeat an earlier row of the request are not queued again
(:mod:`reward_server.scoring.score_cache`). The scoring pipeline fans a request out to the models and
combines their results (:mod:`reward_server.scoring.aggregate`).

Nouns: an engine loads a :class:`~reward_server.engines.Scorer` (or a process model's
:class:`~reward_server.text.steps.StepScorer`) from :class:`~reward_server.config.LoadOptions`;
the models file's entry (:class:`~reward_server.config.ModelSpec`) says how to serve it; a
:class:`ServedModel` is the two together, started. A kind of reward model (``sequence``,
``process``) is a kind of served model: :class:`BatchedModel` holds what they share, a
subclass says how items become rows (:meth:`BatchedModel.prepare`), which pass runs them
(:meth:`BatchedModel.batch_function`) and how rows become results
(:meth:`BatchedModel.finish`).
"""

from __future__ import annotations

import abc
import asyncio
import functools
import math
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

from reward_server.config import LoadOptions
from reward_server.config.entries import ProcessEntry
from reward_server.config.models_file import ModelSpec
from reward_server.engines import (
    MultiLabel,
    Scorer,
    load_process_scorer,
    load_scorer,
)
from reward_server.errors import (
    EmptyTextError,
    ModelLoadError,
    NotReadyError,
)
from reward_server.scheduling import (
    BatchLimits,
    BatchRunner,
    RowRunner,
    Scheduler,
    TokenBuckets,
    make_scheduler,
)
from reward_server.scoring.aggregate import label_weights, own_score
from reward_server.scoring.item_result import ItemResult
from reward_server.scoring.items import (
    Conversations,
    Items,
    Pairs,
    conversations,
    judge_prompts,
    render,
)
from reward_server.scoring.metrics import ModelState
from reward_server.scoring.score_cache import MISS, ScoreCache, caches_kind, model_identity
from reward_server.text.judge_prompt import JudgePrompt, fit_prompt
from reward_server.text.messages import ToolRendering
from reward_server.text.steps import StepEncoded, StepOptions, StepScorer, step_results

if TYPE_CHECKING:
    from reward_server.config import ServerSettings
    from reward_server.scoring.metrics import Metrics
    from reward_server.text.policy_template import PolicyTemplate

__all__ = [
    "BatchedModel",
    "ProcessModel",
    "SequenceModel",
    "ServedModel",
    "ServingContext",
    "Tokenized",
    "load_served_model",
    "served_model_for",
]


class Tokenized(Protocol):
    """An item ready for a scheduler (:class:`~reward_server.text.rendering.Encoded` is one)."""

    @property
    def input_ids(self) -> list[int]: ...

    @property
    def num_tokens(self) -> int: ...

    @property
    def truncated(self) -> bool: ...


@dataclass(frozen=True, slots=True)
class ServingContext:
    """What the registry lends every served model: its two threads, its settings, its
    metrics, the policy's chat template (``--policy-tokenizer``), the score cache that every
    served model shares (None: no cache) and the tenants' rate buckets. The registry makes one
    context when the app starts, so the buckets are the app's: shared by its models' schedulers,
    never by another app in the process."""

    compute: Executor
    tokenizer: Executor
    settings: ServerSettings
    metrics: Metrics
    policy_template: PolicyTemplate | None = None
    score_cache: ScoreCache | None = None
    buckets: TokenBuckets = field(default_factory=TokenBuckets)


class ServedModel(Protocol):
    """One served reward model (or verifier) as the registry and pipeline use it."""

    #: The models-file entry (for a plain --model server, one made from the flags).
    spec: ModelSpec
    #: The engine's loaded model; None for a verifier, which loads none.
    scorer: Scorer | None
    kind: str
    #: The padded-token budget of one pass, known once started.
    max_batch_tokens: int | None
    scheduler: Scheduler | None

    @property
    def name(self) -> str:
        """The model's name in answers (the entry's name)."""
        ...

    @property
    def labels(self) -> list[str]:
        """Names of the values in each result's ``logits``."""
        ...

    @property
    def running(self) -> bool:
        """True once started, until stop() begins."""
        ...

    @property
    def queued(self) -> int:
        """Rows admitted and not yet started."""
        ...

    async def start(self, ctx: ServingContext) -> None:
        """Start the model's scheduler on the running event loop."""
        ...

    def snapshot(self) -> ModelState | None:
        """Its state for /metrics at a scrape; None until started."""
        ...

    async def stop(self, *, drain: bool = True) -> None:
        """Refuse new work; finish (drain) or fail what is queued."""
        ...

    async def score(
        self, items: Items, *, truncate: bool, max_tokens: int | None, cache: bool = True
    ) -> list[ItemResult]:
        """One result per item, in order, all or nothing (cancelling drops queued rows).
        ``cache`` False: no score cache for this request (models that use one)."""
        ...

    def info(self) -> dict[str, object]:
        """The model's entry of GET /info's ``models``."""
        ...

    def close(self) -> None:
        """Release what it holds (the model's memory, a verifier's processes)."""
        ...


class BatchedModel(abc.ABC):
    """A served model whose rows go through a scheduler: the micro-batcher on the registry's
    compute thread, or admission around the engine when it batches by itself."""

    kind: ClassVar[str]

    def __init__(self, spec: ModelSpec, scorer: Scorer) -> None:
        self.spec = spec
        self.scorer = scorer
        self.scheduler: Scheduler | None = None
        self.max_batch_tokens: int | None = None
        self._ctx: ServingContext | None = None
        #: The digest of this model's identity, the prefix of its score cache keys; None
        #: when it is not cached (no cache, or a kind that is not: see caches_kind).
        self._cache_id: bytes | None = None

    # ------------------------------------------------------------------ what a kind says

    @abc.abstractmethod
    def prepare(
        self, items: Items, *, truncate: bool, max_tokens: int | None
    ) -> Sequence[Tokenized]:
        """Render and tokenize the items (on the tokenizer thread); one row per item."""

    @abc.abstractmethod
    def batch_function(
        self,
    ) -> tuple[Callable[[list[Sequence[int]]], Sequence[Any]], Callable[[Any], Any]]:
        """The pass the micro-batcher runs on the compute thread (one value per row), and
        the check/conversion of each row's value."""

    @abc.abstractmethod
    def finish(self, prepared: Sequence[Tokenized], values: Sequence[Any]) -> list[ItemResult]:
        """Per-item results from the prepared items and their rows' values, in order."""

    # ------------------------------------------------------------------ shared

    def _context(self) -> ServingContext:
        if self._ctx is None:
            raise NotReadyError("the model is loading")
        return self._ctx

    def tool_rendering(self) -> ToolRendering:
        """What the model does with tool calls and tools its template does not show: its
        entry's ``tool_rendering``, else the server's ``--tool-rendering``."""
        given = self.spec.tool_rendering or self._context().settings.tool_rendering
        return cast("ToolRendering", given)

    def fitted_prompts(self, items: Items, reads: frozenset[str]) -> list[JudgePrompt]:
        """Each item as a judge's template that reads ``reads`` sees it (its policy's
        template applied, what the template does not show rendered as the model's
        ``tool_rendering`` says)."""
        rendering = self.tool_rendering()
        policy_template = self._context().policy_template
        return [fit_prompt(p, reads, rendering) for p in judge_prompts(items, policy_template)]

    @property
    def name(self) -> str:
        """The model's name in answers."""
        return self.spec.name

    @property
    def labels(self) -> list[str]:
        """Names of the values in each result's ``logits``."""
        return ["LABEL_0"]

    @property
    def running(self) -> bool:
        """True once started, until stop() begins."""
        return self.scheduler is not None and self.scheduler.running

    @property
    def queued(self) -> int:
        """Rows admitted and not yet started."""
        return 0 if self.scheduler is None else self.scheduler.queued

    async def start(self, ctx: ServingContext) -> None:
        """Start the scheduler of the engine (:func:`~reward_server.scheduling.make_scheduler`):
        admission around a :class:`~reward_server.scheduling.RowRunner`, else the micro-batcher
        over :meth:`batch_function`."""
        s = ctx.settings
        self._ctx = ctx
        self.max_batch_tokens = s.batch_token_budget(self.scorer.device, self.scorer.max_length)
        limits = BatchLimits(
            max_batch_tokens=self.max_batch_tokens,
            max_batch_size=s.max_batch_size,
            max_wait_ms=s.max_wait_ms,
            max_queue=s.max_queue,
        )
        observer = ctx.metrics.model_observer(self.name)
        engine: RowRunner | BatchRunner
        if isinstance(self.scorer, RowRunner):
            engine, convert = self.scorer, float  # it batches by itself: its values as given
        else:
            engine, convert = self.batch_function()
        scheduler = make_scheduler(
            engine,
            limits,
            observer=observer,
            buckets=ctx.buckets,
            executor=ctx.compute,
            convert=convert,
        )
        self.scheduler = scheduler
        await scheduler.start()
        cache = ctx.score_cache
        if cache is not None and cache.enabled and caches_kind(self.spec):
            engine = f"{type(self.scorer).__module__}.{type(self.scorer).__qualname__}"
            identity = model_identity(self.spec, self.scorer.info(), engine)
            self._cache_id = identity.digest()

    def snapshot(self) -> ModelState | None:
        """Its queue for /metrics at a scrape; None until started."""
        if self._ctx is None:
            return None
        by_tenant = {} if self.scheduler is None else self.scheduler.queued_by_tenant()
        return ModelState(self.name, self.queued, tenants_queued=tuple(sorted(by_tenant.items())))

    async def stop(self, *, drain: bool = True) -> None:
        """Refuse new work; finish (drain) or fail what is queued."""
        if self.scheduler is not None:
            await self.scheduler.stop(drain=drain)

    async def score(
        self, items: Items, *, truncate: bool, max_tokens: int | None, cache: bool = True
    ) -> list[ItemResult]:
        """Prepare on the tokenizer thread, queue the rows (those the score cache does not
        hold, once each), turn their values into results."""
        ctx, scheduler = self._ctx, self.scheduler
        if ctx is None or scheduler is None:
            raise NotReadyError("the model is loading")
        prepare = functools.partial(self.prepare, items, truncate=truncate, max_tokens=max_tokens)
        prepared = await asyncio.get_running_loop().run_in_executor(ctx.tokenizer, prepare)
        if len(prepared) != items.count:
            raise RuntimeError(f"{len(prepared)} rows prepared for {items.count} items")
        for i, item in enumerate(prepared):
            if item.num_tokens == 0:
                raise EmptyTextError(f"item {i} encodes to no tokens; nothing to score")
        results = await self._row_results(prepared, ctx, scheduler, cache=cache)
        ctx.metrics.on_model_items(self.name, len(results), sum(r.num_tokens for r in results))
        return results

    async def _row_results(
        self,
        prepared: Sequence[Tokenized],
        ctx: ServingContext,
        scheduler: Scheduler,
        *,
        cache: bool,
    ) -> list[ItemResult]:
        """One result per prepared row (none empty): through the score cache where the
        model has one and the request lets it answer, else from one pass of each row."""
        rows = [item.input_ids for item in prepared]
        if not rows:
            return []
        if cache and ctx.score_cache is not None and self._cache_id is not None:
            return await self._score_cached(prepared, rows, ctx, scheduler, ctx.score_cache)
        # One value per row: the scheduler's contract (scheduling.check_count).
        return self.finish(prepared, await scheduler.submit(rows))

    async def _score_cached(
        self,
        prepared: Sequence[Tokenized],
        rows: list[list[int]],
        ctx: ServingContext,
        scheduler: Scheduler,
        cache: ScoreCache,
    ) -> list[ItemResult]:
        """Results with the score cache. Each row's value comes from the cache; else from the
        pass another request already has in flight for the same key; else from one pass of
        the first identical row of this request. The values this request computes are
        handed to the requests waiting on them as soon as its pass returns, and kept in the
        cache once its results are made (a value that fails the model's checks is never
        kept)."""
        assert self._cache_id is not None
        keys = [cache.key(self._cache_id, ids) for ids in rows]
        values: list[Any] = [None] * len(rows)
        todo: dict[bytes, int] = {}  # key -> its row's index in unique
        unique: list[list[int]] = []  # the rows this request scores, each once
        waits: dict[bytes, asyncio.Future[Any]] = {}  # keys another request is scoring
        row_of: dict[bytes, list[int]] = {}  # their rows, in case that request fails
        hits = 0
        for i, key in enumerate(keys):
            value = cache.get(key)
            if value is not MISS:
                values[i] = value
                hits += 1
            elif key in todo or key in waits:
                continue  # a duplicate: answered by the first of its kind
            elif (flight := cache.in_flight(key)) is not None:
                waits[key] = flight
                row_of[key] = rows[i]
            else:
                todo[key] = len(unique)
                unique.append(rows[i])
        fresh = await self._submit_owned(scheduler, cache, unique, list(todo))
        got = {key: fresh[j] for key, j in todo.items()}
        if waits:
            # asyncio.wait, not await: a cancelled waiter must not cancel the owner's future.
            await asyncio.wait(waits.values())
            got.update((key, flight.result()) for key, flight in waits.items())
            # The owner failed or was cancelled: score those rows here.
            lost = [key for key, flight in waits.items() if flight.result() is MISS]
            if lost:
                again = await scheduler.submit([row_of[key] for key in lost])
                got.update(zip(lost, again, strict=True))
                unique += [row_of[key] for key in lost]
        for i, key in enumerate(keys):
            if values[i] is None:
                values[i] = got[key]
        results = self.finish(prepared, values)
        for key in todo:
            cache.put(key, got[key])
        misses = len(unique)  # rows this request ran; the others were answered by twins
        ctx.metrics.on_score_cache(self.name, hits, misses, len(rows) - hits - misses)
        return results

    @staticmethod
    async def _submit_owned(
        scheduler: Scheduler, cache: ScoreCache, rows: list[list[int]], keys: list[bytes]
    ) -> list[Any]:
        """Score ``rows`` (of ``keys``), marked in flight meanwhile: the values go to the
        requests waiting on those keys as soon as the pass returns (MISS when it fails or is
        cancelled: they score the rows themselves). Resolved before this request waits on
        anyone else's, so two requests never wait on each other."""
        for key in keys:
            cache.begin(key)
        fresh: list[Any] | None = None
        try:
            fresh = list(await scheduler.submit(rows)) if rows else []
        finally:
            for j, key in enumerate(keys):
                cache.end(key, MISS if fresh is None else fresh[j])
        return fresh

    def close(self) -> None:
        """Release the scorer (on the compute thread, where it was loaded)."""
        self.scorer.close()

    def info(self) -> dict[str, object]:
        """The scorer's facts with the entry's: name, kind, weight, labels, objectives, ..."""
        entry = {
            key: value
            for key, value in self.spec.model_dump().items()
            if key in ("weight", "objectives", "normalize")
        }
        own = {"name": self.name, "kind": self.kind, "labels": self.labels}
        return {**self.scorer.info(), **entry, **own}


def _logit_row(value: Any) -> list[float]:
    """One row of ``logits_batch``: every label's logit as floats."""
    return [float(v) for v in value]


def _check_rows(values: Sequence[Any]) -> list[list[float]]:
    """Rows of finite logits (a lone score is a row of one), or RuntimeError (a model bug:
    answered as 500). One per item: the scheduler's contract (scheduling.check_count)."""
    rows = [value if isinstance(value, list) else [float(value)] for value in values]
    for i, row in enumerate(rows):
        if not row or not all(math.isfinite(v) for v in row):
            raise RuntimeError(f"non-finite or empty score {row} for item {i}")
    return rows


class SequenceModel(BatchedModel):
    """A sequence-classification reward model: one score per text, read from its head's
    label (``label_index``) or its labels weighted by name (``objectives``)."""

    kind = "sequence"

    def __init__(self, spec: ModelSpec, scorer: Scorer) -> None:
        super().__init__(spec, scorer)
        # Rows of every label's logit when the micro-batcher runs a MultiLabel scorer (the
        # score is read from them); else rows of the configured label's logit alone.
        self._all_labels = isinstance(scorer, MultiLabel) and not isinstance(scorer, RowRunner)
        self._label_in_row = 0
        self._labels = ["LABEL_0"]
        if isinstance(scorer, MultiLabel):
            index = scorer.label_index
            self._labels = list(scorer.labels) if self._all_labels else [scorer.labels[index]]
            self._label_in_row = index if self._all_labels else 0
        self._weights: list[float] | None = None
        objectives = getattr(spec, "objectives", None)
        if objectives is not None:
            if not self._all_labels:
                raise ModelLoadError(
                    f"model {spec.name!r}: objectives need every label's logit, which this "
                    "engine does not give"
                )
            try:
                self._weights = label_weights(self._labels, objectives)
            except ValueError as exc:
                raise ModelLoadError(f"model {spec.name!r}: {exc}") from None

    @property
    def labels(self) -> list[str]:
        """Names of the values in each result's ``logits``: every label, or the scored one."""
        return list(self._labels)

    def prepare(
        self, items: Items, *, truncate: bool, max_tokens: int | None
    ) -> Sequence[Tokenized]:
        """The items rendered with this model's template and tokenized with its tokenizer."""
        texts = render(items, self.scorer, self._context().policy_template)
        if max_tokens is None:
            return self.scorer.encode(texts, truncate=truncate)
        return self.scorer.encode(texts, truncate=True, max_length=max_tokens)

    def batch_function(
        self,
    ) -> tuple[Callable[[list[Sequence[int]]], Sequence[Any]], Callable[[Any], Any]]:
        """Every label's logits (the score is read from them), or the scorer's scores."""
        if self._all_labels:
            assert isinstance(self.scorer, MultiLabel)
            return self.scorer.logits_batch, _logit_row
        return self.scorer.score_batch, float

    def finish(self, prepared: Sequence[Tokenized], values: Sequence[Any]) -> list[ItemResult]:
        """The score of each row, with the row itself as ``logits``."""
        rows = _check_rows(values)
        return [
            ItemResult(
                score=own_score(row, self._label_in_row, self._weights),
                num_tokens=item.num_tokens,
                truncated=item.truncated,
                logits=tuple(row),
            )
            for item, row in zip(prepared, rows, strict=True)
        ]


class ProcessModel(BatchedModel):
    """A process reward model: a score per step of each response (the token classifier's
    score at each step's token, :mod:`reward_server.text.steps`), and the item's own score
    aggregated over its steps (``step_aggregate``)."""

    kind = "process"

    def __init__(self, spec: ModelSpec, scorer: StepScorer) -> None:
        super().__init__(spec, cast("Scorer", scorer))
        self.process = scorer
        info = scorer.info()
        self._head_labels = list(cast("list[str]", info["labels"]))
        self._read_label = self._head_labels[cast("int", info["label_index"])]

    @property
    def labels(self) -> list[str]:
        """The label the step scores come from (results carry no per-label values)."""
        return [self._read_label]

    def prepare(
        self, items: Items, *, truncate: bool, max_tokens: int | None
    ) -> Sequence[Tokenized]:
        """Each item's response split into steps, rendered and tokenized, its steps placed."""
        told = conversations(items, self._context().policy_template, self.name)
        rendering = self.process.rendering
        cut = truncate if max_tokens is None else True
        if isinstance(told, Pairs):
            return rendering.encode_pairs(
                told.queries, told.responses, truncate=cut, max_length=max_tokens, tools=told.tools
            )
        tools = items.tools if isinstance(items, Conversations) else None
        return rendering.encode_conversations(
            told, truncate=cut, max_length=max_tokens, tools=tools
        )

    def batch_function(
        self,
    ) -> tuple[Callable[[list[Sequence[int]]], Sequence[Any]], Callable[[Any], Any]]:
        """Every token's step score, per row."""
        return self.process.token_scores, _logit_row

    def finish(self, prepared: Sequence[Tokenized], values: Sequence[Any]) -> list[ItemResult]:
        """Each item's step scores read at its steps' tokens, and their aggregate."""
        rows = _check_rows(values)
        items = cast("Sequence[StepEncoded]", prepared)
        results = step_results(rows, items, self.process.steps.aggregate)
        return [
            ItemResult(
                score=result.score,
                num_tokens=item.num_tokens,
                truncated=item.truncated,
                step_scores=tuple(result.step_scores),
                step_ends=tuple(result.step_ends),
                steps_dropped=result.steps_dropped,
            )
            for item, result in zip(items, results, strict=True)
        ]

    def info(self) -> dict[str, object]:
        """The entry's facts with every label of the head (:attr:`labels` is the one read)."""
        return {**super().info(), "labels": list(self._head_labels)}


def served_model_for(spec: ModelSpec, scorer: Scorer | StepScorer) -> ServedModel:
    """The served model of ``spec`` around a loaded scorer (ModelLoadError when they do not fit)."""
    if spec.kind == "process":
        if not hasattr(scorer, "token_scores"):
            raise ModelLoadError(f"model {spec.name!r}: kind: process needs a process model")
        return ProcessModel(spec, cast("StepScorer", scorer))
    return SequenceModel(spec, cast("Scorer", scorer))


def load_served_model(spec: ModelSpec, options: LoadOptions, engine: str) -> ServedModel:
    """Load the model of ``spec`` with ``options`` as a served model, on the calling thread (the
    registry's compute thread); raises ModelLoadError."""
    scorer: Scorer | StepScorer
    if isinstance(spec, ProcessEntry):
        steps = StepOptions(spec.step_separator, spec.step_tag, spec.step_aggregate)
        scorer = load_process_scorer(options, steps, engine)
    else:
        scorer = load_scorer(options, engine)
    try:
        return served_model_for(spec, scorer)
    except BaseException:
        scorer.close()
        raise
