"""Loading a transformers checkpoint, step by step, for the engines that run one: options,
device, dtype, config, tokenizer, the network with its adapter, its max length. The
transformers engine (:mod:`.transformers`), the process reward models (:mod:`._process_reward`)
and the vLLM engine's checks (:mod:`.vllm`) share these steps. Torch and transformers; no
HTTP.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from reward_server.config import LoadOptions
from reward_server.errors import ModelLoadError, one_line
from reward_server.text.rendering import Renderer, prepare_tokenizer, read_template

logger = logging.getLogger(__name__)

__all__ = ["AutoClass", "Loaded", "Network", "load_parts"]

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
# Attribute names under which transformers' sequence-classification models keep their head.
_HEAD_NAMES = ("score", "classifier", "classification_head")
# model_max_length above this is transformers' "unknown" sentinel (VERY_LARGE_INTEGER).
_SANE_MAX_LENGTH = 10_000_000


# ---------------------------------------------------------------------- loading, step by step


def resolve_device(device: str) -> torch.device:
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


def resolve_dtype(dtype: str, device: torch.device, config: Any) -> torch.dtype:
    """Pick the compute dtype.

    ``auto``: float32 on CPU. Without native bfloat16 (AVX512-BF16 or AMX) bf16 is emulated
    and several times slower; with it, bf16 is faster, but its scores move by a few percent
    of their spread and differ between a text alone and in a batch far more than float32's,
    so float32 stays the CPU's default and ``--dtype bfloat16`` the user's choice
    (BENCHMARKS.md, "bfloat16 on the CPU"). On CUDA, a bf16 or fp16
    checkpoint keeps its dtype; a float32 (or unknown) checkpoint runs in bf16. bf16 falls
    back to fp16 on GPUs without bf16 support.
    """
    if dtype != "auto":
        if dtype not in _DTYPES:
            raise ModelLoadError(
                f"invalid dtype {dtype!r}; choose auto, {', '.join(sorted(_DTYPES))}"
            )
        return _DTYPES[dtype]
    if device.type == "cpu" and cpu_has_native_bf16():
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


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX, by torch's probes (absent from a torch build: not there), unless
    ``ONEDNN_MAX_CPU_ISA`` (old name ``DNNL_MAX_CPU_ISA``) caps oneDNN below them: bfloat16
    then takes a fallback far slower than float32 (200x for a linear layer on an AMX Xeon)."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    cap = (
        os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL"
    ).upper()
    if cap not in ("ALL", "DEFAULT") and not any(
        k in cap for k in ("BF16", "FP16", "AMX", "AVX10")
    ):
        return False
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def looks_local(model: str) -> bool:
    """True when ``model`` can only be a filesystem path (not a hub id ``name`` / ``org/name``)."""
    return (
        model.startswith(("/", ".", "~"))
        or model.count("/") > 1
        or (os.sep != "/" and os.sep in model)
    )


def check_options(options: LoadOptions) -> None:
    """Reject option values no model could take."""
    if options.truncation_side not in ("left", "right"):
        raise ModelLoadError(
            f"truncation_side must be 'left' or 'right', not {options.truncation_side!r}"
        )
    if options.max_length is not None and options.max_length < 1:
        raise ModelLoadError(f"max_length must be positive, not {options.max_length}")


def checkpoint_source(model: str) -> str:
    """Where to load ``model`` from: an existing folder, or a hub id (from the local cache
    when offline)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return str(path)
    if path.exists():
        raise ModelLoadError(f"model path {model!r} is a file, not a model folder")
    if looks_local(model):
        raise ModelLoadError(f"model folder not found: {model}")
    return model


def load_config(source: str, options: LoadOptions) -> Any:
    """The model's config, as transformers reads it."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(source, trust_remote_code=options.trust_remote_code)
    except Exception as exc:
        raise ModelLoadError(
            f"cannot read model config of {options.model!r}: {one_line(exc)}"
        ) from exc


def read_config(source: str, options: LoadOptions) -> Any:
    """The model's config; a known architecture must be a sequence classifier (unless an
    adapter brings the head)."""
    config = load_config(source, options)
    archs = list(getattr(config, "architectures", None) or [])
    classifies = any(a.endswith("ForSequenceClassification") for a in archs)
    if archs and not options.adapter and not classifies:
        raise ModelLoadError(
            f"{options.model!r} is not a sequence-classification model (architectures: "
            f"{', '.join(archs)}); its score head would be random"
        )
    return config


def load_tokenizer(source: str, options: LoadOptions, template: str | None) -> Any:
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


def load_network(
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
    head = find_head(net)
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


def check_labels(net: torch.nn.Module, tokenizer: Any, label_index: int) -> None:
    """Give the configs the pad id (transformers' pooling needs it); check ``label_index``."""
    for cfg in {id(c): c for c in (net.config, net.config.get_text_config())}.values():
        cfg.pad_token_id = tokenizer.pad_token_id
    num_labels = int(net.config.num_labels)
    if not 0 <= label_index < num_labels:
        raise ModelLoadError(
            f"label_index {label_index} out of range: the model has {num_labels} label(s)"
        )


def ready_network(
    net: torch.nn.Module, options: LoadOptions, head_needed: str | None, device: torch.device
) -> torch.nn.Module:
    """The adapter applied (if any), on ``device``, in eval mode, without gradients."""
    if options.adapter:
        # A base LM + a SEQ_CLS adapter that carries the trained head is a valid set-up.
        net = load_adapter(
            net, options.adapter, merge=options.merge_adapter, head_needed=head_needed
        )
    net.to(device)
    net.eval()
    for param in net.parameters():
        param.requires_grad_(False)
    return net


def position_limit(config: Any) -> int | None:
    """The model's hard or trained position limit, if its config states one."""
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for attr in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(text_config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def model_max_length(net: torch.nn.Module, tokenizer: Any, options: LoadOptions) -> int:
    """``options.max_length``, or the smaller of the model's and the tokenizer's limits."""
    tok_limit = tokenizer.model_max_length
    sane_tok = isinstance(tok_limit, int) and 0 < tok_limit < _SANE_MAX_LENGTH
    limits = [x for x in (position_limit(net.config), tok_limit if sane_tok else None) if x]
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


def find_head(model: torch.nn.Module) -> tuple[str, torch.nn.Module] | None:
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


def load_adapter(
    net: torch.nn.Module, adapter: str, *, merge: bool, head_needed: str | None = None
) -> torch.nn.Module:
    """Wrap ``net`` with a PEFT adapter, optionally merged; ``head_needed``: it must carry it."""
    from peft import PeftConfig, PeftModel

    path = Path(adapter).expanduser()
    if not path.is_dir() and looks_local(adapter):
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
    check_options(options)
    source = checkpoint_source(options.model)
    device = resolve_device(options.device)
    template = read_template(options.chat_template)
    if auto_class is None:
        config, auto = read_config(source, options), None
    else:
        config = load_config(source, options)
        auto = auto_class(config, options)
    dtype = resolve_dtype(options.dtype, device, config)
    tokenizer = load_tokenizer(source, options, template)
    net, head_needed = load_network(source, options, config, dtype, auto, kind)
    architecture = type(net).__name__
    check_labels(net, tokenizer, options.label_index)
    net = ready_network(net, options, head_needed, device)
    max_length = model_max_length(net, tokenizer, options)
    return Loaded(net, tokenizer, architecture, device, dtype, max_length)


@dataclass(frozen=True, slots=True)
class Network:
    """A loaded network with what it was loaded as and with."""

    model: torch.nn.Module
    renderer: Renderer
    adapter: str | None
    architecture: str
    device: torch.device
    dtype: torch.dtype
