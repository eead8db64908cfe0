"""The scoring service behind the routes: its threads, the models' lifecycle, admission, and
the path of one request's items (each model's slot: render + tokenize -> scheduler -> checked
results; then the models' scores combined).

No torch and no HTTP here: each model is an engine's :class:`~reward_server.engines.Scorer`
inside a :class:`~reward_server.scoring.served.Slot` with its own scheduler (the micro-batcher, or
the engine's own). A request fans out to every slot at once (or to the one it names) and
the results are gathered; the first failure cancels the other slots' rows.

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
from reward_server.engines import LoadOptions, Scheduler, Scorer
from reward_server.errors import (
    ClientDisconnectedError,
    ModelLoadError,
    NotReadyError,
    ScoringError,
    TooManyItemsError,
    UnknownModelError,
)
from reward_server.http.errors import KNOWN_ERRORS
from reward_server.scoring.aggregate import AggregateName, Weighting, combine
from reward_server.scoring.metrics import Metrics
from reward_server.scoring.served import (
    ItemResult,
    Items,
    Render,
    Slot,
    SlotContext,
    load_slot,
    slot_for,
)
from reward_server.text.policy_template import (
    PolicyTemplate,
    PolicyTemplateLoadError,
    load_policy_template,
)

logger = logging.getLogger("reward_server")

__all__ = [
    "AGGREGATE_LABEL",
    "COMPUTE_THREAD_PREFIX",
    "THREAD_PREFIX",
    "TOKENIZER_THREAD_PREFIX",
    "Render",
    "Scored",
    "Service",
]

T = TypeVar("T")

#: Every thread the service starts has a name beginning with this.
THREAD_PREFIX = "reward-server-"
COMPUTE_THREAD_PREFIX = THREAD_PREFIX + "compute"
TOKENIZER_THREAD_PREFIX = THREAD_PREFIX + "tokenize"

#: The one label of :meth:`Service.logits` rows when several models score: their combined score.
AGGREGATE_LABEL = "aggregate"

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
        return out or None

    def steps(self) -> list[ItemResult] | None:
        """The results of the process model that scored, if one did."""
        for results in self.results.values():
            if results and results[0].step_scores is not None:
                return results
        return None

    def rows(self) -> list[list[float]]:
        """One row per item for the vLLM and TEI shapes: the one model's every logit (or its
        score), or with several models the combined score alone (:data:`AGGREGATE_LABEL`)."""
        if len(self.results) > 1:
            return [[score] for score in self.scores]
        (results,) = self.results.values()
        return [list(r.logits) or [r.score] for r in results]


def _single_spec(settings: ServerSettings) -> ModelSpec:
    """The entry of a plain --model server (named after its scorer once loaded)."""
    name = str(settings.model)
    return ModelSpec.model_construct(name=name, model=name)


class Service:
    """Per-app state: settings, the models' slots, metrics and the service's threads."""

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
        self.slots: list[Slot] = []
        self._owned: list[Scorer] = []  # loaded here: closed here
        self.draining = False
        self._compute: ThreadPoolExecutor | None = None
        self._tokenizer: ThreadPoolExecutor | None = None
        #: The policy's chat template, undone on /get_reward (--policy-tokenizer).
        self.policy_template: PolicyTemplate | None = None

    # ------------------------------------------------------------------ what is served

    @property
    def model(self) -> Scorer | None:
        """The first model's scorer (the top-level fields of /info describe it)."""
        return self.slots[0].scorer if self.slots else None

    @property
    def batcher(self) -> Scheduler | None:
        """The first model's scheduler."""
        return self.slots[0].scheduler if self.slots else None

    @property
    def max_batch_tokens(self) -> int | None:
        """The first model's padded-token budget of a pass (--max-batch-tokens or its
        default for the model's device)."""
        if self.slots and self.slots[0].max_batch_tokens is not None:
            return self.slots[0].max_batch_tokens
        return self.settings.max_batch_tokens

    @property
    def name(self) -> str:
        """The name answers carry: the one model's, or the models' names joined by "+"."""
        if not self.slots:
            return self.settings.served
        return "+".join(slot.name for slot in self.slots)

    @property
    def labels(self) -> list[str]:
        """Names of the values in the rows :meth:`logits` returns (known once started)."""
        if len(self.slots) == 1:
            return self.slots[0].labels
        return [AGGREGATE_LABEL]

    @property
    def ready(self) -> bool:
        """True once every model is loaded and its scheduler runs, until draining begins."""
        return bool(self.slots) and all(s.running for s in self.slots) and not self.draining

    @property
    def max_client_batch(self) -> int:
        """Items per request accepted (a request larger than the queue could never fit)."""
        return self.settings.effective_max_client_batch

    def models_info(self) -> list[dict[str, object]]:
        """One entry per served model for GET /info."""
        return [slot.info() for slot in self.slots]

    # ------------------------------------------------------------------ lifecycle

    def _compute_thread(self) -> ThreadPoolExecutor:
        """The compute thread (started on first use, until :meth:`stop`)."""
        if self._compute is None:
            self._compute = ThreadPoolExecutor(1, thread_name_prefix=COMPUTE_THREAD_PREFIX)
        return self._compute

    def _load_slots(self) -> list[Slot]:
        """Every model's slot, loading those not given (on the compute thread)."""
        base = LoadOptions.from_settings(self.settings)
        slots: list[Slot] = []
        try:
            for spec in self.specs:
                slots.append(self._load_slot(spec, base))
        except BaseException:
            self._close_owned()
            raise
        return slots

    def _load_slot(self, spec: ModelSpec, base: LoadOptions) -> Slot:
        given = self._given.get(spec.name)
        if given is not None:
            slot = slot_for(spec, given)
        elif not self._from_file:
            slot = load_slot(spec, base, self.engine)
            self._owned.append(slot.scorer)
        else:
            try:
                slot = load_slot(spec, spec.load_options(base), self.engine)
            except ModelLoadError as exc:
                raise ModelLoadError(f"model {spec.name!r} ({spec.model}): {exc}") from exc
            self._owned.append(slot.scorer)
        if not self._from_file:  # a plain --model server answers with its scorer's name
            slot.spec = spec.model_copy(update={"name": slot.scorer.name})
        return slot

    def _close_owned(self) -> None:
        """Close the scorers loaded here (on the calling thread: the compute thread)."""
        owned, self._owned = self._owned, []
        for scorer in owned:
            try:
                scorer.close()
            except Exception:
                logger.exception("closing model %s failed", scorer.name)

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

    def load(self) -> Scorer:
        """Load the models now on the compute thread, blocking (the CLI does this before it
        serves, so that a failure is one line and exit 1); returns the first model's scorer;
        raises ModelLoadError."""
        try:
            self._load_policy_template()
            if not self.slots:
                self.slots = self._compute_thread().submit(self._load_slots).result()
        except Exception:
            self._end_compute_thread()  # nothing to serve
            raise
        return self.slots[0].scorer

    async def start(self) -> None:
        """Load the models if needed (on the compute thread) and start their schedulers."""
        try:
            await self._start()
        except BaseException:
            for slot in self.slots:
                with contextlib.suppress(Exception):
                    await slot.stop(drain=False)
            await self._release()
            raise

    async def _start(self) -> None:
        compute = self._compute_thread()
        await asyncio.to_thread(self._load_policy_template)
        if not self.slots:
            self.slots = await asyncio.wrap_future(compute.submit(self._load_slots))
        self._tokenizer = ThreadPoolExecutor(1, thread_name_prefix=TOKENIZER_THREAD_PREFIX)
        context = SlotContext(
            compute=compute, tokenizer=self._tokenizer, settings=self.settings, metrics=self.metrics
        )
        for slot in self.slots:
            await slot.start(context)
        self.draining = False
        slots = list(self.slots)
        self.metrics.track_queue(lambda: float(sum(slot.queued for slot in slots)))
        self.metrics.ready.set_function(lambda: 1.0 if self.ready else 0.0)
        for slot in slots:
            self._warn_limits(slot)
        if len(slots) > 1:
            logger.info("serving %d models, combined by %s", len(slots), self.aggregate)

    def _warn_limits(self, slot: Slot) -> None:
        """Log the settings that contradict each other."""
        s = self.settings
        max_length = slot.scorer.max_length
        if slot.max_batch_tokens is not None and max_length > slot.max_batch_tokens:
            logger.warning(
                "max_length %d of %s exceeds max_batch_tokens %d: raise --max-batch-tokens or "
                "lower its max length",
                max_length,
                slot.name,
                slot.max_batch_tokens,
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
        await asyncio.gather(*(slot.stop(drain=True) for slot in self.slots))
        await self._release()

    async def _release(self) -> None:
        """Close the models loaded here (on their thread) and end the service's threads."""
        if self._tokenizer is not None:
            self._tokenizer.shutdown(wait=True)
            self._tokenizer = None
        self.slots = []
        if self._compute is not None:
            await asyncio.wrap_future(self._compute.submit(self._close_owned))
        self._end_compute_thread()

    def _end_compute_thread(self) -> None:
        if self._compute is not None:
            self._compute.shutdown(wait=True)
            self._compute = None

    # ------------------------------------------------------------------ scoring

    def _select(self, model: str | None) -> list[Slot]:
        """Every slot, or the one ``model`` names (UnknownModelError for another name)."""
        if model is None:
            return list(self.slots)
        for slot in self.slots:
            if slot.name == model:
                return [slot]
        known = ", ".join(repr(slot.name) for slot in self.slots)
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
    ) -> Scored:
        """Score ``items`` with every model (or the one ``model`` names) and combine them.

        ``receive`` is the request's: if the client hangs up, its queued rows are dropped.
        ``truncate`` None keeps the server's setting; ``max_tokens`` truncates each item to
        at most this many tokens (vLLM's ``truncate_prompt_tokens``).
        """
        # Draining does not refuse work here: after SIGTERM uvicorn accepts no new
        # connections, so whatever still arrives was already in flight and is finished;
        # the schedulers refuse (503) only once they stop, after those requests are done.
        if not self.slots:
            raise NotReadyError("the model is loading")
        slots = self._select(model)
        if items.count > self.max_client_batch:
            raise TooManyItemsError(
                f"{items.count} items in one request; the limit is {self.max_client_batch} "
                f"(split the request)"
            )
        do_truncate = (not self.settings.no_truncate) if truncate is None else truncate
        work = _all_or_first_error(
            [self._score_one(slot, endpoint, items, do_truncate, max_tokens) for slot in slots]
        )
        results = await _cancel_on_disconnect(receive, endpoint, work)
        scored = self._combine(slots, results, selected=model is not None)
        self._count(endpoint, scored)
        return scored

    async def _score_one(
        self, slot: Slot, endpoint: str, items: Items, truncate: bool, max_tokens: int | None
    ) -> list[ItemResult]:
        """One slot's results; a failure that is not in the error table is a ScoringError."""
        try:
            return await slot.score(items, truncate=truncate, max_tokens=max_tokens)
        except KNOWN_ERRORS:  # these answer through the error table
            raise
        except Exception as exc:
            logger.error(
                "scoring failed on %s (%d items, model %s)",
                endpoint,
                items.count,
                slot.name,
                exc_info=exc,
            )
            raise ScoringError(
                "the reward model failed on this request; the error is in the server log"
            ) from exc

    def _combine(
        self, slots: Sequence[Slot], results: Sequence[list[ItemResult]], *, selected: bool
    ) -> Scored:
        """The answer's scores: one model's own, or every model's combined."""
        by_name = {slot.name: rs for slot, rs in zip(slots, results, strict=True)}
        labels = {slot.name: slot.labels for slot in slots}
        if selected or (len(slots) == 1 and not self._from_file):
            (only,) = results
            name = slots[0].name
            return Scored(name, [r.score for r in only], by_name, labels)
        scores = _aggregate(slots, by_name, self.aggregate)
        kinds = {slot.kind for slot in slots}
        outcome = None
        if "process" in kinds and "sequence" in kinds:
            outcome = _aggregate(
                [s for s in slots if s.kind == "sequence"], by_name, self.aggregate
            )
        return Scored(self.name, scores, by_name, labels, outcome)

    def _count(self, endpoint: str, scored: Scored) -> None:
        """The server-wide counters of one scored request."""
        n_items = len(scored.scores)
        self.metrics.items.labels(endpoint=endpoint).inc(n_items)
        tokens = sum(r.num_tokens for rs in scored.results.values() for r in rs)
        self.metrics.tokens.inc(tokens)
        self.metrics.truncated.inc(sum(scored.truncated))

    async def logits(
        self,
        receive: Receive,
        endpoint: str,
        render: Render,
        n_items: int,
        *,
        truncate: bool | None,
        max_tokens: int | None = None,
    ) -> tuple[list[list[float]], Scored]:
        """Rows of values per item for the vLLM and TEI shapes (:attr:`labels` names them):
        with one model its every label's raw logit (or its score alone when the engine gives
        no more); with several models their combined score as one label,
        :data:`AGGREGATE_LABEL`. Also the :class:`Scored` (tokens, truncation)."""
        scored = await self.score(
            receive, endpoint, Items(n_items, render), truncate=truncate, max_tokens=max_tokens
        )
        return scored.rows(), scored


def _aggregate(
    slots: Sequence[Slot], by_name: Mapping[str, list[ItemResult]], aggregate: AggregateName
) -> list[float]:
    """The combined score of ``slots`` per item (:func:`~reward_server.scoring.aggregate.combine`)."""
    weighting = {}
    for slot in slots:
        norm = slot.spec.normalize
        mean, std = (0.0, 1.0) if norm is None else (norm.mean, norm.std)
        weighting[slot.name] = Weighting(weight=slot.spec.weight, mean=mean, std=std)
    scores = {slot.name: [r.score for r in by_name[slot.name]] for slot in slots}
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
