"""The models of a PPO run: policy, value model (critic), reference and PEFT adapters.

:func:`build_models` loads what the caller did not pass, checks vocabularies, adds LoRA
adapters, makes the frozen reference and switches dropout off; :class:`PolicyAndValue` puts
policy and critic in one module for one ``accelerator.prepare``; :class:`Reference` gives the
reference's logits (a frozen copy, or the policy with its adapter disabled).
"""

from __future__ import annotations

import copy
import inspect
import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers import logging as hf_logging

from ppo_client.config import ConfigError, PPOConfig

__all__ = [
    "Models",
    "PolicyAndValue",
    "Reference",
    "build_models",
    "disable_dropout",
    "is_peft",
    "load_tokenizer",
    "response_logits",
    "unwrap_peft",
]

logger = logging.getLogger(__name__)


# ================================================================================= PEFT


def is_peft(model: Any) -> bool:
    """Whether ``model`` is a PEFT wrapper (False when peft is not installed)."""
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def unwrap_peft(model: nn.Module) -> nn.Module:
    """The transformers model inside a PEFT wrapper (LoRA layers stay injected in it)."""
    return model.get_base_model() if is_peft(model) else model  # type: ignore[operator]


def _accepts(model: nn.Module, name: str) -> bool:
    """Whether the (maybe PEFT-wrapped) model's forward takes the keyword ``name``."""
    base = unwrap_peft(model)
    try:
        return name in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False


def _add_adapters(
    config: PPOConfig, policy: nn.Module, value_model: nn.Module
) -> tuple[nn.Module, nn.Module]:
    """LoRA adapters on policy (causal LM) and value model (score head fully trained)."""
    from peft import LoraConfig, get_peft_model

    if config.lora_dropout > 0:
        logger.warning(
            "lora_dropout=%s is stored but dropout is off during PPO", config.lora_dropout
        )

    def lora(task: str) -> LoraConfig:
        return LoraConfig(
            task_type=task,
            r=config.lora_r,
            lora_alpha=config.lora_alpha,
            lora_dropout=config.lora_dropout,
            target_modules=config.lora_target_modules,
        )

    if not is_peft(policy):
        policy = get_peft_model(policy, lora("CAUSAL_LM"))
    if not is_peft(value_model):
        value_model = get_peft_model(value_model, lora("SEQ_CLS"))
    return policy, value_model


# ================================================================================= forward


def response_logits(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    *,
    response_length: int,
    keep_logits: bool,
) -> torch.Tensor:
    """Logits (B, T, V) of a causal LM that predict the last ``T`` tokens of ``input_ids``;
    ``keep_logits``: the model takes ``logits_to_keep`` (only T + 1 positions computed)."""
    t = response_length
    kwargs: dict[str, Any] = {"logits_to_keep": t + 1} if keep_logits else {}
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
        **kwargs,
    )
    # Position P - 1 + t predicts response token t; the last position predicts nothing.
    return out.logits[:, -(t + 1) : -1]


class PolicyAndValue(nn.Module):
    """Policy and critic in one module, so that one ``accelerator.prepare`` (one DDP wrapper)
    covers both; ``forward`` returns response logits (B, T, V) and values (B, T)."""

    def __init__(self, policy: nn.Module, value_model: nn.Module, response_length: int) -> None:
        super().__init__()
        self.policy = policy
        self.value_model = value_model
        self.response_length = response_length
        base = unwrap_peft(value_model)
        prefix = getattr(base, "base_model_prefix", None)
        backbone = getattr(base, prefix, None) if prefix else None
        head = getattr(base, "score", None) or getattr(base, "classifier", None)
        if backbone is None or head is None:
            raise TypeError(
                f"value model {type(base).__name__} must be a *ForSequenceClassification with a "
                "backbone (base_model_prefix) and a 'score' head"
            )
        # Not registered as submodules: they are parts of value_model already.
        object.__setattr__(self, "_critic_backbone", backbone)
        object.__setattr__(self, "_critic_head", head)
        self._keep_logits = _accepts(policy, "logits_to_keep")

    def policy_logits(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Logits (B, T, V) that predict the ``T`` response tokens."""
        return response_logits(
            self.policy,
            input_ids,
            attention_mask,
            position_ids,
            response_length=self.response_length,
            keep_logits=self._keep_logits,
        )

    def values(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> torch.Tensor:
        """Critic values (B, T): the score head on the hidden state before each response token."""
        t = self.response_length
        hidden = self._critic_backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        ).last_hidden_state
        return self._critic_head(hidden[:, -(t + 1) : -1]).squeeze(-1).float()

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Response logits (B, T, V) and values (B, T)."""
        return (
            self.policy_logits(input_ids, attention_mask, position_ids),
            self.values(input_ids, attention_mask, position_ids),
        )


class Reference:
    """The frozen reference policy: a separate copy, or (``model`` None, PEFT) the policy with
    its adapter disabled."""

    def __init__(self, model: nn.Module | None, response_length: int) -> None:
        self.model = model
        self.response_length = response_length
        self._keep_logits = model is not None and _accepts(model, "logits_to_keep")

    def logits(
        self,
        wrapper: PolicyAndValue,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Reference logits (B, T, V) for the response tokens."""
        if self.model is None:
            with wrapper.policy.disable_adapter():
                return wrapper.policy_logits(input_ids, attention_mask, position_ids)
        return response_logits(
            self.model,
            input_ids,
            attention_mask,
            position_ids,
            response_length=self.response_length,
            keep_logits=self._keep_logits,
        )


# ================================================================================= loading


def disable_dropout(model: nn.Module) -> None:
    """Set every dropout probability to 0: PPO needs the same log-probs in rollout and update."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0


def _check_vocab(name: str, model: nn.Module, tokenizer: PreTrainedTokenizerBase) -> None:
    """The policy tokenizer's ids must index the model's embeddings (value model included:
    it reads the policy's token ids, so it must share the policy's vocabulary)."""
    embeddings = model.get_input_embeddings()  # type: ignore[operator]
    size = getattr(embeddings, "num_embeddings", None)
    if size is not None and len(tokenizer) > size:
        raise ConfigError(
            f"the {name} has {size} token embeddings but the policy tokenizer has "
            f"{len(tokenizer)} tokens; the {name} must use the policy's vocabulary"
        )


def _torch_dtype(name: str) -> Any:
    return "auto" if name == "auto" else getattr(torch, name)


def _name_of(model: Any) -> str | None:
    name = getattr(getattr(unwrap_peft(model), "config", None), "_name_or_path", None)
    return name or None


def load_tokenizer(
    config: PPOConfig,
    tokenizer: PreTrainedTokenizerBase | None = None,
    policy: PreTrainedModel | None = None,
) -> PreTrainedTokenizerBase:
    """``tokenizer`` if given, else the policy tokenizer named by the config (or by ``policy``)."""
    if tokenizer is not None:
        return tokenizer
    source = config.tokenizer_name_or_path or config.model_name_or_path or _name_of(policy)
    if source is None:
        raise ConfigError("set model_name_or_path (or pass policy and tokenizer)")
    return AutoTokenizer.from_pretrained(source, trust_remote_code=config.trust_remote_code)


def _load_value_model(config: PPOConfig, policy: nn.Module, dtype: Any) -> PreTrainedModel:
    """The critic: a 1-label sequence classifier from ``value_model_path`` or the policy's path."""
    value_path = config.value_model_path or config.model_name_or_path or _name_of(policy)
    if value_path is None:
        raise ConfigError("set value_model_path or model_name_or_path")
    # A value model made from the policy checkpoint has a new score head by design:
    # transformers' "newly initialised weights" report is expected, so it is muted.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        value_model = AutoModelForSequenceClassification.from_pretrained(
            value_path,
            num_labels=1,
            dtype=dtype,
            trust_remote_code=config.trust_remote_code,
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    logger.info("value model loaded from %s", value_path)
    return value_model


@dataclass
class Models:
    """The models a run trains (policy, value model) and its reference (None: PEFT's base)."""

    policy: nn.Module
    value_model: nn.Module
    ref_policy: nn.Module | None


def build_models(
    config: PPOConfig,
    tokenizer: PreTrainedTokenizerBase,
    policy: PreTrainedModel | None = None,
    ref_policy: PreTrainedModel | None = None,
    value_model: PreTrainedModel | None = None,
) -> Models:
    """Load the models not given, check their vocabularies, add adapters (``use_peft``), copy
    the reference (not with PEFT) and switch dropout off everywhere."""
    dtype = _torch_dtype(config.dtype)
    if policy is None:
        if config.model_name_or_path is None:
            raise ConfigError("set model_name_or_path (or pass a policy model)")
        policy = AutoModelForCausalLM.from_pretrained(
            config.model_name_or_path, dtype=dtype, trust_remote_code=config.trust_remote_code
        )
    if value_model is None:
        value_model = _load_value_model(config, policy, dtype)
    for name, model in (("policy", policy), ("value model", value_model)):
        _check_vocab(name, model, tokenizer)
    trained_policy: nn.Module = policy
    trained_value: nn.Module = value_model
    if config.use_peft:
        trained_policy, trained_value = _add_adapters(config, policy, value_model)
    reference: nn.Module | None = ref_policy
    if reference is None and not is_peft(trained_policy):
        reference = copy.deepcopy(trained_policy)
    if reference is not None:
        if reference is trained_policy:
            raise ValueError("ref_policy must be a separate copy of the policy")
        reference.requires_grad_(False).eval()
        disable_dropout(reference)
    for model in (trained_policy, trained_value):
        disable_dropout(model)
        if config.gradient_checkpointing:
            unwrap_peft(model).gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False}
            )
    return Models(trained_policy, trained_value, reference)
