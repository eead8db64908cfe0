"""Checkpoints: atomic ``checkpoint-N`` folders, rotation, finding and loading one to resume,
and the RNG state that makes a resumed run repeat an uninterrupted one.

A checkpoint folder holds ``policy/`` and ``value_model/`` (``save_pretrained`` folders; the
adapters only with PEFT), ``optimizer.pt``, ``scheduler.pt``, ``rng_state_<rank>.pt`` and
``trainer_state.json`` (progress, sizes, seed and config). It is written under
``.tmp-checkpoint-N`` and renamed when complete, so a kill mid-write leaves the older
checkpoints to resume from.

accelerate's ``save_state``/``load_state`` are not used: they name their files
``optimizer.bin``, ``random_states_<rank>.pkl`` and ``model.safetensors`` (the whole
policy-and-value wrapper, frozen base weights included under PEFT), which is not this layout,
and they do not keep the trainer's own NumPy generator.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from ppo_client.config import ConfigError
from ppo_client.models import is_peft

if TYPE_CHECKING:
    from accelerate import Accelerator

    from ppo_client.models import PolicyAndValue

__all__ = [
    "CHECKPOINT_PREFIX",
    "STATE_FILE",
    "Checkpointer",
    "RunInfo",
    "TrainerState",
    "TrainingParts",
    "list_checkpoints",
    "rng_state",
    "seed_everything",
    "set_rng_state",
]

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
CHECKPOINT_PREFIX = "checkpoint-"


@dataclass
class TrainerState:
    """Progress that a checkpoint stores: updates done and prompts seen."""

    step: int = 0
    episode: int = 0
    reward_window: list[float] = field(default_factory=list)
    """The running reward normalisation's window (empty when it is off)."""


@dataclass(frozen=True)
class RunInfo:
    """What ``trainer_state.json`` records about the run besides progress."""

    num_total_batches: int
    batch_size: int
    world_size: int
    seed: int
    config: dict[str, Any]


@dataclass
class TrainingParts:
    """What a checkpoint saves and restores besides progress."""

    model: nn.Module  # the prepared PolicyAndValue
    tokenizer: PreTrainedTokenizerBase
    optimizer: torch.optim.Optimizer
    lr_scheduler: Any
    np_rng: np.random.Generator  # PPO mini-batch shuffles


# ================================================================================= RNG


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's global and torch's generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state(np_rng: np.random.Generator) -> dict[str, Any]:
    """Every generator's state on this rank (CUDA's too where there is one)."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "trainer_numpy": np_rng.bit_generator.state,
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any], np_rng: np.random.Generator) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    np_rng.bit_generator.state = state["trainer_numpy"]
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ================================================================================= folders


def list_checkpoints(output_dir: Path) -> list[Path]:
    """Complete ``checkpoint-N`` folders in ``output_dir``, oldest first."""
    found = []
    if output_dir.is_dir():
        for p in output_dir.iterdir():
            suffix = p.name[len(CHECKPOINT_PREFIX) :]
            if (
                p.name.startswith(CHECKPOINT_PREFIX)
                and suffix.isdigit()
                and (p / STATE_FILE).exists()
            ):
                found.append((int(suffix), p))
    return [p for _, p in sorted(found)]


def save_models(
    wrapper: PolicyAndValue, tokenizer: PreTrainedTokenizerBase, policy_dir: Path, value_dir: Path
) -> None:
    """``save_pretrained`` of the policy (with the tokenizer) and of the value model."""
    wrapper.policy.save_pretrained(policy_dir)
    tokenizer.save_pretrained(policy_dir)
    wrapper.value_model.save_pretrained(value_dir)


def load_weights(model: nn.Module, folder: Path) -> None:
    """Load a ``save_pretrained`` folder into an existing model (PEFT: the adapter only)."""
    from safetensors.torch import load_file

    if is_peft(model):
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(model, load_file(folder / "adapter_model.safetensors"))
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise RuntimeError(f"{folder}: unexpected adapter keys {unexpected[:5]}")
        return
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    params = model.state_dict()
    loaded: set[str] = set()
    for name in files:
        shard = load_file(folder / name)
        unknown = [k for k in shard if k not in params]
        if unknown:
            raise RuntimeError(f"{folder / name}: keys not in the model: {unknown[:5]}")
        model.load_state_dict(shard, strict=False)
        loaded.update(shard)
    # Keys missing from the files must be tied to a loaded tensor (e.g. lm_head = embeddings).
    loaded_ptrs = {params[k].data_ptr() for k in loaded}
    missing = [k for k in params if k not in loaded and params[k].data_ptr() not in loaded_ptrs]
    if missing:
        raise RuntimeError(f"{folder}: checkpoint lacks {missing[:5]}")


# ================================================================================= checkpointer


@dataclass
class Checkpointer:
    """Saves and loads the checkpoints of one run in ``output_dir`` (every rank calls it)."""

    accelerator: Accelerator
    output_dir: Path
    parts: TrainingParts
    info: RunInfo
    save_total_limit: int | None = None

    def save_model(self, output_dir: Path) -> None:
        """Save the policy (or its adapter) with the tokenizer, and the value model under
        ``value_model/``."""
        acc = self.accelerator
        acc.wait_for_everyone()
        if acc.is_main_process:
            wrapper: PolicyAndValue = acc.unwrap_model(self.parts.model)
            save_models(wrapper, self.parts.tokenizer, output_dir, output_dir / "value_model")
        acc.wait_for_everyone()

    def save(self, state: TrainerState) -> Path:
        """Write ``checkpoint-<step>`` (models, optimiser, scheduler, RNG, progress) atomically."""
        acc = self.accelerator
        final = self.output_dir / f"{CHECKPOINT_PREFIX}{state.step}"
        tmp = self.output_dir / f".tmp-{CHECKPOINT_PREFIX}{state.step}"
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        acc.wait_for_everyone()
        torch.save(rng_state(self.parts.np_rng), tmp / f"rng_state_{acc.process_index}.pt")
        if acc.is_main_process:
            self._write(tmp, state)
        acc.wait_for_everyone()
        if acc.is_main_process:
            _replace_folder(tmp, final)
            self._rotate()
            logger.info("saved %s", final)
        acc.wait_for_everyone()
        return final

    def _write(self, folder: Path, state: TrainerState) -> None:
        """Models, optimiser, scheduler and ``trainer_state.json`` (rank 0)."""
        parts, info = self.parts, self.info
        wrapper: PolicyAndValue = self.accelerator.unwrap_model(parts.model)
        save_models(wrapper, parts.tokenizer, folder / "policy", folder / "value_model")
        torch.save(parts.optimizer.state_dict(), folder / "optimizer.pt")
        torch.save(parts.lr_scheduler.state_dict(), folder / "scheduler.pt")
        record = {
            "step": state.step,
            "episode": state.episode,
            "num_total_batches": info.num_total_batches,
            "batch_size": info.batch_size,
            "world_size": info.world_size,
            "seed": info.seed,
            # The data order is a function of (seed, step): this is the dataloader position.
            "data_position": state.step,
            "reward_window": state.reward_window,
            "config": info.config,
        }
        (folder / STATE_FILE).write_text(json.dumps(record, indent=2), encoding="utf-8")

    def _rotate(self) -> None:
        """Delete the oldest checkpoints beyond ``save_total_limit``."""
        limit = self.save_total_limit
        if not limit:
            return
        for old in list_checkpoints(self.output_dir)[:-limit]:
            shutil.rmtree(old, ignore_errors=True)

    def find(self, target: str | None) -> Path | None:
        """The folder ``resume_from_checkpoint`` names: a path, or "latest" in ``output_dir``."""
        if not target:
            return None
        if target == "latest":
            found = list_checkpoints(self.output_dir)
            if not found:
                logger.warning(
                    "resume_from_checkpoint=latest: no checkpoint in %s, starting fresh",
                    self.output_dir,
                )
                return None
            return found[-1]
        path = Path(target)
        if not (path / STATE_FILE).exists():
            raise ConfigError(f"resume_from_checkpoint: {target} is not a checkpoint folder")
        return path

    def load(self, path: Path) -> TrainerState:
        """Restore models, optimiser, scheduler and RNG from ``path``; its progress."""
        acc, parts = self.accelerator, self.parts
        state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
        if state.get("batch_size") != self.info.batch_size:
            raise ConfigError(
                f"{path} was written with batch_size {state.get('batch_size')}, this run has "
                f"{self.info.batch_size}; resuming would change the data order"
            )
        wrapper: PolicyAndValue = acc.unwrap_model(parts.model)
        load_weights(wrapper.policy, path / "policy")
        load_weights(wrapper.value_model, path / "value_model")
        parts.optimizer.load_state_dict(
            torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
        )
        parts.lr_scheduler.load_state_dict(
            torch.load(path / "scheduler.pt", map_location="cpu", weights_only=True)
        )
        rng_file = path / f"rng_state_{acc.process_index}.pt"
        if rng_file.exists():
            set_rng_state(torch.load(rng_file, weights_only=False), parts.np_rng)
        else:
            logger.warning("%s has no RNG state for rank %d", path, acc.process_index)
        progress = TrainerState(
            step=int(state["step"]),
            episode=int(state["episode"]),
            reward_window=[float(x) for x in state.get("reward_window", [])],
        )
        logger.info("resumed from %s at step %d", path, progress.step)
        return progress


def _replace_folder(new: Path, final: Path) -> None:
    """Rename ``new`` to ``final``. Re-saving a step (after resuming from an older checkpoint):
    the old folder is moved aside, not deleted, until the new one is in place; a kill in
    between leaves the older checkpoints to resume from."""
    stale = final.with_name(f".old-{final.name}")
    if final.exists():
        shutil.rmtree(stale, ignore_errors=True)
        os.replace(final, stale)
    os.replace(new, final)
    shutil.rmtree(stale, ignore_errors=True)
