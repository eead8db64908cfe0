"""The scoring service behind the routes: its threads, the models' lifecycle, admission, and
the path of one request's items (each served model: render + tokenize -> scheduler -> checked
results; then the models' scores combined).

No torch and no HTTP here: each model is an engine's :class:`~reward_server.engines.Scorer`
inside a :class:`~reward_server.scoring.served.ServedModel` with its own scheduler
(:mod:`reward_server.scheduling`: the micro-batcher, or admission around the engine's own);
items arrive as plain data (:mod:`~reward_server.scoring.items`). A request fans out to every model at once (or to the one it names) and
the results are gathered; the first failure cancels the other models' rows.

Threads, all owned by the service and gone after :meth:`Service.stop`:

* ``reward-server-compute``: loads every model and runs every forward pass, of every model.
  PyTorch's CPU build parallelises with GNU OpenMP, which gives every thread that starts a
  parallel region a team of its own. Once the process holds more OpenMP threads than CPUs
  (two teams of two on two cores), libgomp stops spin-waiting at its barriers and sleeps in
  the kernel instead, and every operator of a forward pass pays for the wake-ups: measured
  here, a MiniLM pass went from 21 to 25 ms as soon as a second thread had run one, and
  stayed there in both threads. Loading on the thread that later scores keeps one team.
* ``reward-server-tokenize``: renders and tokenizes, off the event loop, never two calls into a
  fast tokenizer at once (its Rust backend is not re-entrant across threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from reward_server.config import ServerSettings
from reward_server.config.models_file import ModelSpec
from reward_server.config.tenants import current_tenant
from reward_server.engines import LoadOptions, Scorer
from reward_server.errors import (
    ClientDisconnectedError,
    ModelLoadError,
    ModelNotFoundError,
    NotReadyError,
    ScoringError,
    ServiceError,
    TooManyItemsError,
    UnknownModelError,
)
from reward_server.scheduling import Scheduler
from reward_server.scoring.aggregate import AggregateName, Weighting, combine
from reward_server.scoring.code_runs import CodeRun, CodeRunResult, CodeRuns
from reward_server.scoring.items import Items
from reward_server.scoring.loading import load_model
from reward_server.scoring.metrics import Metrics, ServiceState
from reward_server.scoring.score_cache import ScoreCache
from reward_server.scoring.served import ItemResult, ServedModel, ServingContext, served_model_for
from reward_server.text.policy_template import (
    PolicyTemplate,
    PolicyTemplateLoadError,
    load_policy_template,
)
from reward_server.verifiers.code import CodeVerifier

logger = logging.getLogger("reward_server")

__all__ = [
    "COMPUTE_THREAD_PREFIX",
    "THREAD_PREFIX",
    "TOKENIZER_THREAD_PREFIX",
    "Scored",
    "Service",
]

T = TypeVar("T")

#: Every thread the service starts has a name beginning with this.
THREAD_PREFIX = "reward-server-"
COMPUTE_THREAD_PREFIX = THREAD_PREFIX + "compute"
TOKENIZER_THREAD_PREFIX = THREAD_PREFIX + "tokenize"

#: An ASGI ``receive``: the service watches it for the client hanging up.
Receive = Callable[[], Awaitable[Mapping[str, Any]]]


@dataclass(frozen=True, slots=True)
class Scored:
    """A request's results: the answer's scores and every scoring model's own results."""

    #: The name answers carry: the one scoring model's, or the models' joined by "+".
    name: str
    #: The combined score per item (the named model's own score when a request names one).
    scores: list[float]
    #: Each scoring model's results, by name in the models file's order.
    results: dict[str, list[ItemResult]]
    #: The names of each scoring model's ``logits``.
    labels: dict[str, list[str]]
    #: The combined score of the sequence models alone, when a process model scored too.
    outcome_scores: list[float] | None = None

    @property
    def tokens(self) -> list[int]:
        """Per item: the most tokens any scoring model used."""
        return [max(r.num_tokens for r in rs) for rs in zip(*self.results.values(), strict=True)]

    @property
    def truncated(self) -> list[bool]:
        """Per item: whether any scoring model truncated it."""
        return [any(r.truncated for r in rs) for rs in zip(*self.results.values(), strict=True)]

    def components(self) -> dict[str, list[float]]:
        """Each scoring model's own score per item."""
        return {name: [r.score for r in rs] for name, rs in self.results.items()}

    def objectives(self) -> dict[str, list[float]] | None:
        """Every label's raw logit of every scoring model with several labels, by label name
        (``model/label`` when several models scored); None when no model has several."""
        several = len(self.results) > 1
        out: dict[str, list[float]] = {}
        for name, results in self.results.items():
            labels = self.labels[name]
            if len(labels) < 2:
                continue
            for j, label in enumerate(labels):
                out[f"{name}/{label}" if several else label] = [r.logits[j] for r in results]
        for name, results in self.results.items():
            # A python verifier's values beyond its score, where every item has them.
            common = set.intersection(*(set(dict(r.extras)) for r in results)) if results else set()
            for key in sorted(common):
                out[f"{name}/{key}" if several else key] = [dict(r.extras)[key] for r in results]
        return out or None

    def verifier_errors(self) -> dict[str, list[str | None]] | None:
        """Per verifier that failed on any item: each item's reason (None where it did not
        fail); None when no verifier failed."""
        out = {
            name: [r.error for r in results]
            for name, results in self.results.items()
            if any(r.error is not None for r in results)
        }
        return out or None

    def tests(self) -> dict[str, list[list[str] | None]] | None:
        """Per code verifier: each item's test verdicts (None for an item whose tests could
        not be read); None when no code verifier scored."""
        out = {
            name: [None if r.tests is None else list(r.tests) for r in results]
            for name, results in self.results.items()
            if any(r.tests is not None for r in results)
        }
        return out or None

    def steps(self) -> list[ItemResult] | None:
        """The results of the process model that scored, if one did."""
        for results in self.results.values():
            if results and results[0].step_scores is not None:
                return results
        return None


def _single_spec(settings: ServerSettings) -> ModelSpec:
    """The entry of a plain --model server (named after its scorer once loaded)."""
    name = str(settings.model)
    return ModelSpec.model_construct(name=name, model=name)


class Service:
    """Per-app state: settings, the models' models, metrics and the service's threads."""

    def __init__(
        self,
        settings: ServerSettings,
        model: Scorer | None,
        metrics: Metrics,
        *,
        engine: str | None = None,
        models: Mapping[str, Scorer] | None = None,
    ) -> None:
        """``model``: the scorer of a plain --model server, already loaded; ``models``:
        loaded scorers of models-file entries, by name (the others are loaded here)."""
        self.settings = settings
        self.metrics = metrics
        #: The engine that loads the models: ``engine``, else the settings' (--engine).
        self.engine = engine or settings.engine
        file = settings.models_file
        #: One entry per model: the models file's, or one made from the flags.
        self.specs: list[ModelSpec] = list(file.models) if file else [_single_spec(settings)]
        self.aggregate: AggregateName = file.aggregate if file else "weighted_sum"
        self._from_file = file is not None
        self._given: dict[str, Scorer] = dict(models or {})
        if model is not None:
            self._given[self.specs[0].name] = model
        #: The served models, in the models file's order (empty until loaded).
        self.served: list[ServedModel] = []
        self._owned: list[ServedModel] = []  # loaded here: closed here
        self.draining = False
        self._compute: ThreadPoolExecutor | None = None
        self._tokenizer: ThreadPoolExecutor | None = None
        #: The policy's chat template, undone on /get_reward (--policy-tokenizer).
        self.policy_template: PolicyTemplate | None = None
        #: Scores by model identity and token ids, shared by the served models
        #: (--score-cache-size, --score-cache-bytes).
        self.score_cache = ScoreCache(settings.score_cache_size, settings.score_cache_bytes)
        #: Program runs on request (/run_code) in the first code verifier's sandbox; made
        #: once the models are loaded.
        self.code_runs: CodeRuns | None = None

    # ------------------------------------------------------------------ what is served

    @property
    def model(self) -> Scorer | None:
        """The first reward model's scorer (the top-level fields of /info describe it); None
        until loaded, and when only verifiers are served."""
        return next((m.scorer for m in self.served if m.scorer is not None), None)

    @property
    def loaded(self) -> bool:
        """True once the served models are loaded (they may not have started yet)."""
        return bool(self.served)

    @property
    def batcher(self) -> Scheduler | None:
        """The first model's scheduler."""
        return self.served[0].scheduler if self.served else None

    @property
    def max_batch_tokens(self) -> int | None:
        """The first model's padded-token budget of a pass (--max-batch-tokens or its
        default for the model's device)."""
        budgets = [m.max_batch_tokens for m in self.served if m.max_batch_tokens is not None]
        return budgets[0] if budgets else self.settings.max_batch_tokens

    @property
    def name(self) -> str:
        """The name answers carry: the one model's, or the models' names joined by "+"."""
        if not self.served:
            return self.settings.served
        return "+".join(model.name for model in self.served)

    @property
    def max_length(self) -> int | None:
        """The most tokens every served reward model scores per item (None until loaded,
        and when only verifiers are served: they read text, not tokens)."""
        return min((m.scorer.max_length for m in self.served if m.scorer), default=None)

    @property
    def ready(self) -> bool:
        """True once every model is loaded and its scheduler runs, until draining begins."""
        return bool(self.served) and all(s.running for s in self.served) and not self.draining

    @property
    def max_client_batch(self) -> int:
        """Items per request accepted (a request larger than the queue could never fit)."""
        return self.settings.effective_max_client_batch

    def snapshot(self) -> ServiceState:
        """What /metrics reads at a scrape: readiness, each started model's state, the cache's."""
        started = tuple(s for s in (model.snapshot() for model in self.served) if s is not None)
        return ServiceState(self.ready, started, self.score_cache.snapshot())

    def models_info(self) -> list[dict[str, object]]:
        """One entry per served model for GET /info."""
        return [model.info() for model in self.served]

    # ------------------------------------------------------------------ lifecycle

    def _compute_thread(self) -> ThreadPoolExecutor:
        """The compute thread (started on first use, until :meth:`stop`)."""
        if self._compute is None:
            self._compute = ThreadPoolExecutor(1, thread_name_prefix=COMPUTE_THREAD_PREFIX)
        return self._compute

    def _load_models(self) -> list[ServedModel]:
        """Every model's model, loading those not given (on the compute thread)."""
        base = LoadOptions.from_settings(self.settings)
        models: list[ServedModel] = []
        try:
            for spec in self.specs:
                models.append(self._load_model(spec, base))
        except BaseException:
            self._close_owned()
            raise
        return models

    def _load_model(self, spec: ModelSpec, base: LoadOptions) -> ServedModel:
        given = self._given.get(spec.name)
        if given is not None:  # a scorer the caller gave is the caller's to close
            model = served_model_for(spec, given)
        else:
            model = load_model(spec, base, self.engine, from_file=self._from_file)
            self._owned.append(model)  # closed here at the end
        if not self._from_file:  # a plain --model server answers with its scorer's name
            model.spec = spec.model_copy(update={"name": model.scorer.name})
        return model

    def _close_owned(self) -> None:
        """Close the models loaded here (on the calling thread: the compute thread)."""
        owned, self._owned = self._owned, []
        for model in owned:
            try:
                model.close()
            except Exception:
                logger.exception("closing model %s failed", model.name)

    def _load_policy_template(self) -> None:
        """Learn the policy's chat template (--policy-tokenizer) once; ModelLoadError if not."""
        name = self.settings.policy_tokenizer
        if name is None or self.policy_template is not None:
            return
        try:
            self.policy_template = load_policy_template(name, self.settings.trust_remote_code)
        except PolicyTemplateLoadError as exc:
            raise ModelLoadError(str(exc)) from exc
        logger.info("policy template of %s learned: %s", name, self.policy_template.shape)

    def load(self) -> list[ServedModel]:
        """Load the models now on the compute thread, blocking (the CLI does this before it
        serves, so that a failure is one line and exit 1); returns them; raises
        ModelLoadError."""
        try:
            self._load_policy_template()
            if not self.served:
                self.served = self._compute_thread().submit(self._load_models).result()
        except Exception:
            self._end_compute_thread()  # nothing to serve
            raise
        return list(self.served)

    async def start(self) -> None:
        """Load the models if needed (on the compute thread) and start their schedulers."""
        try:
            await self._start()
        except BaseException:
            for model in self.served:
                with contextlib.suppress(Exception):
                    await model.stop(drain=False)
            await self._release()
            raise

    async def _start(self) -> None:
        compute = self._compute_thread()
        await asyncio.to_thread(self._load_policy_template)
        if not self.served:
            self.served = await asyncio.wrap_future(compute.submit(self._load_models))
        self._tokenizer = ThreadPoolExecutor(1, thread_name_prefix=TOKENIZER_THREAD_PREFIX)
        context = ServingContext(
            compute=compute,
            tokenizer=self._tokenizer,
            settings=self.settings,
            metrics=self.metrics,
            policy_template=self.policy_template,
            score_cache=self.score_cache if self.score_cache.enabled else None,
        )
        for model in self.served:
            await model.start(context)
        self.draining = False
        self.code_runs = _code_runs(self.served, self.settings.max_queue)
        for model in self.served:
            self._warn_limits(model)
        if len(self.served) > 1:
            logger.info("serving %d models, combined by %s", len(self.served), self.aggregate)

    def _warn_limits(self, model: ServedModel) -> None:
        """Log the settings that contradict each other."""
        s = self.settings
        max_length = model.scorer.max_length if model.scorer is not None else 0
        if model.max_batch_tokens is not None and max_length > model.max_batch_tokens:
            logger.warning(
                "max_length %d of %s exceeds max_batch_tokens %d: raise --max-batch-tokens or "
                "lower its max length",
                max_length,
                model.name,
                model.max_batch_tokens,
            )
        if s.max_client_batch > s.max_queue:
            logger.warning(
                "max_client_batch %d exceeds max_queue %d; accepting at most %d items a request",
                s.max_client_batch,
                s.max_queue,
                s.max_queue,
            )

    def begin_drain(self) -> None:
        """Report 503 on /health from now on (called first thing on SIGTERM)."""
        if not self.draining:
            logger.info("draining: finishing queued work before exit")
        self.draining = True

    async def stop(self) -> None:
        """Drain: finish queued work, then stop the schedulers and the service's threads."""
        self.begin_drain()
        await asyncio.gather(*(model.stop(drain=True) for model in self.served))
        await self._release()

    async def _release(self) -> None:
        """Close the models loaded here (on their thread) and end the service's threads."""
        if self._tokenizer is not None:
            self._tokenizer.shutdown(wait=True)
            self._tokenizer = None
        self.served = []
        if self._compute is not None:
            await asyncio.wrap_future(self._compute.submit(self._close_owned))
        self._end_compute_thread()

    def _end_compute_thread(self) -> None:
        if self._compute is not None:
            self._compute.shutdown(wait=True)
            self._compute = None

    # ------------------------------------------------------------------ scoring

    async def run_code(self, receive: Receive, run: CodeRun) -> CodeRunResult:
        """Run one program in the code verifier's sandbox (``/run_code``); cancelled when
        the client hangs up. ModelNotFoundError (404) when no code verifier is served."""
        if not self.served:
            raise NotReadyError("the model is loading")
        runs = self.code_runs
        if runs is None:
            raise ModelNotFoundError(
                "this server runs no programs: /run_code needs a 'kind: verifier, verifier: "
                "code' entry in its models file (its sandbox, languages and limits serve it)"
            )
        return await _cancel_on_disconnect(receive, "/run_code", runs.run(run))

    def _select(self, model: str | None) -> list[ServedModel]:
        """Every model, or the one ``model`` names (UnknownModelError for another name)."""
        if model is None:
            return list(self.served)
        for served in self.served:
            if served.name == model:
                return [served]
        known = ", ".join(repr(served.name) for served in self.served)
        raise UnknownModelError(f"unknown model {model!r}; this server scores with {known}")

    async def score(
        self,
        receive: Receive,
        endpoint: str,
        items: Items,
        *,
        truncate: bool | None,
        max_tokens: int | None = None,
        model: str | None = None,
        cache: bool = True,
    ) -> Scored:
        """Score ``items`` with every model (or the one ``model`` names) and combine them.

        ``receive`` is the request's: if the client hangs up, its queued rows are dropped.
        ``truncate`` None keeps the server's setting; ``max_tokens`` truncates each item to
        at most this many tokens (vLLM's ``truncate_prompt_tokens``); ``cache`` False scores
        every item afresh, neither reading nor filling the score cache.
        """
        # Draining does not refuse work here: after SIGTERM uvicorn accepts no new
        # connections, so whatever still arrives was already in flight and is finished;
        # the schedulers refuse (503) only once they stop, after those requests are done.
        if not self.served:
            raise NotReadyError("the model is loading")
        models = self._select(model)
        if items.count > self.max_client_batch:
            raise TooManyItemsError(
                f"{items.count} items in one request; the limit is {self.max_client_batch} "
                f"(split the request)"
            )
        do_truncate = (not self.settings.no_truncate) if truncate is None else truncate
        work = _all_or_first_error(
            [self._score_one(m, endpoint, items, do_truncate, max_tokens, cache) for m in models]
        )
        results = await _cancel_on_disconnect(receive, endpoint, work)
        scored = self._combine(models, results, selected=model is not None)
        _count(self.metrics, endpoint, scored)
        return scored

    async def _score_one(
        self,
        model: ServedModel,
        endpoint: str,
        items: Items,
        truncate: bool,
        max_tokens: int | None,
        cache: bool = True,
    ) -> list[ItemResult]:
        """One model's results; a failure that is not in the error table is a ScoringError."""
        try:
            return await model.score(items, truncate=truncate, max_tokens=max_tokens, cache=cache)
        except ServiceError:  # these answer through the error table at the edge
            raise
        except Exception as exc:
            logger.error(
                "scoring failed on %s (%d items, model %s)",
                endpoint,
                items.count,
                model.name,
                exc_info=exc,
            )
            raise ScoringError(
                "the reward model failed on this request; the error is in the server log"
            ) from exc

    def _combine(
        self, models: Sequence[ServedModel], results: Sequence[list[ItemResult]], *, selected: bool
    ) -> Scored:
        """The answer's scores: one model's own, or every model's combined."""
        by_name = {model.name: rs for model, rs in zip(models, results, strict=True)}
        labels = {model.name: model.labels for model in models}
        if selected or (len(models) == 1 and not self._from_file):
            (only,) = results
            name = models[0].name
            return Scored(name, [r.score for r in only], by_name, labels)
        scores = _aggregate(models, by_name, self.aggregate)
        kinds = {model.kind for model in models}
        outcome = None
        if "process" in kinds and "sequence" in kinds:
            outcome = _aggregate(
                [s for s in models if s.kind == "sequence"], by_name, self.aggregate
            )
        return Scored(self.name, scores, by_name, labels, outcome)


def _code_runs(models: Sequence[ServedModel], max_queue: int) -> CodeRuns | None:
    """/run_code's runner, in the first code verifier's sandbox; None without one."""
    for model in models:
        pool = getattr(model, "pool", None)
        if isinstance(pool, CodeVerifier):
            return CodeRuns(pool, max_queue)
    return None


def _count(metrics: Metrics, endpoint: str, scored: Scored) -> None:
    """The server-wide and the tenant's counters of one scored request."""
    n_items = len(scored.scores)
    metrics.items.labels(endpoint=endpoint).inc(n_items)
    tokens = sum(r.num_tokens for rs in scored.results.values() for r in rs)
    metrics.tokens.inc(tokens)
    metrics.truncated.inc(sum(scored.truncated))
    # The request's tenant, set by the auth dependency in this very task.
    metrics.on_tenant_items(current_tenant.get().name, n_items, tokens)


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


async def _cancel_on_disconnect(receive: Receive, endpoint: str, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it if the client goes away (its queued items are dropped)."""
    task = asyncio.ensure_future(work)
    disconnected = False

    async def watch() -> None:
        nonlocal disconnected
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                disconnected = True
                task.cancel()
                return

    watcher = asyncio.create_task(watch())
    try:
        return await task
    except asyncio.CancelledError:
        if not disconnected:
            raise
        logger.info("client disconnected from %s; its queued items were dropped", endpoint)
        raise ClientDisconnectedError("client disconnected") from None
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
