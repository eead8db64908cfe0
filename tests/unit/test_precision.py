"""bf16 only where the CPU has it: the demo, the PPO trainer and the server choose by one probe.

Only the hardware probe is replaced (torch's ``torch.cpu._is_avx512_bf16_supported`` and
``_is_amx_tile_supported``); the choices run as they do in use: the demo's RewardConfig,
its policy pre-training loop, the trainer's accelerator, the server's model loading.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import tiny_models
from examples import demo_models
from ppo_client.config import ConfigError, PPOConfig
from ppo_client.precision import CpuBf16, cpu_bf16_support
from ppo_client.trainer import PPOTrainer
from reward_server.config import LoadOptions
from reward_server.engines._checkpoint import cpu_has_native_bf16
from reward_server.engines.transformers import load_parts

SetCpu = Callable[..., None]


@pytest.fixture
def set_cpu(monkeypatch: pytest.MonkeyPatch) -> SetCpu:
    """Make torch's CPU probes answer as a CPU with (or without) bf16 instructions."""

    def set_(*, avx512_bf16: bool, amx: bool = False) -> None:
        for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)

    return set_


@pytest.fixture
def fresh_accelerate_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """accelerate keeps one process-wide state; a different precision needs a fresh one."""
    from accelerate.state import AcceleratorState

    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


# ------------------------------------------------------------------------------ the probe


def test_the_probe_reads_torch(set_cpu: SetCpu) -> None:
    set_cpu(avx512_bf16=False)
    assert cpu_bf16_support() == CpuBf16(avx512_bf16=False, amx=False)
    assert not cpu_bf16_support().native
    set_cpu(avx512_bf16=False, amx=True)
    assert cpu_bf16_support() == CpuBf16(avx512_bf16=False, amx=True)
    assert cpu_bf16_support().native
    set_cpu(avx512_bf16=True)
    assert cpu_bf16_support().describe() == "CPU has native bfloat16 (AVX512-BF16)"


@pytest.mark.parametrize(
    ("variable", "cap", "native"),
    [
        ("ONEDNN_MAX_CPU_ISA", "AVX2", False),
        ("ONEDNN_MAX_CPU_ISA", "avx512_core", False),
        ("DNNL_MAX_CPU_ISA", "AVX512_CORE_VNNI", False),
        ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16", True),
        ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX", True),
        ("ONEDNN_MAX_CPU_ISA", "ALL", True),
    ],
)
def test_a_onednn_cap_below_bf16_means_no_native_bf16(
    set_cpu: SetCpu, monkeypatch: pytest.MonkeyPatch, variable: str, cap: str, native: bool
) -> None:
    """oneDNN held below the bfloat16 instructions emulates them (200x slower than float32
    measured), so neither the trainer nor the server's --dtype auto picks bfloat16 there."""
    set_cpu(avx512_bf16=True, amx=True)
    monkeypatch.setenv(variable, cap)
    assert cpu_bf16_support().native is native
    assert cpu_has_native_bf16() is native


def test_a_probe_missing_from_torch_counts_as_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported", raising=False)
    assert cpu_bf16_support() == CpuBf16(avx512_bf16=False, amx=False)


# ------------------------------------------------------------------------------ the demo


@pytest.mark.parametrize(("avx512_bf16", "amx"), [(False, False), (True, False), (False, True)])
def test_demo_reward_model_trains_in_bf16_only_where_native(
    set_cpu: SetCpu,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    avx512_bf16: bool,
    amx: bool,
) -> None:
    set_cpu(avx512_bf16=avx512_bf16, amx=amx)
    with caplog.at_level(logging.INFO, logger="ppo_client.precision"):
        args = demo_models.reward_training_args(tmp_path)
    native = avx512_bf16 or amx
    # TRL's RewardConfig would turn bf16 on by itself: the demo sets it either way.
    assert args.bf16 is native
    expected = "bfloat16" if native else "float32"
    assert [r.getMessage() for r in caplog.records] == [
        f"{cpu_bf16_support().describe()}: reward-model training in {expected}"
    ]


def test_demo_reward_model_honours_an_explicit_bf16(
    set_cpu: SetCpu, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    set_cpu(avx512_bf16=False)
    with caplog.at_level(logging.INFO, logger="ppo_client.precision"):
        assert demo_models.reward_training_args(tmp_path, bf16=True).bf16 is True
    assert "emulated" in caplog.text  # said, not refused
    set_cpu(avx512_bf16=True)
    assert demo_models.reward_training_args(tmp_path, bf16=False).bf16 is False


@pytest.mark.parametrize("native", [False, True])
def test_demo_policy_pretraining_autocasts_only_where_native(
    set_cpu: SetCpu, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, native: bool
) -> None:
    """Two real training steps; a forward hook records what autocast was during each."""
    set_cpu(avx512_bf16=native)
    autocast_seen: list[bool] = []
    make_model = tiny_models.gpt2_causal_lm

    def recording_model(*args: Any, **kwargs: Any) -> torch.nn.Module:
        model = make_model(*args, **kwargs)
        model.register_forward_hook(
            lambda *_: autocast_seen.append(torch.is_autocast_enabled("cpu"))
        )
        return model

    monkeypatch.setattr(tiny_models, "gpt2_causal_lm", recording_model)
    sentences = tiny_models.make_corpus(40, seed=1)
    loss = demo_models.train_policy(tmp_path / "policy", sentences, steps=2, batch_size=4)
    assert autocast_seen == [native, native]
    assert math.isfinite(loss)
    assert (tmp_path / "policy" / "config.json").exists()


# -------------------------------------------------------------------- ppo-client train


def test_bf16_flag_takes_true_false_and_auto() -> None:
    assert PPOConfig().bf16 is False  # the default keeps float32 numerics
    assert PPOConfig.from_args(["--bf16", "auto"]).bf16 == "auto"
    assert PPOConfig.from_args(["--bf16=auto"]).bf16 == "auto"
    assert PPOConfig.from_args(["--bf16", "true"]).bf16 is True
    assert PPOConfig.from_args(["--bf16"]).bf16 is True  # a bare flag is true
    assert PPOConfig.from_args(["--bf16", "false"]).bf16 is False
    assert PPOConfig.from_dict({"bf16": "auto"}).bf16 == "auto"  # as YAML gives it
    with pytest.raises(
        ConfigError, match=re.escape("bf16: expected bool | 'auto', got 'sometimes'")
    ):
        PPOConfig.from_args(["--bf16", "sometimes"])


def _trainer(policy: Path, out: Path, bf16: bool | str) -> PPOTrainer:
    config = PPOConfig(
        model_name_or_path=str(policy),
        output_dir=str(out),
        bf16=bf16,
        per_device_train_batch_size=2,
        total_episodes=2,
        response_length=4,
    )
    return PPOTrainer(
        config,
        train_dataset=[{"prompt": "a b"}, {"prompt": "c"}],
        reward_fn=lambda p, r: [0.0] * len(r),
    )


@pytest.mark.usefixtures("fresh_accelerate_state")
@pytest.mark.parametrize(("native", "bf16", "expected"), [
    (False, "auto", "no"),
    (True, "auto", "bf16"),
    (False, True, "bf16"),  # explicit: honoured, with a warning
    (True, False, "no"),
])  # fmt: skip
def test_trainer_accelerator_precision(
    set_cpu: SetCpu,
    gpt2_policy: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    native: bool,
    bf16: bool | str,
    expected: str,
) -> None:
    set_cpu(avx512_bf16=native)
    with caplog.at_level(logging.INFO, logger="ppo_client.precision"):
        trainer = _trainer(gpt2_policy, tmp_path, bf16)
    assert trainer.accelerator.device.type == "cpu"
    assert trainer.accelerator.mixed_precision == expected
    messages = [r.getMessage() for r in caplog.records]
    if bf16 == "auto":
        dtype = "bfloat16" if native else "float32"
        assert messages == [f"{cpu_bf16_support().describe()}: PPO training in {dtype}"]
    elif bf16 is True:
        assert len(messages) == 1 and "emulated" in messages[0]
    else:
        assert messages == []


# ------------------------------------------------------------------------- the server


@pytest.mark.parametrize("native", [False, True])
def test_server_dtype_auto_on_cpu_is_float32(
    set_cpu: SetCpu, bert_rm: Path, caplog: pytest.LogCaptureFixture, native: bool
) -> None:
    """Even with native bf16: bf16 moves scores by up to 3.5 % of their spread (BENCHMARKS)."""
    set_cpu(avx512_bf16=native)
    with caplog.at_level(logging.INFO, logger="reward_server"):
        loaded = load_parts(LoadOptions(model=str(bert_rm), dtype="auto", device="cpu"))
    assert loaded.dtype == torch.float32
    assert {p.dtype for p in loaded.net.parameters()} == {torch.float32}
    lines = [r.getMessage() for r in caplog.records if "bfloat16" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].startswith("CPU has native" if native else "CPU has no native")


def test_server_dtype_bfloat16_is_honoured(set_cpu: SetCpu, bert_rm: Path) -> None:
    set_cpu(avx512_bf16=False)
    loaded = load_parts(LoadOptions(model=str(bert_rm), dtype="bfloat16", device="cpu"))
    assert loaded.dtype == torch.bfloat16
