"""Engines: what runs the reward model behind the server, picked by name at start-up.

An engine is a module of this package (``engines/<name>.py``) with a function
``load(options: LoadOptions) -> Scorer``; adding an engine is adding a file. The server uses
a :class:`Scorer` only through this protocol, on the compute thread its model registry owns:

* the registry calls ``load`` on its compute thread (one thread for every torch call: see
  :mod:`reward_server.scoring.registry`), renders and tokenizes with ``render_*``/``encode`` on its
  tokenizer thread, and hands token ids to a scheduler (:mod:`reward_server.scheduling`);
* engines only run rows: the micro-batcher calls ``score_batch`` (or ``logits_batch``) on the
  compute thread; an engine that batches by itself (continuous batching in an async engine)
  is a :class:`~reward_server.scheduling.RowRunner` (``run_rows``) and gets every request's
  rows as they come. Queues, batch windows and tenant turns are the scheduling layer's.

No torch here: importing the package does not import an engine.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from reward_server.config import LoadOptions
from reward_server.engines._generation import GenerationRow
from reward_server.errors import ModelLoadError
from reward_server.text.rendering import Encoded, ItemTools

if TYPE_CHECKING:
    from reward_server.text.steps import StepOptions, StepScorer

__all__ = [
    "DEFAULT_ENGINE",
    "Engine",
    "GenerationRow",
    "MultiLabel",
    "Scorer",
    "available_engines",
    "engine_module",
    "load_process_scorer",
    "load_scorer",
]

DEFAULT_ENGINE = "transformers"


class Scorer(Protocol):
    """A loaded reward model as the server uses it."""

    #: The model served (answers carry it), its device (``cpu``, ``cuda:0``) and the most
    #: tokens it scores per text.
    name: str
    device: str
    max_length: int

    def render_pairs(
        self, queries: Sequence[str], responses: Sequence[str], tools: ItemTools = None
    ) -> list[str]:
        """Query/response pairs (with each one's tools) as texts (the chat template, or
        joined without one)."""
        ...

    def render_conversations(
        self, conversations: Sequence[Sequence[Mapping[str, Any]]], tools: ItemTools = None
    ) -> list[str]:
        """Conversations (with each one's tools) as texts (ChatTemplateError without a
        template)."""
        ...

    def encode(
        self, texts: Sequence[str], *, truncate: bool, max_length: int | None = None
    ) -> list[Encoded]:
        """Texts as token ids (truncated, or TextTooLongError); ``max_length`` tightens the
        limit for this call (the server passes it only when a request asks)."""
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
    answer with all labels); the server then batches ``logits_batch`` and reads the
    configured label from it for ``/score``."""

    num_labels: int
    label_index: int
    #: Label names by index (the model's ``id2label``).
    labels: list[str]

    def logits_batch(self, batch: Sequence[Sequence[int]]) -> list[list[float]]:
        """Every label's raw logit per row of token ids, in order."""
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
    module = importlib.import_module(f"{__name__}._process_reward")
    return cast("StepScorer", module.load(options, steps))
