"""Whether training computes in bfloat16: what the CPU has, what the GPU supports, what was asked.

On a CPU, bfloat16 is fast only with the instructions for it (AVX512-BF16 or AMX); without
them torch emulates it and bf16 autocast is about 10x slower than float32 (the
demo's reward model took 8 s a step instead of under one). Measured on a 2-core AMD EPYC
(Zen 4) with AVX512-BF16 and no AMX (BENCHMARKS.md, "bfloat16 on the CPU"): bf16 autocast
took 0.67x the float32 time per step of the demo's reward model and 0.72x of its policy, so
``auto`` trains in bfloat16 on every CPU with either instruction set, float32 on the rest.

:func:`cpu_bf16_support` is the one probe of the hardware (and what tests replace);
:func:`use_bf16` turns a ``true | false | auto`` setting into the choice and logs it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Literal

import torch

__all__ = ["Bf16Setting", "CpuBf16", "cpu_bf16_support", "onednn_allows_bf16", "use_bf16"]

logger = logging.getLogger(__name__)

#: A user's bf16 setting: on, off, or chosen for the device (:func:`use_bf16`).
Bf16Setting = bool | Literal["auto"]


@dataclass(frozen=True)
class CpuBf16:
    """The bfloat16 instructions this CPU has."""

    avx512_bf16: bool
    amx: bool

    @property
    def native(self) -> bool:
        """True when bfloat16 runs in hardware (not emulated)."""
        return self.avx512_bf16 or self.amx

    def describe(self) -> str:
        """'CPU has native bfloat16 (AVX512-BF16)' or 'CPU has no native bfloat16 (...)'."""
        found = [
            name for name, has in (("AVX512-BF16", self.avx512_bf16), ("AMX", self.amx)) if has
        ]
        if found:
            return f"CPU has native bfloat16 ({', '.join(found)})"
        return "CPU has no native bfloat16 (no AVX512-BF16/AMX)"


def cpu_bf16_support() -> CpuBf16:
    """Probe this CPU through torch (a probe missing from this torch build counts as absent),
    less what ``ONEDNN_MAX_CPU_ISA`` keeps oneDNN's kernels from using."""
    return CpuBf16(
        avx512_bf16=_torch_probe("_is_avx512_bf16_supported") and onednn_allows_bf16(),
        amx=_torch_probe("_is_amx_tile_supported") and onednn_allows_bf16(),
    )


def onednn_allows_bf16() -> bool:
    """False when ``ONEDNN_MAX_CPU_ISA`` (or its old name ``DNNL_MAX_CPU_ISA``) caps oneDNN's
    kernels below the bfloat16 instructions (``AVX2``, ``AVX512_CORE``, ...): bfloat16 then
    takes a fallback that was 200x the float32 time of a linear layer's step on an AMX Xeon,
    against 0.24x uncapped."""
    cap = (
        os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL"
    ).upper()
    return cap in ("ALL", "DEFAULT") or any(k in cap for k in ("BF16", "FP16", "AMX", "AVX10"))


def _torch_probe(name: str) -> bool:
    probe = getattr(getattr(torch, "cpu", None), name, None)
    return bool(probe()) if callable(probe) else False


def use_bf16(device: str, setting: Bf16Setting = "auto", *, what: str = "training") -> bool:
    """Whether ``what`` on ``device`` (``cpu``, ``cuda``, ``cuda:1``, ...) runs in bfloat16.

    ``True`` and ``False`` are the user's and are kept (a warning when bf16 is emulated).
    ``auto``: bf16 on a GPU that supports it, on a CPU with native bfloat16, else float32.
    An ``auto`` choice and an emulated ``True`` are logged in one line.
    """
    kind = device.split(":", 1)[0]
    if setting is False:
        return False
    if setting is True:
        if kind == "cpu" and not (cpu := cpu_bf16_support()).native:
            logger.warning(
                "%s in bfloat16 as set, though %s: emulated, about 10x slower than float32",
                what,
                cpu.describe(),
            )
        return True
    if kind == "cuda":
        chosen = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        reason = "GPU supports bfloat16" if chosen else "GPU has no bfloat16 support"
    elif kind == "cpu":
        cpu = cpu_bf16_support()
        chosen, reason = cpu.native, cpu.describe()
    else:
        chosen, reason = False, f"no bfloat16 policy for device {device!r}"
    logger.info("%s: %s in %s", reason, what, "bfloat16" if chosen else "float32")
    return chosen
