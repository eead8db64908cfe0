"""Process reward models (PRMs) run with torch, in process: a token classifier gives every
token a step score, and :mod:`reward_server.text.steps` says which tokens are the steps.

Not an engine of its own (``--engine`` names what runs the sequence models): the server
loads a ``kind: process`` model with :func:`load`. Loading takes the transformers engine's
steps (device, dtype, tokenizer, adapter, max length) with a token-classification network:
``AutoModelForTokenClassification``, or with ``trust_remote_code`` the model's own class
when its config maps ``AutoModel`` to it (Qwen2.5-Math-PRM's ``Qwen2ForProcessRewardModel``).

A token's step score: with two labels, the probability of label 1 (softmax over the two
logits, as Qwen2.5-Math-PRM reads its ``<extra_0>`` tokens); with one label, its raw logit.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from reward_server.config import LoadOptions
from reward_server.engines._checkpoint import Network, load_parts
from reward_server.engines.transformers import NetworkModel, _label_names, _pad
from reward_server.errors import ModelLoadError, load_errors
from reward_server.text.messages import MessageOptions
from reward_server.text.steps import (
    StepEncoded,
    StepOptions,
    StepRenderer,
    StepResult,
    step_results,
)

logger = logging.getLogger(__name__)

__all__ = ["ProcessRewardModel", "load"]


def load(options: LoadOptions, steps: StepOptions | None = None) -> ProcessRewardModel:
    """Load the process reward model of ``options`` on the calling thread."""
    return ProcessRewardModel.from_options(options, steps or StepOptions())


def _auto_class(config: Any, options: LoadOptions) -> Any:
    """The transformers class that loads the model as a per-token scorer."""
    from transformers import AutoModel, AutoModelForTokenClassification

    archs = list(getattr(config, "architectures", None) or [])
    auto_map = getattr(config, "auto_map", None) or {}
    if not archs or options.adapter or any(a.endswith("ForTokenClassification") for a in archs):
        return AutoModelForTokenClassification
    if "AutoModelForTokenClassification" in auto_map:
        return AutoModelForTokenClassification
    if "AutoModel" in auto_map:
        # The model's own class (its code ships with the checkpoint), e.g. a PRM head.
        if not options.trust_remote_code:
            raise ModelLoadError(
                f"{options.model!r} ({', '.join(archs)}) is loaded by its own code "
                f"({auto_map['AutoModel']}): pass --trust-remote-code if you trust it"
            )
        return AutoModel
    raise ModelLoadError(
        f"{options.model!r} is not a token-classification model (architectures: "
        f"{', '.join(archs)}); a process model needs a score per token"
    )


class ProcessRewardModel(NetworkModel):
    """A token-classification reward model with its tokenizer: step scores per response.

    Items are encoded by :attr:`rendering` (``encode_pairs``, ``encode_conversations``), their
    rows scored per token by :meth:`token_scores`, and their steps read with
    :func:`~reward_server.text.steps.step_results` (:meth:`score_steps` does all three).
    """

    kind = "process model"
    rendering: StepRenderer

    def __init__(self, network: Network) -> None:
        super().__init__(network)
        self.steps = self.rendering.steps
        # A probe forward: checks the model runs and gives a score per token.
        self.num_labels = self._probe()
        self.labels = _label_names(network.model.config, self.num_labels)

    @classmethod
    def from_options(cls, options: LoadOptions, steps: StepOptions) -> ProcessRewardModel:
        """Load the model; any failure is a ModelLoadError with a one-line reason."""
        with load_errors(options.model):
            return cls._build(options, steps)

    @classmethod
    def _build(cls, options: LoadOptions, steps: StepOptions) -> ProcessRewardModel:
        """The transformers engine's loading steps, with a per-token network."""
        loaded = load_parts(options, _auto_class, kind="token-classification")
        renderer = StepRenderer(
            loaded.tokenizer,
            name=options.model,
            max_length=loaded.max_length,
            truncation_side=options.truncation_side,
            steps=steps,
            messages=MessageOptions.of(options),
        )
        prm = cls(loaded.network(renderer, options.adapter))
        logger.info(
            "loaded process model %s (%s, %d label(s)) on %s in %s, max_length %d, steps: %s",
            prm.name,
            prm.architecture,
            prm.num_labels,
            prm.device,
            prm.dtype,
            prm.max_length,
            renderer.info(),
        )
        return prm

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Per-token logits ``(B, T, L)`` of one forward pass."""
        out = self._call(ids, mask)
        return out.logits if hasattr(out, "logits") else out[0]

    def _probe(self) -> int:
        """Run one tiny forward; the number of labels of its per-token logits (1 or 2)."""
        ids, mask = self._probe_row()
        with torch.inference_mode():
            logits = self._forward(ids, mask)
        shape = tuple(logits.shape)
        if len(shape) != 3 or shape[1] != ids.shape[1] or shape[2] not in (1, 2):
            raise ModelLoadError(
                f"{self.name!r} outputs logits of shape {shape} for {ids.shape[1]} tokens; a "
                "process model needs per-token logits of 1 or 2 labels"
            )
        return shape[2]

    @torch.inference_mode()
    def token_scores(self, batch: Sequence[Sequence[int]]) -> list[list[float]]:
        """The step score of every token of each row of token ids, in one right-padded pass
        (a row's scores do not depend on the other rows)."""
        if not batch:
            return []
        ids, lengths = _pad(batch, self.rendering.pad_token_id)
        mask = (torch.arange(ids.shape[1])[None, :] < lengths[:, None]).long()
        logits = self._forward(ids, mask).float()  # (B, T, L)
        # Two labels: P(label 1) = softmax over the pair; one label: the raw logit.
        scores = logits.softmax(-1)[..., 1] if self.num_labels == 2 else logits[..., 0]  # (B, T)
        rows = scores.cpu().tolist()
        return [row[:n] for row, n in zip(rows, lengths.tolist(), strict=True)]

    def score_steps(self, items: Sequence[StepEncoded]) -> list[StepResult]:
        """Score encoded items in one pass: step scores, their ends and the item's score."""
        rows = self.token_scores([item.encoded.input_ids for item in items])
        return step_results(rows, items, self.steps.aggregate)

    def info(self) -> dict[str, object]:
        """Static facts about the loaded model, for GET /info."""
        return {
            **self.network_info(),
            **self.rendering.info(),
            "kind": "process",
            "num_labels": self.num_labels,
            "labels": list(self.labels),
            # The label a step score comes from: label 1's probability, or the one logit.
            "label_index": self.num_labels - 1,
        }
