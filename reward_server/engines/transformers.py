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
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from reward_server.config import LoadOptions
from reward_server.errors import ModelLoadError, load_errors, one_line
from reward_server.text.rendering import Renderer, RendersText, prepare_tokenizer, read_template

logger = logging.getLogger(__name__)

__all__ = ["Loaded", "Network", "NetworkModel", "RewardModel", "load", "load_parts"]

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
# Attribute names under which transformers' sequence-classification models keep their head.
_HEAD_NAMES = ("score", "classifier", "classification_head")
# model_max_length above this is transformers' "unknown" sentinel (VERY_LARGE_INTEGER).
_SANE_MAX_LENGTH = 10_000_000


def load(options: LoadOptions) -> RewardModel:
    """The engine's entry point (see :mod:`reward_server.engines`)."""
    return RewardModel.from_options(options)


# ---------------------------------------------------------------------- loading, step by step


def _resolve_device(device: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu; anything else is validated."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise ModelLoadError(f"invalid device {device!r}: {one_line(exc)}") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {device!r} requested but CUDA is not available")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ModelLoadError(
                f"device {device!r} requested but only {torch.cuda.device_count()} GPU(s) exist"
            )
    return dev


def _resolve_dtype(dtype: str, device: torch.device, config: Any) -> torch.dtype:
    """Pick the compute dtype.

    ``auto``: float32 on CPU. Without native bfloat16 (AVX512-BF16 or AMX) bf16 is emulated
    and about 7x slower; with it, bf16 scored 1.8x faster on a Zen 4 CPU (AVX512-BF16), but
    its scores moved by up to 3.5 % of their spread and by 2.4e-4 between a text alone and
    in a batch (float32: 2e-8), so float32 stays the CPU's default and ``--dtype bfloat16``
    the user's choice (BENCHMARKS.md, "bfloat16 on the CPU"). On CUDA, a bf16 or fp16
    checkpoint keeps its dtype; a float32 (or unknown) checkpoint runs in bf16. bf16 falls
    back to fp16 on GPUs without bf16 support.
    """
    if dtype != "auto":
        if dtype not in _DTYPES:
            raise ModelLoadError(
                f"invalid dtype {dtype!r}; choose auto, {', '.join(sorted(_DTYPES))}"
            )
        return _DTYPES[dtype]
    if device.type == "cpu" and _cpu_has_native_bf16():
        logger.info(
            "CPU has native bfloat16 (AVX512-BF16/AMX), but --dtype auto scores in float32 "
            "for exact scores (--dtype bfloat16 trades precision for speed)"
        )
    elif device.type == "cpu":
        logger.info("CPU has no native bfloat16 (no AVX512-BF16/AMX): --dtype auto: float32")
    if device.type != "cuda":
        return torch.float32
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(stored, str):
        stored = _DTYPES.get(stored)
    if stored == torch.float16:
        return torch.float16
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def _cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX, by torch's probes (absent from a torch build: not there)."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def _looks_local(model: str) -> bool:
    """True when ``model`` can only be a filesystem path (not a hub id ``name`` / ``org/name``)."""
    return (
        model.startswith(("/", ".", "~"))
        or model.count("/") > 1
        or (os.sep != "/" and os.sep in model)
    )


def _check_options(options: LoadOptions) -> None:
    """Reject option values no model could take."""
    if options.truncation_side not in ("left", "right"):
        raise ModelLoadError(
            f"truncation_side must be 'left' or 'right', not {options.truncation_side!r}"
        )
    if options.max_length is not None and options.max_length < 1:
        raise ModelLoadError(f"max_length must be positive, not {options.max_length}")


def _source(model: str) -> str:
    """Where to load ``model`` from: an existing folder, or a hub id (from the local cache
    when offline)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return str(path)
    if path.exists():
        raise ModelLoadError(f"model path {model!r} is a file, not a model folder")
    if _looks_local(model):
        raise ModelLoadError(f"model folder not found: {model}")
    return model


def _load_config(source: str, options: LoadOptions) -> Any:
    """The model's config, as transformers reads it."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source, trust_remote_code=options.trust_remote_code)
    except Exception as exc:
        raise ModelLoadError(
            f"cannot read model config of {options.model!r}: {one_line(exc)}"
        ) from exc


def _read_config(source: str, options: LoadOptions) -> Any:
    """The model's config; a known architecture must be a sequence classifier (unless an
    adapter brings the head)."""
    config = _load_config(source, options)
    archs = list(getattr(config, "architectures", None) or [])
    classifies = any(a.endswith("ForSequenceClassification") for a in archs)
    if archs and not options.adapter and not classifies:
        raise ModelLoadError(
            f"{options.model!r} is not a sequence-classification model (architectures: "
            f"{', '.join(archs)}); its score head would be random"
        )
    return config


def _load_tokenizer(source: str, options: LoadOptions, template: str | None) -> Any:
    """The model's tokenizer, with a pad token and the chat template asked for."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            source, trust_remote_code=options.trust_remote_code
        )
    except Exception as exc:
        raise ModelLoadError(
            f"cannot load tokenizer of {options.model!r}: {one_line(exc)}"
        ) from exc
    prepare_tokenizer(
        tokenizer, name=options.model, chat_template=options.chat_template, template=template
    )
    return tokenizer


def _load_network(
    source: str,
    options: LoadOptions,
    config: Any,
    dtype: torch.dtype,
    auto_class: Any = None,
    kind: str = "sequence-classification",
) -> tuple[torch.nn.Module, str | None]:
    """The ``kind`` network (loaded with ``auto_class``, by default the sequence classifier),
    and the name of its head when the checkpoint lacks the head's weights (only an adapter
    may then provide them)."""
    from transformers import AutoModelForSequenceClassification

    auto = auto_class or AutoModelForSequenceClassification
    try:
        net, loading_info = auto.from_pretrained(
            source,
            dtype=dtype,
            trust_remote_code=options.trust_remote_code,
            output_loading_info=True,
        )
    except ValueError as exc:
        msg = one_line(exc)
        if "Unrecognized configuration class" in msg:
            raise ModelLoadError(
                f"{options.model!r} ({type(config).__name__}) has no {kind} architecture "
                "in transformers"
            ) from exc
        raise ModelLoadError(f"cannot load model {options.model!r}: {msg}") from exc
    head = _find_head(net)
    missing = list(loading_info.get("missing_keys", []) or [])
    head_missing = head is not None and any(k.split(".")[0] == head[0] for k in missing)
    if head is None or not head_missing:
        return net, None
    if not options.adapter:
        raise ModelLoadError(
            f"{options.model!r} has no trained score head ({head[0]} weights missing from the "
            "checkpoint)"
        )
    return net, head[0]


def _check_labels(net: torch.nn.Module, tokenizer: Any, label_index: int) -> None:
    """Give the configs the pad id (transformers' pooling needs it); check ``label_index``."""
    for cfg in {id(c): c for c in (net.config, net.config.get_text_config())}.values():
        cfg.pad_token_id = tokenizer.pad_token_id
    num_labels = int(net.config.num_labels)
    if not 0 <= label_index < num_labels:
        raise ModelLoadError(
            f"label_index {label_index} out of range: the model has {num_labels} label(s)"
        )


def _ready_network(
    net: torch.nn.Module, options: LoadOptions, head_needed: str | None, device: torch.device
) -> torch.nn.Module:
    """The adapter applied (if any), on ``device``, in eval mode, without gradients."""
    if options.adapter:
        # A base LM + a SEQ_CLS adapter that carries the trained head is a valid set-up.
        net = _load_adapter(
            net, options.adapter, merge=options.merge_adapter, head_needed=head_needed
        )
    net.to(device)
    net.eval()
    for param in net.parameters():
        param.requires_grad_(False)
    return net


def _position_limit(config: Any) -> int | None:
    """The model's hard or trained position limit, if its config states one."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for attr in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(text_config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _max_length(net: torch.nn.Module, tokenizer: Any, options: LoadOptions) -> int:
    """``options.max_length``, or the smaller of the model's and the tokenizer's limits."""
    tok_limit = tokenizer.model_max_length
    sane_tok = isinstance(tok_limit, int) and 0 < tok_limit < _SANE_MAX_LENGTH
    limits = [x for x in (_position_limit(net.config), tok_limit if sane_tok else None) if x]
    model_limit = min(limits) if limits else None
    if options.max_length is None:
        if model_limit is None:
            raise ModelLoadError(
                f"cannot tell the maximum length of {options.model!r}; pass max_length"
            )
        return model_limit
    if model_limit is not None and options.max_length > model_limit:
        logger.warning(
            "max_length %d exceeds the model's limit %d; long texts may fail or degrade",
            options.max_length,
            model_limit,
        )
    return options.max_length


def _find_head(model: torch.nn.Module) -> tuple[str, torch.nn.Module] | None:
    """The classification head module of a (possibly PEFT-wrapped) model."""
    candidates = [model]
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base):
        candidates.insert(0, get_base())
    for root in candidates:
        for name in _HEAD_NAMES:
            head = getattr(root, name, None)
            if isinstance(head, torch.nn.Module):
                return name, head
    return None


def _load_adapter(
    net: torch.nn.Module, adapter: str, *, merge: bool, head_needed: str | None = None
) -> torch.nn.Module:
    """Wrap ``net`` with a PEFT adapter, optionally merged; ``head_needed``: it must carry it."""
    from peft import PeftConfig, PeftModel

    path = Path(adapter).expanduser()
    if not path.is_dir() and _looks_local(adapter):
        raise ModelLoadError(f"adapter folder not found: {adapter}")
    source = str(path) if path.is_dir() else adapter
    try:
        peft_config = PeftConfig.from_pretrained(source)
    except Exception as exc:
        raise ModelLoadError(f"cannot read adapter config {adapter!r}: {one_line(exc)}") from exc
    task = getattr(peft_config, "task_type", None)
    if task is not None and str(getattr(task, "value", task)) != "SEQ_CLS":
        logger.warning("adapter %s has task_type %s, not SEQ_CLS", adapter, task)
    if head_needed is not None and head_needed not in (peft_config.modules_to_save or []):
        raise ModelLoadError(
            f"the base model has no trained {head_needed!r} head and adapter {adapter!r} "
            "does not provide one (modules_to_save)"
        )
    try:
        wrapped = PeftModel.from_pretrained(net, source, is_trainable=False)
    except Exception as exc:
        raise ModelLoadError(f"cannot load adapter {adapter!r}: {one_line(exc)}") from exc
    if merge:
        try:
            return wrapped.merge_and_unload()
        except Exception as exc:
            raise ModelLoadError(f"cannot merge adapter {adapter!r}: {one_line(exc)}") from exc
    return wrapped


class Loaded(NamedTuple):
    """The loaded parts of a model, ready on its device."""

    net: torch.nn.Module
    tokenizer: Any
    #: The network's class before an adapter wraps it.
    architecture: str
    device: torch.device
    dtype: torch.dtype
    max_length: int

    def network(self, renderer: Renderer, adapter: str | None) -> Network:
        """The network with its renderer, as the models take it."""
        return Network(self.net, renderer, adapter, self.architecture, self.device, self.dtype)


#: Picks the transformers class that loads a model from its config (None: the sequence
#: classifier, after checking the config names one).
AutoClass = Callable[[Any, LoadOptions], Any]


def load_parts(
    options: LoadOptions, auto_class: AutoClass | None = None, kind: str = "sequence-classification"
) -> Loaded:
    """The steps of loading, in the order that fails cheapest first: options, device,
    template, config, tokenizer, the ``kind`` network (with its adapter) and its max length."""
    _check_options(options)
    source = _source(options.model)
    device = _resolve_device(options.device)
    template = read_template(options.chat_template)
    if auto_class is None:
        config, auto = _read_config(source, options), None
    else:
        config = _load_config(source, options)
        auto = auto_class(config, options)
    dtype = _resolve_dtype(options.dtype, device, config)
    tokenizer = _load_tokenizer(source, options, template)
    net, head_needed = _load_network(source, options, config, dtype, auto, kind)
    architecture = type(net).__name__
    _check_labels(net, tokenizer, options.label_index)
    net = _ready_network(net, options, head_needed, device)
    max_length = _max_length(net, tokenizer, options)
    return Loaded(net, tokenizer, architecture, device, dtype, max_length)


def _pad(batch: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged rows -> right-padded ids ``(B, T)`` and the row lengths ``(B,)``."""
    # numpy.fromiter reads the ragged rows ~20x faster than torch.tensor on Python lists.
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


@dataclass(frozen=True, slots=True)
class Network:
    """A loaded network with what it was loaded as and with."""

    model: torch.nn.Module
    renderer: Renderer
    adapter: str | None
    architecture: str
    device: torch.device
    dtype: torch.dtype


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
        )
        # After PEFT wrapping/merging, the head to hook is whatever module now sits there.
        found = _find_head(loaded.net)
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
