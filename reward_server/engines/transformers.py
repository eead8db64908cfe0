"""The transformers engine: a sequence-classification model run with torch, in process.

This module knows torch and transformers, never HTTP; rendering and tokenizing are
:mod:`reward_server.text.rendering`'s. The scoring rule it adds: decoder models are scored at the
last *real* token of each row, found from the attention mask (right padding, so index
``attention_mask.sum(-1) - 1``). A forward hook on the score head captures its per-token
output ``(B, T, L)``; transformers' own pooling (rightmost token that differs from the pad
id) is ignored because it is wrong when pad == eos and a text ends in EOS. Encoder heads
that already pool (``(B, L)``) are used as they are.

Everything runs on the calling thread. The server calls :func:`load` and every
:meth:`RewardModel.score_batch` on its one compute thread; a library user may call them from
any thread (concurrent calls are safe: the head's output is kept per thread).
"""

from __future__ import annotations

import inspect
import itertools
import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from reward_server.config import LoadOptions
from reward_server.engines._checkpoint import Loaded, Network, find_head, load_parts
from reward_server.errors import ModelLoadError, load_errors
from reward_server.text.messages import MessageOptions
from reward_server.text.rendering import Renderer, RendersText

logger = logging.getLogger(__name__)

__all__ = ["Loaded", "Network", "NetworkModel", "RewardModel", "load", "load_parts"]


def load(options: LoadOptions) -> RewardModel:
    """The engine's entry point (see :mod:`reward_server.engines`)."""
    return RewardModel.from_options(options)


def _pad(batch: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged rows -> right-padded ids ``(B, T)`` and the row lengths ``(B,)``."""
    # numpy.fromiter reads ragged rows far faster than torch.tensor on nested Python lists.
    n_rows = len(batch)
    lengths = np.fromiter(map(len, batch), dtype=np.int64, count=n_rows)
    if int(lengths.min()) < 1:
        raise ValueError("cannot score an empty row")
    flat = np.fromiter(
        itertools.chain.from_iterable(batch), dtype=np.int64, count=int(lengths.sum())
    )
    # (B, T) mask of real tokens, right padding; filled row-major from the flat ids.
    mask = np.arange(int(lengths.max()))[None, :] < lengths[:, None]
    ids = np.full(mask.shape, pad_id, dtype=np.int64)
    ids[mask] = flat
    return torch.from_numpy(ids), torch.from_numpy(lengths)


# ---------------------------------------------------------------------- the model


def _label_names(config: Any, num_labels: int) -> list[str]:
    """Label names by index (the config's ``id2label``, else ``LABEL_i``)."""
    id2label = getattr(config, "id2label", None) or {}
    return [str(id2label.get(i, f"LABEL_{i}")) for i in range(num_labels)]


class NetworkModel(RendersText):
    """What the models this engine runs share: a network on its device with its renderer,
    one forward pass, the facts for /info, and closing."""

    #: What the model is, in the error after :meth:`close`.
    kind = "reward model"

    def __init__(self, network: Network) -> None:
        model = network.model
        self._model: torch.nn.Module | None = model
        self.rendering = network.renderer
        self.name = self.rendering.name
        self.tokenizer = self.rendering.tokenizer  # read-only use
        self.max_length = self.rendering.max_length
        self.truncation_side = self.rendering.truncation_side
        self.adapter = network.adapter
        self.architecture = network.architecture
        self.dtype = str(network.dtype).removeprefix("torch.")
        self.device = str(network.device)
        self._torch_device = network.device
        # Decoders build a KV cache by default; scoring never reuses it.
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        accepts_cache = "use_cache" in inspect.signature(base.forward).parameters
        self._forward_kwargs: dict[str, Any] = {"use_cache": False} if accepts_cache else {}

    @property
    def model(self) -> torch.nn.Module:
        """The underlying torch module (read-only use)."""
        if self._model is None:
            raise RuntimeError(f"{self.kind} {self.name!r} is closed")
        return self._model

    def _call(self, ids: torch.Tensor, mask: torch.Tensor) -> Any:
        """The network's output of one forward pass over ``(B, T)`` ids and mask."""
        return self.model(
            input_ids=ids.to(self._torch_device),
            attention_mask=mask.to(self._torch_device),
            **self._forward_kwargs,
        )

    def _probe_row(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A tiny row (the special tokens around two pads) and its mask, for a probe pass."""
        r = self.rendering
        ids = [*r.prefix, r.pad_token_id, r.pad_token_id, *r.suffix]
        return torch.tensor([ids]), torch.ones(1, len(ids)).long()

    def network_info(self) -> dict[str, object]:
        """The rendering and network part of GET /info."""
        return {
            **self.rendering_info(),
            "adapter": self.adapter,
            "architecture": self.architecture,
            "dtype": self.dtype,
            "device": self.device,
        }

    def close(self) -> None:
        """Drop the network (scoring after it raises)."""
        self._model = None
        if self._torch_device.type == "cuda":
            torch.cuda.empty_cache()


class RewardModel(NetworkModel):
    """A sequence-classification reward model with its tokenizer, ready to score text."""

    def __init__(self, network: Network, *, label_index: int, head: torch.nn.Module | None) -> None:
        super().__init__(network)
        config = network.model.config
        self.num_labels: int = int(config.num_labels)
        self.labels: list[str] = _label_names(config, self.num_labels)
        self.label_index = label_index
        # The head's output of the pass running on each thread (passes may run concurrently).
        self._captured = threading.local()
        self._hook = head.register_forward_hook(self._capture_head) if head is not None else None
        # A probe forward: checks the model runs and tells per-token heads from pooled ones.
        self.is_decoder: bool = self._probe_is_decoder()

    @classmethod
    def load(cls, model: str, **options: Any) -> RewardModel:
        """Load tokenizer, model and optional PEFT adapter on the calling thread.

        ``options``: the other fields of :class:`~reward_server.engines.LoadOptions`
        (adapter, merge_adapter, dtype, device, max_length, truncation_side, label_index,
        chat_template, trust_remote_code). Raises ModelLoadError on failure.
        """
        return cls.from_options(LoadOptions(model=model, **options))

    @classmethod
    def from_options(cls, options: LoadOptions) -> RewardModel:
        """:meth:`load` with the options as one value; any failure is a ModelLoadError."""
        with load_errors(options.model):
            return cls._build(options)

    @classmethod
    def _build(cls, options: LoadOptions) -> RewardModel:
        """Load the network, then the renderer and the head to read."""
        loaded = load_parts(options)
        renderer = Renderer(
            loaded.tokenizer,
            name=options.model,
            max_length=loaded.max_length,
            truncation_side=options.truncation_side,
            messages=MessageOptions.of(options),
        )
        # After PEFT wrapping/merging, the head to hook is whatever module now sits there.
        found = find_head(loaded.net)
        if found is None:
            logger.warning(
                "no score head found on %s; using the model's own pooled logits",
                loaded.architecture,
            )
        rm = cls(
            loaded.network(renderer, options.adapter),
            label_index=options.label_index,
            head=found[1] if found else None,
        )
        rm._log_loaded(options)
        return rm

    def _log_loaded(self, options: LoadOptions) -> None:
        adapter = options.adapter
        logger.info(
            "loaded %s (%s%s) on %s in %s, max_length %d, %s",
            self.name,
            self.architecture,
            f" + adapter {adapter}" + (" merged" if options.merge_adapter else "")
            if adapter
            else "",
            self.device,
            self.dtype,
            self.max_length,
            "decoder (last-token head)" if self.is_decoder else "encoder (pooled head)",
        )

    # ------------------------------------------------------------------ scoring

    def _capture_head(self, _module: torch.nn.Module, _args: Any, output: Any) -> None:
        """Forward hook: keep the score head's output of this thread's forward pass."""
        self._captured.out = output if isinstance(output, torch.Tensor) else None

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[Any, torch.Tensor | None]:
        """One forward pass: the model's output and the head's output it produced."""
        self._captured.out = None
        try:
            out = self._call(ids, mask)
            return out, self._captured.out
        finally:
            self._captured.out = None

    def _probe_is_decoder(self) -> bool:
        """Run one tiny forward; a per-token head output ``(B, T, L)`` means a decoder."""
        ids, mask = self._probe_row()
        with torch.inference_mode():
            out, head_out = self._forward(ids, mask)
        logits = out.logits if hasattr(out, "logits") else out[0]
        if logits.shape[-1] != self.num_labels:
            raise ModelLoadError(
                f"model outputs {logits.shape[-1]} logits but config says {self.num_labels} labels"
            )
        return head_out is not None and head_out.dim() == 3 and head_out.shape[1] == ids.shape[1]

    @torch.inference_mode()
    def _logits(self, batch: Sequence[Sequence[int]]) -> torch.Tensor:
        """Every label's logit ``(B, L)`` of token-id rows, in one right-padded pass."""
        ids, lengths = _pad(batch, self.rendering.pad_token_id)
        n_rows, width = ids.shape
        mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
        out, head_out = self._forward(ids, mask)
        if not self.is_decoder:
            return out.logits if hasattr(out, "logits") else out[0]  # (B, L) pooled
        if head_out is None or head_out.dim() != 3 or head_out.shape[:2] != (n_rows, width):
            shape = None if head_out is None else tuple(head_out.shape)
            raise RuntimeError(f"score head output {shape} is not per-token (B, T, L)")
        # head_out: (B, T, L); the last real token of row b sits at lengths[b] - 1.
        last = (lengths - 1).to(head_out.device)
        return head_out[torch.arange(n_rows, device=head_out.device), last]

    def score_batch(self, batch: Sequence[Sequence[int]]) -> list[float]:
        """Score token-id rows in one right-padded forward pass; floats in input order."""
        if not batch:
            return []
        return self._logits(batch)[:, self.label_index].float().cpu().tolist()

    def logits_batch(self, batch: Sequence[Sequence[int]]) -> list[list[float]]:
        """Like :meth:`score_batch`, with every label's raw logit per row."""
        if not batch:
            return []
        return self._logits(batch).float().cpu().tolist()

    def info(self) -> dict[str, object]:
        """Static facts about the loaded model, for GET /info."""
        return {
            **self.network_info(),
            "num_labels": self.num_labels,
            "label_index": self.label_index,
        }

    def close(self) -> None:
        """Drop the head hook and the network (scoring after it raises)."""
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        super().close()
