"""Engines: what runs the reward model behind the server, picked by name at start-up.

An engine is a module of this package (``engines/<name>.py``) with a function
``load(options: LoadOptions) -> Scorer``; adding an engine is adding a file. The service uses
a :class:`Scorer` only through this protocol, on the compute thread the service owns:

* the service calls ``load`` on its compute thread (one thread for every torch call: see
  :mod:`reward_server.service`), renders and tokenizes with ``render_*``/``encode`` on its
  tokenizer thread, and hands token ids to a :class:`Scheduler`;
* by default that scheduler is the server's micro-:class:`~reward_server.batcher.Batcher`,
  which calls ``score_batch`` on the compute thread; an engine that batches by itself
  (continuous batching in an async engine) offers ``scheduler(limits, observer)`` instead
  (:class:`SelfScheduling`) and gets every request's rows as they come.

No torch here: importing the package does not import an engine.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast, runtime_checkable

from reward_server.exceptions import ModelLoadError
from reward_server.rendering import Encoded

if TYPE_CHECKING:
    from reward_server.batcher import BatchLimits, BatchObserver
    from reward_server.config import ServerSettings
    from reward_server.steps import StepOptions, StepScorer

__all__ = [
    "DEFAULT_ENGINE",
    "Engine",
    "LoadOptions",
    "MultiLabel",
    "Scheduler",
    "Scorer",
    "SelfScheduling",
    "available_engines",
    "engine_module",
    "load_process_scorer",
    "load_scorer",
]

DEFAULT_ENGINE = "transformers"


@dataclass(frozen=True, slots=True)
class LoadOptions:
    """What to load and how: the model-related server settings (same names and meaning)."""

    model: str
    adapter: str | None = None
    merge_adapter: bool = False
    dtype: str = "auto"
    device: str = "auto"
    max_length: int | None = None
    truncation_side: str = "left"
    label_index: int = 0
    chat_template: str = "auto"
    trust_remote_code: bool = False
    # Settings of engines that run the model elsewhere (vLLM); the transformers engine
    # ignores them.
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    engine_arg: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> LoadOptions:
        """The options named by the server's settings."""
        names = {f.name for f in dataclasses.fields(cls)}
        values = settings.model_dump(include=names)
        values["engine_arg"] = tuple(values.get("engine_arg", ()))
        return cls(**values)


class Scorer(Protocol):
    """A loaded reward model as the service uses it."""

    #: The model served (answers carry it), its device (``cpu``, ``cuda:0``) and the most
    #: tokens it scores per text.
    name: str
    device: str
    max_length: int

    def render_pairs(self, queries: Sequence[str], responses: Sequence[str]) -> list[str]:
        """Query/response pairs as texts (the chat template, or joined without one)."""
        ...

    def render_conversations(
        self, conversations: Sequence[Sequence[Mapping[str, str]]]
    ) -> list[str]:
        """Conversations as texts (ChatTemplateError without a template)."""
        ...

    def encode(
        self, texts: Sequence[str], *, truncate: bool, max_length: int | None = None
    ) -> list[Encoded]:
        """Texts as token ids (truncated, or TextTooLongError); ``max_length`` tightens the
        limit for this call (the service passes it only when a request asks)."""
        ...

    def score_batch(self, batch: Sequence[Sequence[int]]) -> list[float]:
        """One score per row of token ids (the configured label's raw logit), in order."""
        ...

    def info(self) -> dict[str, object]:
        """Static facts for GET /info (model, adapter, architecture, labels, dtype, ...)."""
        ...

    def close(self) -> None:
        """Release the model (memory, devices); no scoring after it."""
        ...


@runtime_checkable
class MultiLabel(Protocol):
    """A scorer that also gives every label's raw logit per row (the vLLM and TEI shapes
    answer with all labels); the service then batches ``logits_batch`` and reads the
    configured label from it for ``/score``."""

    num_labels: int
    label_index: int
    #: Label names by index (the model's ``id2label``).
    labels: list[str]

    def logits_batch(self, batch: Sequence[Sequence[int]]) -> list[list[float]]:
        """Every label's raw logit per row of token ids, in order."""
        ...


class Scheduler(Protocol):
    """Takes the token-id rows of every request and returns their scores, in order:
    admission (the queue limit, QueueFullError), batching and the passes."""

    @property
    def running(self) -> bool:
        """True once started and until stop() begins."""
        ...

    @property
    def queued(self) -> int:
        """Items admitted and not yet started."""
        ...

    async def start(self) -> None:
        """Start taking work (on the running event loop)."""
        ...

    async def stop(self, *, drain: bool = True) -> None:
        """Refuse new work; finish (drain) or fail what is queued."""
        ...

    async def submit(self, items: Sequence[Sequence[int]]) -> list[float]:
        """Scores of ``items``, all or nothing (cancelling drops the unstarted ones)."""
        ...


@runtime_checkable
class SelfScheduling(Protocol):
    """A scorer that batches by itself: the service submits to its scheduler, no batcher."""

    def scheduler(self, limits: BatchLimits, observer: BatchObserver) -> Scheduler:
        """A scheduler that keeps ``limits.max_queue`` and reports its passes."""
        ...


class Engine(Protocol):
    """An engine module: ``engines/<name>.py``."""

    def load(self, options: LoadOptions) -> Scorer:
        """Load the model (raises ModelLoadError with a one-line reason)."""
        ...


def available_engines() -> list[str]:
    """The engines of this package, by name."""
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def engine_module(name: str) -> Engine:
    """The module of engine ``name`` (imported now; ValueError for an unknown name)."""
    if name not in available_engines():
        raise ValueError(f"unknown engine {name!r}; choose {', '.join(available_engines())}")
    return cast("Engine", importlib.import_module(f"{__name__}.{name}"))


def load_scorer(options: LoadOptions, engine: str = DEFAULT_ENGINE) -> Scorer:
    """Load the reward model of ``options`` with ``engine``, on the calling thread."""
    return engine_module(engine).load(options)


def load_process_scorer(
    options: LoadOptions, steps: StepOptions, engine: str = DEFAULT_ENGINE
) -> StepScorer:
    """Load the process reward model (a token classifier) of ``options`` on the calling
    thread; the transformers engine runs them (ModelLoadError for another engine)."""
    if engine != DEFAULT_ENGINE:
        raise ModelLoadError(
            f"process reward models run on the {DEFAULT_ENGINE} engine, not {engine!r}"
        )
    module = importlib.import_module(f"{__name__}._process")
    return cast("StepScorer", module.load(options, steps))
