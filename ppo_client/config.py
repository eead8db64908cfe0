"""PPOConfig: TRL's PPO option names and defaults, plus the remote-reward and data options.

Load it from YAML and ``--key value`` overrides with :meth:`PPOConfig.from_args`; values
given as strings are coerced to the field's declared type.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

__all__ = ["ConfigError", "PPOConfig"]


class ConfigError(ValueError):
    """An invalid configuration: unknown key, wrong type or inconsistent sizes."""


@dataclass
class PPOConfig:
    """Options of a PPO run; the PPO ones keep TRL's names and defaults."""

    # --- models -------------------------------------------------------------------------
    model_name_or_path: str | None = None
    """Policy checkpoint (causal LM): a local folder or a hub id."""
    sft_model_path: str | None = None
    """TRL's name for the policy checkpoint; used when ``model_name_or_path`` is not set."""
    value_model_path: str | None = None
    """Checkpoint the value model (sequence classification, 1 label) starts from; default: the policy's."""
    tokenizer_name_or_path: str | None = None
    """Policy tokenizer; default: the policy checkpoint."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    """dtype the models are loaded in."""
    bf16: bool = False
    """bf16 mixed precision (accelerate's autocast); models keep their loaded dtype."""
    trust_remote_code: bool = False
    gradient_checkpointing: bool = False
    """Trade compute for memory in the policy and value forward passes."""

    # --- PEFT ----------------------------------------------------------------------------
    use_peft: bool = False
    """Train LoRA adapters on policy and value model; the reference is the policy with its adapter disabled."""
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    """Stored in the adapter config; dropout is switched off during PPO in any case."""
    lora_target_modules: list[str] | str | None = None
    """Module names (or "all-linear"); default: peft's choice for the architecture."""

    # --- reward --------------------------------------------------------------------------
    reward_url: str | list[str] | None = None
    """Base URL(s) of the reward server(s); several are used round-robin with failover."""
    reward_api_key: str | None = None
    reward_timeout: float = 60.0
    reward_max_retries: int = 5
    reward_baseline: float = 0.0
    """Subtracted from every score: score' = (score - reward_baseline) * reward_scale."""
    reward_scale: float = 1.0
    overlap_reward: bool | None = None
    """Score a rollout chunk on a worker thread while its policy/reference/value passes run.
    Default: on for the HTTP reward client (the server's time hides behind the passes),
    except when the trainer runs on CPU and every server is on this machine; off for other
    reward functions. Overlap only pays when the reward has processors of its own."""

    # --- data ----------------------------------------------------------------------------
    dataset_name: str | None = None
    """A local .jsonl/.json/.csv/.parquet file, a ``save_to_disk`` folder or a datasets id."""
    dataset_config: str | None = None
    dataset_split: str = "train"
    dataset_text_field: str = "prompt"
    """Column holding the prompt: text, or a list of chat messages."""
    max_prompt_length: int | None = None
    """Prompts longer than this many policy tokens keep their last tokens."""

    # --- run -----------------------------------------------------------------------------
    output_dir: str = "ppo_output"
    seed: int = 42
    run_name: str | None = None
    report_to: str | list[str] = "none"
    """Trackers passed to accelerate ("tensorboard", "wandb", "trackio", "all", "none")."""
    logging_steps: int = 10
    """Every how many steps a summary line is logged; metrics.jsonl gets every step."""
    save_steps: float = 500
    """Checkpoint every N steps (a value below 1 is a fraction of the total steps)."""
    save_total_limit: int | None = None
    """Keep at most this many checkpoints (the oldest are deleted)."""
    resume_from_checkpoint: str | None = None
    """A checkpoint folder, or "latest" for the newest one in ``output_dir``."""
    num_sample_generations: int = 10
    """How many times during the run sample completions are written to samples.jsonl."""
    num_samples_to_log: int = 4
    """Rollouts written to samples.jsonl each time."""
    disable_tqdm: bool = False

    # --- batch sizes (TRL names) ---------------------------------------------------------
    total_episodes: int | None = None
    """Number of prompts to train on; default ``num_train_epochs * len(dataset)``."""
    num_train_epochs: float = 3.0
    per_device_train_batch_size: int = 8
    gradient_accumulation_steps: int = 1
    num_mini_batches: int = 1
    local_rollout_forward_batch_size: int = 64
    """Per-rank chunk size of generation and no-grad forward passes in the rollout."""

    # --- optimiser -----------------------------------------------------------------------
    learning_rate: float = 5e-5
    lr_scheduler_type: str = "linear"
    warmup_steps: int = 0
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_epsilon: float = 1e-8
    max_grad_norm: float | None = None
    """Clip the gradient norm before each optimiser step (TRL's PPO does not clip)."""

    # --- generation ----------------------------------------------------------------------
    response_length: int = 53
    stop_token: Literal["eos"] | None = None
    """"eos": stop at the tokenizer's EOS token (exclusive with ``stop_token_id``)."""
    stop_token_id: int | None = None
    temperature: float = 0.7
    missing_eos_penalty: float | None = None
    """Subtracted from the score of a response without the stop token."""

    # --- PPO -----------------------------------------------------------------------------
    num_ppo_epochs: int = 4
    whiten_rewards: bool = False
    kl_coef: float = 0.05
    kl_estimator: Literal["k1", "k3"] = "k1"
    cliprange: float = 0.2
    vf_coef: float = 0.1
    cliprange_value: float = 0.2
    gamma: float = 1.0
    lam: float = 0.95

    def __post_init__(self) -> None:
        """Check the values that do not depend on the world size or the dataset."""
        if self.model_name_or_path is None and self.sft_model_path is not None:
            self.model_name_or_path = self.sft_model_path
        if self.stop_token is not None and self.stop_token_id is not None:
            raise ConfigError("set stop_token or stop_token_id, not both")
        if self.stop_token not in (None, "eos"):
            raise ConfigError(f"stop_token must be 'eos' or null, got {self.stop_token!r}")
        if self.kl_estimator not in ("k1", "k3"):
            raise ConfigError(f"kl_estimator must be 'k1' or 'k3', got {self.kl_estimator!r}")
        if isinstance(self.reward_url, str) and "," in self.reward_url:
            self.reward_url = [u.strip() for u in self.reward_url.split(",") if u.strip()]
        if isinstance(self.lora_target_modules, str) and "," in self.lora_target_modules:
            self.lora_target_modules = [
                m.strip() for m in self.lora_target_modules.split(",") if m.strip()
            ]
        positive = (
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "num_mini_batches",
            "local_rollout_forward_batch_size",
            "num_ppo_epochs",
            "response_length",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.temperature <= 0:
            raise ConfigError(f"temperature must be > 0, got {self.temperature}")
        if self.missing_eos_penalty is not None and self.missing_eos_penalty < 0:
            raise ConfigError("missing_eos_penalty must be a positive value (it is subtracted)")
        if self.total_episodes is not None and self.total_episodes < 1:
            raise ConfigError(f"total_episodes must be >= 1, got {self.total_episodes}")
        if self.save_steps <= 0:
            raise ConfigError(f"save_steps must be > 0, got {self.save_steps}")

    def resolved_stop_token_id(self, eos_token_id: int | None) -> int | None:
        """The token that ends a response: ``stop_token_id``, EOS for ``stop_token: eos``, or None."""
        if self.stop_token == "eos":
            if eos_token_id is None:
                raise ConfigError("stop_token is 'eos' but the policy tokenizer has no EOS token")
            return eos_token_id
        return self.stop_token_id

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of all options (the API key masked)."""
        out = dataclasses.asdict(self)
        if out.get("reward_api_key"):
            out["reward_api_key"] = "***"
        return out

    # --------------------------------------------------------------------------- loading

    @classmethod
    def field_names(cls) -> list[str]:
        """Names a user may set (derived sizes excluded)."""
        return [f.name for f in dataclasses.fields(cls) if not f.metadata.get("derived")]

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> PPOConfig:
        """Build from a mapping, coercing values to the field types; unknown keys are errors."""
        names = cls.field_names()
        hints = typing.get_type_hints(cls)
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            name = key.replace("-", "_")
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"unknown config key {key!r}{hint}")
            kwargs[name] = _coerce(name, value, hints[name])
        return cls(**kwargs)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: Sequence[str] = ()) -> PPOConfig:
        """Load a YAML file of options, then apply ``--key value`` overrides."""
        text = Path(path).read_text(encoding="utf-8")
        values = yaml.safe_load(text) or {}
        if not isinstance(values, dict):
            raise ConfigError(f"{path}: expected a mapping of options at the top level")
        return cls.from_args(overrides, base=values)

    @classmethod
    def from_args(cls, args: Sequence[str], base: Mapping[str, Any] | None = None) -> PPOConfig:
        """Apply ``--key value`` / ``--key=value`` / ``--flag`` arguments on top of ``base``."""
        values = dict(base or {})
        values.update(parse_overrides(args, cls._bool_fields()))
        return cls.from_dict(values)

    @classmethod
    def _bool_fields(cls) -> set[str]:
        hints = typing.get_type_hints(cls)
        return {n for n in cls.field_names() if _allows(hints[n], bool)}


def parse_overrides(args: Sequence[str], bool_fields: Collection[str] = ()) -> dict[str, Any]:
    """Parse ``--key value`` pairs; a bool key without a value means true. Values stay strings."""
    out: dict[str, Any] = {}
    i = 0
    args = list(args)
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or len(arg) == 2:
            raise ConfigError(f"expected --key value, got {arg!r}")
        key = arg[2:]
        if "=" in key:
            key, value = key.split("=", 1)
            i += 1
        elif i + 1 < len(args) and not args[i + 1].startswith("--"):
            value = args[i + 1]
            i += 2
        elif key.replace("-", "_") in bool_fields:
            value = "true"
            i += 1
        else:
            raise ConfigError(f"--{key} needs a value")
        out[key.replace("-", "_")] = _Raw(value)
    return out


class _Raw(str):
    """A value typed on the command line: parsed as YAML, then coerced to the field type."""


_NONE_WORDS = {"none", "null", "~", ""}


def _allows(tp: Any, kind: type) -> bool:
    """Whether the annotation ``tp`` accepts values of ``kind``."""
    return any(arg is kind for arg in _members(tp))


def _members(tp: Any) -> list[Any]:
    """The alternatives of a union annotation (or the annotation itself)."""
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        return list(typing.get_args(tp))
    return [tp]


def _coerce(name: str, value: Any, tp: Any) -> Any:
    """Convert ``value`` (maybe a raw command-line string) to the annotation ``tp``."""
    members = _members(tp)
    optional = type(None) in members
    if isinstance(value, _Raw):
        if optional and value.strip().lower() in _NONE_WORDS:
            return None
        if any(m is str for m in members) and not any(
            typing.get_origin(m) is list for m in members
        ):
            # A plain string field: keep the text as typed (e.g. a numeric-looking path).
            literal_only = [m for m in members if typing.get_origin(m) is Literal]
            if not literal_only:
                return str(value)
        try:
            parsed = yaml.safe_load(str(value))
        except yaml.YAMLError:
            parsed = str(value)
        if isinstance(parsed, str) and any(typing.get_origin(m) is list for m in members):
            if any(m is str for m in members):
                return str(value)
            parsed = [p.strip() for p in parsed.split(",") if p.strip()]
        value = parsed
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{name} may not be null")
    for member in members:
        ok, converted = _convert(value, member)
        if ok:
            return converted
    expected = " | ".join(_type_name(m) for m in members)
    raise ConfigError(f"{name}: expected {expected}, got {value!r}")


def _convert(value: Any, tp: Any) -> tuple[bool, Any]:
    """Try to convert ``value`` to the concrete annotation ``tp``."""
    if tp is type(None):
        return False, None
    origin = typing.get_origin(tp)
    if origin is Literal:
        return (value in typing.get_args(tp)), value
    if origin is list:
        (item_tp,) = typing.get_args(tp) or (Any,)
        if isinstance(value, (list, tuple)):
            items = [_convert(v, item_tp) for v in value]
            if all(ok for ok, _ in items):
                return True, [v for _, v in items]
        return False, None
    if tp is Any:
        return True, value
    if tp is bool:
        if isinstance(value, bool):
            return True, value
        if isinstance(value, str) and value.lower() in {"true", "false", "yes", "no", "1", "0"}:
            return True, value.lower() in {"true", "yes", "1"}
        return False, None
    if tp is int:
        if isinstance(value, bool):
            return False, None
        if isinstance(value, int):
            return True, value
        if isinstance(value, float) and value.is_integer():
            return True, int(value)
        return False, None
    if tp is float:
        if isinstance(value, bool):
            return False, None
        if isinstance(value, (int, float)):
            return True, float(value)
        if isinstance(value, str):
            try:
                return True, float(value)
            except ValueError:
                return False, None
        return False, None
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return True, str(value)
        return False, None
    return False, None


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))
