"""The served models of one app and the threads they run on: loading, starting, draining and
stopping them, and what /health, /info and /metrics read about them.

No torch and no HTTP here: each model is an engine's :class:`~reward_server.engines.Scorer`
(or a verifier's pool, a judge, a remote component) inside a
:class:`~reward_server.scoring.served.ServedModel` with its own scheduler
(:mod:`reward_server.scheduling`). Requests go through
:class:`~reward_server.scoring.pipeline.ScoringPipeline`, which reads the models from here.

Threads, all owned by the registry and gone after :meth:`ModelRegistry.stop`:

* ``reward-server-compute``: loads every model and runs every forward pass, of every model.
  PyTorch's CPU build parallelises with GNU OpenMP, which gives every thread that starts a
  parallel region a team of its own. Once the process holds more OpenMP threads than CPUs,
  libgomp stops spin-waiting at its barriers and sleeps in the kernel instead, and every
  operator of a forward pass pays for the wake-ups (BENCHMARKS.md, "One OpenMP team").
  Loading on the thread that later scores keeps one team.
* ``reward-server-tokenize``: renders and tokenizes, off the event loop, never two calls into a
  fast tokenizer at once (its Rust backend is not re-entrant across threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from reward_server.config import AggregateName, LoadOptions, ServerSettings
from reward_server.config.entries import SequenceEntry
from reward_server.config.models_file import ModelSpec
from reward_server.engines import Scorer
from reward_server.errors import ModelLoadError, UnknownModelError
from reward_server.scoring.code_runs import CodeRuns
from reward_server.scoring.grader_runs import GraderRuns
from reward_server.scoring.loading import load_model
from reward_server.scoring.metrics import Metrics, RegistryState
from reward_server.scoring.score_cache import ScoreCache, caches_kind
from reward_server.scoring.served import ServedModel, ServingContext, served_model_for
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
    "ModelRegistry",
    "model_specs",
]

#: Every thread the registry starts has a name beginning with this.
THREAD_PREFIX = "reward-server-"
COMPUTE_THREAD_PREFIX = THREAD_PREFIX + "compute"
TOKENIZER_THREAD_PREFIX = THREAD_PREFIX + "tokenize"


def model_specs(settings: ServerSettings) -> list[ModelSpec]:
    """One spec per model: the models file's entries, or the one of a plain --model server
    (named after its scorer once loaded)."""
    if settings.models_file is not None:
        return list(settings.models_file.models)
    name = str(settings.model)
    return [SequenceEntry.model_construct(name=name, model=name, reasoning=settings.reasoning)]


class ModelRegistry:
    """The app's served models, in the models file's order, and their two threads."""

    def __init__(
        self, settings: ServerSettings, metrics: Metrics, given: Mapping[str, Scorer] | None = None
    ) -> None:
        """``given``: scorers already loaded, by spec name (:func:`model_specs`); the
        others are loaded here, by the engine of --engine or of their entry."""
        self.settings = settings
        self.metrics = metrics
        self.engine = settings.engine
        file = settings.models_file
        self.specs = model_specs(settings)
        self.aggregate: AggregateName = file.aggregate if file else "weighted_sum"
        #: True when the models come from a models file (a plain --model server answers
        #: with its one model's own score and name).
        self.from_file = file is not None
        self._given: dict[str, Scorer] = dict(given or {})
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
        #: once the models start.
        self.code_runs: CodeRuns | None = None
        #: Graders brought by requests (OpenAI's graders API); made once the models start,
        #: its pool at its first call.
        self.grader_runs: GraderRuns | None = None

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

    def select(self, name: str | None) -> list[ServedModel]:
        """Every model, or the one ``name`` names (UnknownModelError for another name)."""
        if name is None:
            return list(self.served)
        for served in self.served:
            if served.name == name:
                return [served]
        known = ", ".join(repr(served.name) for served in self.served)
        raise UnknownModelError(f"unknown model {name!r}; this server scores with {known}")

    def snapshot(self) -> RegistryState:
        """What /metrics reads at a scrape: readiness, each started model's state, the cache's."""
        started = tuple(s for s in (model.snapshot() for model in self.served) if s is not None)
        return RegistryState(self.ready, started, self.score_cache.snapshot())

    def models_info(self) -> list[dict[str, object]]:
        """One entry per served model for GET /info."""
        return [model.info() for model in self.served]

    # ------------------------------------------------------------------ loading

    def _compute_thread(self) -> ThreadPoolExecutor:
        """The compute thread (started on first use, until :meth:`stop`)."""
        if self._compute is None:
            self._compute = ThreadPoolExecutor(1, thread_name_prefix=COMPUTE_THREAD_PREFIX)
        return self._compute

    def _load_models(self) -> list[ServedModel]:
        """Every spec's served model, loading those not given (on the compute thread)."""
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
            model = load_model(spec, base, self.engine, from_file=self.from_file)
            self._owned.append(model)  # closed here at the end
        if not self.from_file:  # a plain --model server answers with its scorer's name
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

    # ------------------------------------------------------------------ lifecycle

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
        by_name = {model.name: model for model in self.served}
        for model in self.served:  # a grader's model leaves: their judges, by name
            bind = getattr(model, "bind_models", None)
            if bind is not None:
                bind(by_name)
        self.metrics.declare_models([model.spec for model in self.served], caches_kind)
        self.draining = False
        self.code_runs = _code_runs(self.served, self.settings.max_queue)
        self.grader_runs = GraderRuns(
            self.settings.max_queue,
            served=lambda: {m.name: m for m in self.served},
            tokenizer=context.tokenizer,
            buckets=context.buckets,
        )
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
        """Drain: finish queued work, then stop the schedulers and the registry's threads."""
        self.begin_drain()
        await asyncio.gather(*(model.stop(drain=True) for model in self.served))
        await self._release()

    async def _release(self) -> None:
        """Close the models loaded here (on their thread) and end the registry's threads."""
        if self._tokenizer is not None:
            self._tokenizer.shutdown(wait=True)
            self._tokenizer = None
        self.served = []
        self.code_runs = None
        if self.grader_runs is not None:
            await asyncio.to_thread(self.grader_runs.close)
            self.grader_runs = None
        if self._compute is not None:
            await asyncio.wrap_future(self._compute.submit(self._close_owned))
        self._end_compute_thread()

    def _end_compute_thread(self) -> None:
        if self._compute is not None:
            self._compute.shutdown(wait=True)
            self._compute = None


def _code_runs(models: list[ServedModel], max_queue: int) -> CodeRuns | None:
    """/run_code's runner, in the first code verifier's sandbox; None without one."""
    for model in models:
        pool = getattr(model, "pool", None)
        if isinstance(pool, CodeVerifier):
            return CodeRuns(pool, max_queue)
    return None
