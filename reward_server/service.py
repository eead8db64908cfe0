"""The scoring service behind the routes: its threads, the model's lifecycle, admission, and
the path of one request's items (render + tokenize -> scheduler -> checked scores).

No torch and no HTTP here: the model is an engine's :class:`~reward_server.engines.Scorer`,
and the scheduler is the micro-batcher (or the engine's own).

Threads, all owned by the service and gone after :meth:`Service.stop`:

* ``reward-server-compute``: loads the model and runs every forward pass. PyTorch's CPU build
  parallelises with GNU OpenMP, which gives every thread that starts a parallel region a
  team of its own. Once the process holds more OpenMP threads than CPUs (two teams of two on
  two cores), libgomp stops spin-waiting at its barriers and sleeps in the kernel instead,
  and every operator of a forward pass pays for the wake-ups: measured here, a MiniLM pass
  went from 21 to 25 ms as soon as a second thread had run one, and stayed there in both
  threads. Loading on the thread that later scores keeps one team.
* ``reward-server-tokenize``: renders and tokenizes, off the event loop, never two calls into a
  fast tokenizer at once (its Rust backend is not re-entrant across threads).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from reward_server.batcher import Batcher, BatchLimits
from reward_server.config import ServerSettings
from reward_server.engines import (
    LoadOptions,
    MultiLabel,
    Scheduler,
    Scorer,
    SelfScheduling,
    load_scorer,
)
from reward_server.errors import KNOWN_ERRORS
from reward_server.exceptions import (
    ClientDisconnectedError,
    EmptyTextError,
    ModelLoadError,
    NotReadyError,
    ScoringError,
    TooManyItemsError,
)
from reward_server.metrics import Metrics
from reward_server.policy_template import (
    PolicyTemplate,
    PolicyTemplateLoadError,
    load_policy_template,
)
from reward_server.rendering import Encoded

logger = logging.getLogger("reward_server")

__all__ = ["COMPUTE_THREAD_PREFIX", "THREAD_PREFIX", "TOKENIZER_THREAD_PREFIX", "Service"]

T = TypeVar("T")

#: Every thread the service starts has a name beginning with this.
THREAD_PREFIX = "reward-server-"
COMPUTE_THREAD_PREFIX = THREAD_PREFIX + "compute"
TOKENIZER_THREAD_PREFIX = THREAD_PREFIX + "tokenize"

#: An ASGI ``receive``: the service watches it for the client hanging up.
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
#: Turns a request's items into texts with the model's rendering.
Render = Callable[[Scorer], list[str]]


class Service:
    """Per-app state: settings, model, scheduler, metrics and the service's threads."""

    def __init__(
        self,
        settings: ServerSettings,
        model: Scorer | None,
        metrics: Metrics,
        *,
        engine: str | None = None,
    ) -> None:
        self.settings = settings
        self.model = model
        self.metrics = metrics
        #: The engine that loads the model: ``engine``, else the settings' (--engine).
        self.engine = engine or settings.engine
        #: Where token ids go: the micro-batcher, or the engine's own scheduler.
        self.batcher: Scheduler | None = None
        # --max-batch-tokens, or its default for the model's device once the model is known.
        self.max_batch_tokens: int | None = settings.max_batch_tokens
        self.draining = False
        self._owns_model = model is None  # loaded here: closed here
        self._compute: ThreadPoolExecutor | None = None
        self._tokenizer: ThreadPoolExecutor | None = None
        #: The policy's chat template, undone on /get_reward (--policy-tokenizer).
        self.policy_template: PolicyTemplate | None = None
        #: Where /score's label sits in a row the scheduler returns (rows of every label's
        #: logit when the model is MultiLabel and the micro-batcher runs it; else one).
        self._label_in_row = 0
        self._labels = ["LABEL_0"]

    @property
    def ready(self) -> bool:
        """True once the model is loaded and the scheduler runs, until draining begins."""
        return (
            self.model is not None
            and self.batcher is not None
            and self.batcher.running
            and not self.draining
        )

    @property
    def max_client_batch(self) -> int:
        """Items per request accepted (a request larger than the queue could never fit)."""
        return self.settings.effective_max_client_batch

    # ------------------------------------------------------------------ lifecycle

    def _compute_thread(self) -> ThreadPoolExecutor:
        """The compute thread (started on first use, until :meth:`stop`)."""
        if self._compute is None:
            self._compute = ThreadPoolExecutor(1, thread_name_prefix=COMPUTE_THREAD_PREFIX)
        return self._compute

    def _load(self) -> Scorer:
        return load_scorer(LoadOptions.from_settings(self.settings), self.engine)

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
        """Load the model now on the compute thread, blocking (the CLI does this before it
        serves, so that a failure is one line and exit 1); raises ModelLoadError."""
        try:
            self._load_policy_template()
            if self.model is None:
                self.model = self._compute_thread().submit(self._load).result()
        except Exception:
            self._end_compute_thread()  # nothing to serve
            raise
        return self.model

    async def start(self) -> None:
        """Load the model if needed (on the compute thread) and start the scheduler."""
        try:
            await self._start()
        except BaseException:
            await self._release()
            raise

    async def _start(self) -> None:
        s = self.settings
        compute = self._compute_thread()
        await asyncio.to_thread(self._load_policy_template)
        if self.model is None:
            self.model = await asyncio.wrap_future(compute.submit(self._load))
        model = self.model
        self._tokenizer = ThreadPoolExecutor(1, thread_name_prefix=TOKENIZER_THREAD_PREFIX)
        self.max_batch_tokens = s.batch_token_budget(model.device, model.max_length)
        limits = BatchLimits(
            max_batch_tokens=self.max_batch_tokens,
            max_batch_size=s.max_batch_size,
            max_wait_ms=s.max_wait_ms,
            max_queue=s.max_queue,
        )
        self.batcher = self._scheduler(model, limits, compute)
        await self.batcher.start()
        self.draining = False
        scheduler = self.batcher
        self.metrics.track_queue(lambda: float(scheduler.queued))
        self.metrics.ready.set_function(lambda: 1.0 if self.ready else 0.0)
        self._warn_limits(model.max_length)

    def _scheduler(
        self, model: Scorer, limits: BatchLimits, compute: ThreadPoolExecutor
    ) -> Scheduler:
        """The engine's own scheduler, or the micro-batcher over the model's passes."""
        if isinstance(model, SelfScheduling):
            if isinstance(model, MultiLabel):
                self._labels = [model.labels[model.label_index]]
            return model.scheduler(limits, self.metrics)
        run: Callable[[list[Sequence[int]]], Sequence[Any]] = model.score_batch
        convert: Callable[[Any], Any] = float
        if isinstance(model, MultiLabel):
            # Every label's logit per row: /score reads its label, /classify wants them all.
            self._label_in_row, self._labels = model.label_index, list(model.labels)
            run, convert = model.logits_batch, _logit_row
        return Batcher(
            run,
            **dataclasses.asdict(limits),
            observer=self.metrics,
            executor=compute,
            convert=convert,
        )

    def _warn_limits(self, max_length: int) -> None:
        """Log the settings that contradict each other."""
        s = self.settings
        if self.max_batch_tokens is not None and max_length > self.max_batch_tokens:
            logger.warning(
                "max_length %d exceeds max_batch_tokens %d: raise --max-batch-tokens or lower "
                "--max-length",
                max_length,
                self.max_batch_tokens,
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
        """Drain: finish queued work, then stop the scheduler and the service's threads."""
        self.begin_drain()
        if self.batcher is not None:
            await self.batcher.stop(drain=True)
        await self._release()

    async def _release(self) -> None:
        """Close a model loaded here (on its thread) and end the service's threads."""
        if self._tokenizer is not None:
            self._tokenizer.shutdown(wait=True)
            self._tokenizer = None
        if self._compute is not None and self._owns_model and self.model is not None:
            model, self.model = self.model, None
            await asyncio.wrap_future(self._compute.submit(model.close))
        self._end_compute_thread()

    def _end_compute_thread(self) -> None:
        if self._compute is not None:
            self._compute.shutdown(wait=True)
            self._compute = None

    # ------------------------------------------------------------------ scoring

    async def score(
        self,
        receive: Receive,
        endpoint: str,
        n_items: int,
        render: Render,
        truncate: bool | None,
    ) -> tuple[list[float], list[Encoded]]:
        """Render, tokenize and score ``n_items`` items; returns scores and encodings.

        ``receive`` is the request's: if the client hangs up, its queued items are dropped.
        """
        rows, encoded = await self.logits(receive, endpoint, render, n_items, truncate=truncate)
        return [row[self._label_in_row] for row in rows], encoded

    @property
    def labels(self) -> list[str]:
        """Names of the labels in the rows :meth:`logits` returns (known once started)."""
        return list(self._labels)

    async def logits(
        self,
        receive: Receive,
        endpoint: str,
        render: Render,
        n_items: int,
        *,
        truncate: bool | None,
        max_tokens: int | None = None,
    ) -> tuple[list[list[float]], list[Encoded]]:
        """Like :meth:`score`, with a row of raw logits per item: every label's when the
        model gives them (:attr:`labels` names them), else the configured label's alone.

        ``max_tokens``: truncate each item to at most this many tokens (vLLM's
        ``truncate_prompt_tokens``); None keeps ``truncate`` and the model's limit.
        """
        # Draining does not refuse work here: after SIGTERM uvicorn accepts no new
        # connections, so whatever still arrives was already in flight and is finished;
        # the scheduler refuses (503) only once it stops, after those requests are done.
        if self.model is None or self.batcher is None:
            raise NotReadyError("the model is loading")
        if n_items > self.max_client_batch:
            raise TooManyItemsError(
                f"{n_items} items in one request; the limit is {self.max_client_batch} "
                f"(split the request)"
            )
        try:
            encoded = await self._encode(self.model, render, truncate, max_tokens)
            values = await _cancel_on_disconnect(
                receive, endpoint, self.batcher.submit([item.input_ids for item in encoded])
            )
            rows = _check_rows(values, len(encoded))
        except KNOWN_ERRORS:  # these answer through the error table
            raise
        except Exception as exc:
            logger.error("scoring failed on %s (%d items)", endpoint, n_items, exc_info=exc)
            raise ScoringError(
                "the reward model failed on this request; the error is in the server log"
            ) from exc
        self.metrics.items.labels(endpoint=endpoint).inc(len(encoded))
        self.metrics.tokens.inc(sum(item.num_tokens for item in encoded))
        self.metrics.truncated.inc(sum(1 for item in encoded if item.truncated))
        return rows, encoded

    async def _encode(
        self, model: Scorer, render: Render, truncate: bool | None, max_tokens: int | None
    ) -> list[Encoded]:
        """Render and tokenize on the tokenizer thread; every item must have a token."""
        assert self._tokenizer is not None
        do_truncate = (not self.settings.no_truncate) if truncate is None else truncate

        def encode() -> list[Encoded]:
            texts = render(model)
            if max_tokens is None:
                return model.encode(texts, truncate=do_truncate)
            return model.encode(texts, truncate=True, max_length=max_tokens)

        encoded = await asyncio.get_running_loop().run_in_executor(self._tokenizer, encode)
        for i, item in enumerate(encoded):
            if item.num_tokens == 0:
                raise EmptyTextError(f"item {i} encodes to no tokens; nothing to score")
        return encoded


def _logit_row(value: Any) -> list[float]:
    """One row of ``logits_batch``: every label's logit as floats."""
    return [float(v) for v in value]


def _check_rows(values: list[Any], expected: int) -> list[list[float]]:
    """One row of finite logits per item (a lone score is a row of one), or RuntimeError
    (a model bug: answered as 500)."""
    if len(values) != expected:
        raise RuntimeError(f"{len(values)} scores for {expected} items")
    rows = [value if isinstance(value, list) else [float(value)] for value in values]
    for i, row in enumerate(rows):
        if not row or not all(math.isfinite(v) for v in row):
            raise RuntimeError(f"non-finite or empty score {row} for item {i}")
    return rows


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
