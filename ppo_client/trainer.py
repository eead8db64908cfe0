"""PPOTrainer: RLHF PPO (TRL's algorithm) whose reward step sends text to a reward callable.

One update reads top to bottom in :meth:`PPOTrainer.train`:

1. sample a batch of prompts (a seeded order that a resumed run repeats);
2. generate responses chunk by chunk (top_k=0, top_p=1, temperature);
3. truncate each at its stop token, decode prompt and response to text and send them to the
   reward function on a worker thread; while that request is in flight, compute the policy's
   and the reference's log-probs and the critic's values for the chunk;
4. transform the scores ((score - baseline) * scale, missing-EOS penalty);
5. per-token KL penalty with the score added at the last response token, optional reward
   whitening, GAE, advantage whitening;
6. ``num_ppo_epochs`` passes over ``num_mini_batches`` mini-batches, each one optimiser step
   accumulated over ``gradient_accumulation_steps`` micro-batches, with the clipped policy
   and value losses;
7. log metrics (TRL's names), write samples, checkpoint.
"""

from __future__ import annotations

import copy
import ipaddress
import json
import logging
import math
import os
import random
import shutil
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin
from torch import nn
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    get_scheduler,
)
from transformers import logging as hf_logging

from ppo_client import ppo
from ppo_client.config import ConfigError, PPOConfig
from ppo_client.rollout import (
    Prompt,
    RewardInputs,
    contains_token,
    encode_prompts,
    generate_responses,
    normalize_prompt,
    pad_token_id_for,
    position_ids_from_mask,
    reward_inputs,
    sampling_config,
)

__all__ = ["PPOTrainer", "RewardFn", "default_overlap", "load_prompt_dataset"]

logger = logging.getLogger(__name__)

#: Any callable ``(prompts, responses) -> scores`` can be the reward.
RewardFn = Callable[[list[Prompt], list[str]], Sequence[float]]

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
PLOT_FILE = "reward_curve.png"
STATE_FILE = "trainer_state.json"
CHECKPOINT_PREFIX = "checkpoint-"

_TRACKER_MODULES = {
    "tensorboard": ("tensorboard", "tensorboardX"),
    "wandb": ("wandb",),
    "trackio": ("trackio",),
    "comet_ml": ("comet_ml",),
    "mlflow": ("mlflow",),
    "aim": ("aim",),
    "clearml": ("clearml",),
    "dvclive": ("dvclive",),
    "swanlab": ("swanlab",),
}


# ================================================================================= data


class PromptDataset:
    """Random access to the prompt column of a dataset (a ``datasets.Dataset`` or a list)."""

    def __init__(self, data: Any, field: str = "prompt") -> None:
        self._data = data
        self._field = field
        if hasattr(data, "column_names"):
            if field not in data.column_names:
                raise ConfigError(
                    f"the dataset has no {field!r} column (columns: {data.column_names}); "
                    "set dataset_text_field"
                )
        elif not isinstance(data, Sequence):
            raise TypeError("train_dataset must be a datasets.Dataset or a list")
        if len(data) == 0:
            raise ConfigError("the training dataset is empty")

    def __len__(self) -> int:
        return len(self._data)

    def get(self, indices: Sequence[int]) -> list[Prompt]:
        """Prompts at ``indices``, normalised (text or role/content messages)."""
        if hasattr(self._data, "column_names"):
            column = self._data[[int(i) for i in indices]][self._field]
            return [normalize_prompt(v) for v in column]
        out = []
        for i in indices:
            row = self._data[int(i)]
            value = row[self._field] if isinstance(row, Mapping) else row
            out.append(normalize_prompt(value))
        return out


def load_prompt_dataset(config: PPOConfig) -> Any:
    """Load ``config.dataset_name``: a local .jsonl/.json/.csv/.parquet file, a saved
    ``datasets`` folder, or a hub id (with ``dataset_config`` and ``dataset_split``)."""
    import datasets

    name = config.dataset_name
    if not name:
        raise ConfigError("set dataset_name (a local .jsonl/.json/.csv file or a datasets id)")
    path = Path(name)
    builders = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
    if path.is_file():
        builder = builders.get(path.suffix.lower())
        if builder is None:
            raise ConfigError(f"dataset file {name!r}: expected .jsonl, .json, .csv or .parquet")
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    if path.is_dir() and (path / "dataset_info.json").exists():
        loaded = datasets.load_from_disk(str(path))
        return loaded[config.dataset_split] if isinstance(loaded, datasets.DatasetDict) else loaded
    return datasets.load_dataset(name, config.dataset_config, split=config.dataset_split)


# ================================================================================= models


class PolicyAndValue(nn.Module):
    """Policy and critic in one module, so that one ``accelerator.prepare`` (one DDP wrapper)
    covers both; ``forward`` returns response logits (B, T, V) and values (B, T)."""

    def __init__(self, policy: nn.Module, value_model: nn.Module, response_length: int) -> None:
        super().__init__()
        self.policy = policy
        self.value_model = value_model
        self.response_length = response_length
        base = _unwrap_peft(value_model)
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
        t = self.response_length
        kwargs: dict[str, Any] = {"logits_to_keep": t + 1} if self._keep_logits else {}
        out = self.policy(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            **kwargs,
        )
        # Position P - 1 + t predicts response token t; the last position predicts nothing.
        return out.logits[:, -(t + 1) : -1]

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


def _accepts(model: nn.Module, name: str) -> bool:
    """Whether the (maybe PEFT-wrapped) model's forward takes the keyword ``name``."""
    import inspect

    base = _unwrap_peft(model)
    try:
        return name in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False


def _is_peft(model: Any) -> bool:
    try:
        from peft import PeftModel
    except ImportError:
        return False
    return isinstance(model, PeftModel)


def _unwrap_peft(model: nn.Module) -> nn.Module:
    """The transformers model inside a PEFT wrapper (LoRA layers stay injected in it)."""
    return model.get_base_model() if _is_peft(model) else model  # type: ignore[operator]


def disable_dropout(model: nn.Module) -> None:
    """Set every dropout probability to 0: PPO needs the same log-probs in rollout and update."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0


# ================================================================================= state


@dataclass
class TrainerState:
    """Progress that a checkpoint stores: updates done and prompts seen."""

    step: int = 0
    episode: int = 0


@dataclass
class _Rollout:
    """One update's rollouts on this rank (all tensors on the device)."""

    prompts: list[Prompt]
    texts: RewardInputs
    query_responses: torch.Tensor  # (B, P + T)
    attention_mask: torch.Tensor  # (B, P + T), zero on prompt padding and after the stop token
    position_ids: torch.Tensor  # (B, P + T)
    responses: torch.Tensor  # (B, T)
    seq_lengths: torch.Tensor  # (B,)
    logprobs: torch.Tensor  # (B, T)
    ref_logprobs: torch.Tensor  # (B, T)
    values: torch.Tensor  # (B, T)
    raw_scores: torch.Tensor  # (B,)
    truncated: list[bool] | None
    reward_wait_s: float


# ================================================================================= trainer


def _on_this_machine(url: str) -> bool:
    """True when ``url``'s host is this machine (a loopback or unspecified address, or its
    own host name)."""
    host = (urlsplit(url).hostname or "").lower()
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return ip.is_loopback or ip.is_unspecified
    # A name: compare with this host's own (getfqdn may ask DNS, so it goes last).
    return host in ("localhost", socket.gethostname().lower()) or host == socket.getfqdn().lower()


def default_overlap(reward_fn: object, device: torch.device) -> bool:
    """Whether the trainer overlaps reward calls with its passes when not told.

    Overlap hides the reward's time only where the reward has processors of its own: an
    HTTP client to a server elsewhere, or any server while the trainer runs on a GPU. A
    reward computed in process, or a server on this machine while the trainer runs on its
    CPU, competes with the passes for the same cores; two busy-waiting thread teams on them
    made CPU steps slower, not faster (BENCHMARKS.md, PPO step).
    """
    from ppo_client.client import RewardClient

    if not isinstance(reward_fn, RewardClient):
        return False
    if device.type != "cpu":
        return True
    return not all(_on_this_machine(url) for url in reward_fn.base_urls)


class _InlineExecutor(Executor):
    """Runs each submitted call at once on the calling thread (the reward not overlapped)."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            future.set_exception(exc)
        return future


class PPOTrainer:
    """PPO for a causal-LM policy whose reward comes from text (a reward server or any callable).

    ``policy``, ``ref_policy``, ``value_model``, ``tokenizer`` and ``train_dataset`` are built from
    ``config`` when not given. ``reward_fn`` is any callable ``(prompts, responses) ->
    list[float]``; an object with ``score_pairs_detailed``/``score_detailed`` (the
    :class:`~ppo_client.client.RewardClient`) also reports truncation. By default a
    ``RewardClient`` for ``config.reward_url`` is used.
    """

    def __init__(
        self,
        config: PPOConfig,
        policy: PreTrainedModel | None = None,
        ref_policy: PreTrainedModel | None = None,
        value_model: PreTrainedModel | None = None,
        tokenizer: PreTrainedTokenizerBase | None = None,
        train_dataset: Any = None,
        reward_fn: RewardFn | None = None,
    ) -> None:
        self.config = config
        self.accelerator = Accelerator(
            cpu=_launched_on_cpu(),
            # Explicit: the update loop below assumes exactly this many micro-batches per step.
            gradient_accumulation_plugin=GradientAccumulationPlugin(
                num_steps=config.gradient_accumulation_steps, sync_with_dataloader=False
            ),
            # None: accelerate's own setting (``accelerate launch --mixed_precision``) applies.
            mixed_precision="bf16" if config.bf16 else None,
            log_with=_available_trackers(config.report_to) or None,
            project_dir=config.output_dir,
        )
        acc = self.accelerator
        self.output_dir = Path(config.output_dir)
        if acc.is_main_process:
            self.output_dir.mkdir(parents=True, exist_ok=True)
        _seed_everything(config.seed)  # same initial weights (value head) on every rank

        # --- tokenizer and data ---------------------------------------------------------
        model_path = config.model_name_or_path
        if tokenizer is None:
            source = config.tokenizer_name_or_path or model_path or _name_of(policy)
            if source is None:
                raise ConfigError("set model_name_or_path (or pass policy and tokenizer)")
            tokenizer = AutoTokenizer.from_pretrained(
                source, trust_remote_code=config.trust_remote_code
            )
        self.tokenizer = tokenizer
        self.pad_token_id = pad_token_id_for(tokenizer)
        self.stop_token_id = config.resolved_stop_token_id(tokenizer.eos_token_id)
        # The token whose absence triggers missing_eos_penalty (TRL checks EOS).
        self._eos_check_id = (
            self.stop_token_id if self.stop_token_id is not None else tokenizer.eos_token_id
        )
        if train_dataset is None:
            train_dataset = load_prompt_dataset(config)
        self.dataset = PromptDataset(train_dataset, config.dataset_text_field)
        config.derive_sizes(acc.num_processes, len(self.dataset))

        # --- models ---------------------------------------------------------------------
        dtype = _torch_dtype(config.dtype)
        if policy is None:
            if model_path is None:
                raise ConfigError("set model_name_or_path (or pass a policy model)")
            policy = AutoModelForCausalLM.from_pretrained(
                model_path, dtype=dtype, trust_remote_code=config.trust_remote_code
            )
        if value_model is None:
            value_path = config.value_model_path or model_path or _name_of(policy)
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
        for name, model in (("policy", policy), ("value model", value_model)):
            _check_vocab(name, model, tokenizer)
        if config.use_peft:
            policy, value_model = self._add_adapters(policy, value_model)
        self.is_peft = _is_peft(policy)
        if ref_policy is None and not self.is_peft:
            ref_policy = copy.deepcopy(policy)
        if ref_policy is not None:
            if ref_policy is policy:
                raise ValueError("ref_policy must be a separate copy of the policy")
            ref_policy.requires_grad_(False).eval()
            disable_dropout(ref_policy)
        for model in (policy, value_model):
            disable_dropout(model)
            if config.gradient_checkpointing:
                _unwrap_peft(model).gradient_checkpointing_enable(
                    gradient_checkpointing_kwargs={"use_reentrant": False}
                )

        self.model = PolicyAndValue(policy, value_model, config.response_length)
        self.optimizer = self._make_optimizer(self.model)
        assert config.num_total_batches is not None
        warmup = config.warmup_steps or math.ceil(config.warmup_ratio * config.num_total_batches)
        # Stepped once per update (not per optimiser step), as in TRL; not prepared, so that
        # accelerate does not step it once per process.
        self.lr_scheduler = get_scheduler(
            config.lr_scheduler_type,
            self.optimizer,
            num_warmup_steps=warmup,
            num_training_steps=config.num_total_batches,
        )
        self.model, self.optimizer = acc.prepare(self.model, self.optimizer)
        self.ref_policy = ref_policy.to(acc.device) if ref_policy is not None else None

        # --- reward -------------------------------------------------------------------
        if reward_fn is None:
            reward_fn = self._default_reward_fn()
        self.reward_fn = reward_fn
        self.overlap_reward = (
            default_overlap(reward_fn, self.accelerator.device)
            if config.overlap_reward is None
            else config.overlap_reward
        )

        # --- randomness and progress ---------------------------------------------------
        self.local_seed = config.seed + acc.process_index * 100003  # a prime, as TRL
        _seed_everything(self.local_seed)
        self.np_rng = np.random.default_rng(self.local_seed)  # PPO mini-batch shuffles
        self.state = TrainerState()
        self.history: list[dict[str, Any]] = []
        self.gen_config = sampling_config(
            config.response_length, config.temperature, self.stop_token_id, self.pad_token_id
        )
        self._resume_dir = self._find_resume_checkpoint()
        if self._resume_dir is not None:
            self._load_checkpoint(self._resume_dir)
        logger.info(
            "PPO: %d updates of %d rollouts (%d per rank), %d mini-batch(es) of %d per rank, "
            "%d micro-batch(es) of %d",
            config.num_total_batches,
            config.batch_size,
            config.local_batch_size,
            config.num_mini_batches,
            config.local_mini_batch_size,
            config.gradient_accumulation_steps,
            config.per_device_train_batch_size,
        )

    # ----------------------------------------------------------------------------- set-up

    def _add_adapters(
        self, policy: PreTrainedModel, value_model: PreTrainedModel
    ) -> tuple[nn.Module, nn.Module]:
        """LoRA adapters on policy (causal LM) and value model (score head fully trained)."""
        from peft import LoraConfig, get_peft_model

        cfg = self.config
        if cfg.lora_dropout > 0:
            logger.warning(
                "lora_dropout=%s is stored but dropout is off during PPO", cfg.lora_dropout
            )

        def lora(task: str) -> LoraConfig:
            return LoraConfig(
                task_type=task,
                r=cfg.lora_r,
                lora_alpha=cfg.lora_alpha,
                lora_dropout=cfg.lora_dropout,
                target_modules=cfg.lora_target_modules,
            )

        if not _is_peft(policy):
            policy = get_peft_model(policy, lora("CAUSAL_LM"))
        if not _is_peft(value_model):
            value_model = get_peft_model(value_model, lora("SEQ_CLS"))
        return policy, value_model

    def _make_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """AdamW over the trainable parameters; no weight decay on biases and norms."""
        cfg = self.config
        decay, no_decay = [], []
        for param in model.parameters():
            if param.requires_grad:
                (decay if param.ndim >= 2 else no_decay).append(param)
        groups = [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(
            [g for g in groups if g["params"]],
            lr=cfg.learning_rate,
            betas=(cfg.adam_beta1, cfg.adam_beta2),
            eps=cfg.adam_epsilon,
        )

    def _default_reward_fn(self) -> RewardFn:
        """A RewardClient for ``config.reward_url``."""
        cfg = self.config
        if not cfg.reward_url:
            raise ConfigError("set reward_url (the reward server) or pass reward_fn")
        from ppo_client.client import RewardClient

        return RewardClient(
            cfg.reward_url,
            api_key=cfg.reward_api_key,
            timeout=cfg.reward_timeout,
            max_retries=cfg.reward_max_retries,
        )

    # ----------------------------------------------------------------------------- data

    def _batch_indices(self, update: int) -> list[int]:
        """This rank's dataset indices for update ``update`` (0-based): a seeded permutation per
        pass over the data, so the order depends only on the seed and the step."""
        cfg = self.config
        assert cfg.batch_size is not None and cfg.local_batch_size is not None
        per_epoch = len(self.dataset) // cfg.batch_size  # drop_last, as TRL
        epoch, k = divmod(update, per_epoch)
        order = np.random.default_rng([cfg.seed, epoch]).permutation(len(self.dataset))
        batch = order[k * cfg.batch_size : (k + 1) * cfg.batch_size]
        rank = self.accelerator.process_index
        return batch[rank * cfg.local_batch_size : (rank + 1) * cfg.local_batch_size].tolist()

    # ----------------------------------------------------------------------------- rollout

    def _score(self, inputs: RewardInputs) -> tuple[list[float], list[bool] | None]:
        """Call the reward function (on the worker thread); scores and, if known, truncation."""
        fn: Any = self.reward_fn
        prompts, responses = inputs.prompts, inputs.responses
        truncated: list[bool] | None = None
        if hasattr(fn, "score_pairs_detailed"):
            result = fn.score_pairs_detailed(prompts, responses)
            scores, truncated = list(result.scores), list(result.truncated)
        elif hasattr(fn, "score_detailed"):
            if all(isinstance(p, str) for p in prompts):
                result = fn.score_detailed(queries=prompts, responses=responses)
            else:
                conversations = [
                    [*p, {"role": "assistant", "content": r}]
                    for p, r in zip(prompts, responses, strict=True)
                ]
                result = fn.score_detailed(conversations=conversations)
            scores, truncated = list(result.scores), list(result.truncated)
        else:
            scores = list(fn(prompts, responses))
        if len(scores) != len(responses):
            raise ValueError(
                f"the reward function returned {len(scores)} scores for {len(responses)} responses"
            )
        scores = [float(s) for s in scores]
        if not all(math.isfinite(s) for s in scores):
            raise ValueError(f"the reward function returned a non-finite score: {scores}")
        return scores, truncated

    @torch.no_grad()
    def _rollout(self, prompts: list[Prompt], pool: Executor) -> _Rollout:
        """Generate, decode and score; ref log-probs and values are computed while scoring runs."""
        cfg, acc = self.config, self.accelerator
        device = acc.device
        enc = encode_prompts(self.tokenizer, prompts, self.pad_token_id, cfg.max_prompt_length)
        if enc.num_truncated:
            logger.debug("%d prompt(s) cut to max_prompt_length", enc.num_truncated)
        queries = enc.input_ids.to(device)  # (B, P), left-padded
        query_mask = enc.attention_mask.to(device)
        wrapper: PolicyAndValue = acc.unwrap_model(self.model)
        wrapper.eval()
        chunk = cfg.local_rollout_forward_batch_size
        futures: list[Future[tuple[list[float], list[bool] | None]]] = []
        parts: dict[str, list[torch.Tensor]] = {
            k: [] for k in ("qr", "mask", "pos", "resp", "len", "logp", "ref", "val")
        }
        texts = RewardInputs([], [])
        reward_wait_s = 0.0  # time this thread was blocked on the reward function
        for start in range(0, queries.size(0), chunk):
            rows = slice(start, start + chunk)
            query, qmask = queries[rows], query_mask[rows]
            # 1. sample (pure sampling at the configured temperature)
            responses = generate_responses(wrapper.policy, query, qmask, self.gen_config, chunk)
            # 2. truncate at the stop token; the response ends at index seq_len (inclusive)
            seq_lengths = ppo.sequence_lengths(responses, self.stop_token_id)  # (b,)
            resp_mask = ppo.response_mask(seq_lengths, cfg.response_length)  # (b, T)
            responses = responses.masked_fill(~resp_mask, self.pad_token_id)
            # 3. decode to text and score it on the worker thread
            chunk_texts = reward_inputs(
                self.tokenizer, prompts[rows], query, qmask, responses, seq_lengths
            )
            # (An inline executor scores right here: that time counts as waited, too.)
            submitted = time.perf_counter()
            futures.append(pool.submit(self._score, chunk_texts))
            reward_wait_s += time.perf_counter() - submitted
            texts.prompts.extend(chunk_texts.prompts)
            texts.responses.extend(chunk_texts.responses)
            # 4. meanwhile: log-probs of policy and reference, and values, on the same inputs
            query_response = torch.cat([query, responses], 1)  # (b, P + T)
            attention_mask = torch.cat([qmask, resp_mask.long()], 1)
            position_ids = position_ids_from_mask(attention_mask)
            with acc.autocast():
                logits = wrapper.policy_logits(query_response, attention_mask, position_ids)
                logprobs = ppo.logprobs_from_logits(logits / cfg.temperature, responses)
                del logits
                ref_logits = self._ref_logits(wrapper, query_response, attention_mask, position_ids)
                ref_logprobs = ppo.logprobs_from_logits(ref_logits / cfg.temperature, responses)
                del ref_logits
                values = wrapper.values(query_response, attention_mask, position_ids)
            parts["qr"].append(query_response)
            parts["mask"].append(attention_mask)
            parts["pos"].append(position_ids)
            parts["resp"].append(responses)
            parts["len"].append(seq_lengths)
            parts["logp"].append(logprobs)
            parts["ref"].append(ref_logprobs)
            parts["val"].append(values)
        # 5. collect the scores; only the time spent blocked here is network the GPU did not hide
        waited = time.perf_counter()
        results = [f.result() for f in futures]
        reward_wait_s += time.perf_counter() - waited
        wrapper.train()
        scores = [s for chunk_scores, _ in results for s in chunk_scores]
        truncated: list[bool] | None = None
        if all(t is not None for _, t in results):
            truncated = [bool(x) for _, t in results for x in (t or [])]
        cat = {k: torch.cat(v, 0) for k, v in parts.items()}
        return _Rollout(
            prompts=prompts,
            texts=texts,
            query_responses=cat["qr"],
            attention_mask=cat["mask"],
            position_ids=cat["pos"],
            responses=cat["resp"],
            seq_lengths=cat["len"],
            logprobs=cat["logp"],
            ref_logprobs=cat["ref"],
            values=cat["val"],
            raw_scores=torch.tensor(scores, dtype=torch.float32, device=device),
            truncated=truncated,
            reward_wait_s=reward_wait_s,
        )

    def _ref_logits(
        self,
        wrapper: PolicyAndValue,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
    ) -> torch.Tensor:
        """Reference logits (B, T, V): the frozen copy, or the policy with its adapter disabled."""
        if self.ref_policy is None:
            with wrapper.policy.disable_adapter():
                return wrapper.policy_logits(input_ids, attention_mask, position_ids)
        t = self.config.response_length
        kwargs: dict[str, Any] = (
            {"logits_to_keep": t + 1} if _accepts(self.ref_policy, "logits_to_keep") else {}
        )
        out = self.ref_policy(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
            **kwargs,
        )
        return out.logits[:, -(t + 1) : -1]

    # ----------------------------------------------------------------------------- train

    def train(self) -> list[dict[str, Any]]:
        """Run the remaining updates; returns the metrics of every step (also in metrics.jsonl)."""
        cfg, acc = self.config, self.accelerator
        assert cfg.num_total_batches is not None and cfg.batch_size is not None
        if acc.is_main_process:
            self._prepare_logs()
        if acc.log_with:
            acc.init_trackers(cfg.run_name or "ppo_client", config=_tracker_config(cfg))
        start_step = self.state.step
        save_every = cfg.save_every()
        sample_every = (
            max(1, cfg.num_total_batches // cfg.num_sample_generations)
            if cfg.num_sample_generations > 0
            else 0
        )
        progress = _progress(cfg, acc, start_step)
        start_time, start_episode = time.time(), self.state.episode
        pool: Executor = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="ppo-reward")
            if self.overlap_reward
            else _InlineExecutor()
        )
        try:
            for step in range(start_step + 1, cfg.num_total_batches + 1):
                t0 = time.perf_counter()
                prompts = self.dataset.get(self._batch_indices(step - 1))
                rollout = self._rollout(prompts, pool)
                t1 = time.perf_counter()
                self.state.episode += cfg.batch_size
                advantages = self._advantages(rollout)
                stats = self._ppo_epochs(rollout, advantages)
                t2 = time.perf_counter()
                self.state.step = step
                metrics = self._metrics(rollout, advantages, stats)
                elapsed = max(time.time() - start_time, 1e-9)
                metrics["eps"] = int((self.state.episode - start_episode) / elapsed)
                metrics["time/rollout_s"] = t1 - t0
                metrics["time/update_s"] = t2 - t1
                self.lr_scheduler.step()
                self._log(step, metrics, progress)
                if sample_every and (step - 1) % sample_every == 0:
                    self._write_samples(step, rollout, advantages)
                if step % save_every == 0:
                    self.save_checkpoint()
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            progress.close()
        self.save_model(self.output_dir)
        if acc.is_main_process:
            self._plot()
        acc.end_training()
        return self.history

    @torch.no_grad()
    def _advantages(self, r: _Rollout) -> dict[str, torch.Tensor]:
        """Scores -> per-token rewards -> GAE advantages and returns (all masked)."""
        cfg = self.config
        mask = ppo.response_mask(r.seq_lengths, cfg.response_length)  # (B, T)
        scores = (r.raw_scores - cfg.reward_baseline) * cfg.reward_scale  # (B,)
        has_eos = contains_token(r.responses, self._eos_check_id, mask)  # (B,)
        if cfg.missing_eos_penalty is not None:
            scores = torch.where(has_eos, scores, scores - cfg.missing_eos_penalty)
        kl = ppo.kl_penalty(r.logprobs, r.ref_logprobs, cfg.kl_estimator, mask)  # (B, T)
        rewards, non_score_reward = ppo.per_token_rewards(kl, scores, r.seq_lengths, cfg.kl_coef)
        if cfg.whiten_rewards:
            rewards = ppo.masked_whiten(rewards, mask, shift_mean=False) * mask
        values = r.values * mask
        advantages, returns = ppo.compute_gae(values, rewards, cfg.gamma, cfg.lam, mask)
        advantages = ppo.masked_whiten(advantages, mask) * mask
        return {
            "mask": mask,
            "scores": scores,
            "has_eos": has_eos,
            "kl": kl,
            "non_score_reward": non_score_reward,
            "values": values,
            "advantages": advantages,
            "returns": returns,
        }

    def _ppo_epochs(self, r: _Rollout, a: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Clipped PPO updates over shuffled mini-batches; per-micro-batch statistics."""
        cfg, acc = self.config, self.accelerator
        assert cfg.local_batch_size is not None and cfg.local_mini_batch_size is not None
        shape = (cfg.num_ppo_epochs, cfg.num_mini_batches, cfg.gradient_accumulation_steps)
        names = ("approxkl", "pg_clipfrac", "pg_loss", "vf_loss", "vf_clipfrac", "entropy", "ratio")
        stats = {n: torch.zeros(shape, device=acc.device) for n in names}
        self.model.train()
        size = cfg.per_device_train_batch_size
        for epoch in range(cfg.num_ppo_epochs):
            order = torch.from_numpy(self.np_rng.permutation(cfg.local_batch_size))
            for mb in range(cfg.num_mini_batches):
                mini = order[mb * cfg.local_mini_batch_size : (mb + 1) * cfg.local_mini_batch_size]
                for ga in range(cfg.gradient_accumulation_steps):
                    idx = mini[ga * size : (ga + 1) * size].to(acc.device)
                    with acc.accumulate(self.model):
                        logits, vpred = self.model(
                            input_ids=r.query_responses[idx],
                            attention_mask=r.attention_mask[idx],
                            position_ids=r.position_ids[idx],
                        )
                        logits = logits / cfg.temperature
                        new_logprobs = ppo.logprobs_from_logits(logits, r.responses[idx])
                        mask = a["mask"][idx]
                        pg = ppo.policy_loss(
                            new_logprobs, r.logprobs[idx], a["advantages"][idx], mask, cfg.cliprange
                        )
                        vf = ppo.value_loss(
                            vpred, a["values"][idx], a["returns"][idx], mask, cfg.cliprange_value
                        )
                        loss = pg.loss + cfg.vf_coef * vf.loss
                        acc.backward(loss)
                        if cfg.max_grad_norm is not None and acc.sync_gradients:
                            acc.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                        self.optimizer.step()
                        self.optimizer.zero_grad()
                    with torch.no_grad():
                        at = (epoch, mb, ga)
                        stats["approxkl"][at] = pg.approxkl
                        stats["pg_clipfrac"][at] = pg.clipfrac
                        stats["pg_loss"][at] = pg.loss.detach()
                        stats["vf_loss"][at] = vf.loss.detach()
                        stats["vf_clipfrac"][at] = vf.clipfrac
                        entropy = ppo.entropy_from_logits(logits.detach())
                        stats["entropy"][at] = ppo.masked_mean(entropy, mask)
                        stats["ratio"][at] = pg.ratio
                    del logits, vpred, new_logprobs, loss
        return stats

    # ----------------------------------------------------------------------------- metrics

    @torch.no_grad()
    def _metrics(
        self, r: _Rollout, a: dict[str, torch.Tensor], stats: dict[str, torch.Tensor]
    ) -> dict[str, Any]:
        """TRL's metric names, averaged over ranks (counts summed, wait times maxed)."""
        acc = self.accelerator
        mask = a["mask"]
        non_score = a["non_score_reward"].sum(1).mean()
        truncated_frac = (
            sum(r.truncated) / max(len(r.truncated), 1) if r.truncated is not None else float("nan")
        )
        means = {
            "objective/kl": a["kl"].sum(1).mean(),
            "objective/entropy": (-r.logprobs * mask).sum(1).mean(),
            "objective/non_score_reward": non_score,
            "objective/rlhf_reward": non_score + a["scores"].mean(),
            "objective/scores": a["scores"].mean(),
            "objective/raw_scores": r.raw_scores.mean(),
            "policy/approxkl_avg": stats["approxkl"].mean(),
            "policy/clipfrac_avg": stats["pg_clipfrac"].mean(),
            "loss/policy_avg": stats["pg_loss"].mean(),
            "loss/value_avg": stats["vf_loss"].mean(),
            "val/clipfrac_avg": stats["vf_clipfrac"].mean(),
            "policy/entropy_avg": stats["entropy"].mean(),
            "val/ratio": stats["ratio"].mean(),
            "val/response_length": (r.seq_lengths + 1).float().mean(),
            "reward/truncated_frac": torch.tensor(truncated_frac),
        }
        local = torch.stack([v.float().to(acc.device) for v in means.values()])
        extras = torch.tensor(
            [float(a["has_eos"].sum()), r.reward_wait_s], device=acc.device, dtype=torch.float32
        )
        gathered = acc.gather(torch.cat([local, extras]).unsqueeze(0))  # (world, K + 2)
        avg = gathered[:, : len(means)].mean(0).tolist()
        metrics: dict[str, Any] = dict(zip(means, avg, strict=True))
        metrics["val/ratio_var"] = acc.gather(stats["ratio"].flatten()).var().item()
        metrics["val/num_eos_tokens"] = int(gathered[:, len(means)].sum().item())
        metrics["time/reward_wait_s"] = float(gathered[:, len(means) + 1].max().item())
        metrics["lr"] = self.lr_scheduler.get_last_lr()[0]
        metrics["episode"] = self.state.episode
        if r.truncated is None:
            del metrics["reward/truncated_frac"]
        return metrics

    def _prepare_logs(self) -> None:
        """Load the metric history; on resume, drop lines written after the checkpoint's step."""
        for name in (METRICS_FILE, SAMPLES_FILE):
            path = self.output_dir / name
            if not path.exists():
                continue
            kept = []
            for line in path.read_text(encoding="utf-8").splitlines():
                if not line.strip():
                    continue
                row = json.loads(line)
                if row.get("step", 0) <= self.state.step:
                    kept.append(line)
                    if name == METRICS_FILE:
                        self.history.append(row)
            if self.state.step == 0:
                kept, self.history = [], []  # a fresh run starts fresh logs
            path.write_text("".join(k + "\n" for k in kept), encoding="utf-8")

    def _log(self, step: int, metrics: dict[str, Any], progress: Any) -> None:
        """metrics.jsonl, trackers, progress bar and (every logging_steps) a log line."""
        acc = self.accelerator
        row = {"step": step, **metrics}
        self.history.append(row)
        if acc.is_main_process:
            with (self.output_dir / METRICS_FILE).open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            progress.set_postfix(
                score=f"{metrics['objective/scores']:.3f}", kl=f"{metrics['objective/kl']:.3f}"
            )
            progress.update(1)
            if self.config.logging_steps > 0 and step % self.config.logging_steps == 0:
                logger.info(
                    "step %d/%s: score %.4f kl %.4f loss/policy %.4f loss/value %.4f",
                    step,
                    self.config.num_total_batches,
                    metrics["objective/scores"],
                    metrics["objective/kl"],
                    metrics["loss/policy_avg"],
                    metrics["loss/value_avg"],
                )
        if acc.log_with:
            acc.log(metrics, step=step)

    def _write_samples(self, step: int, r: _Rollout, a: dict[str, torch.Tensor]) -> None:
        """A few of this update's rollouts (rank 0) with their scores, to samples.jsonl."""
        if not self.accelerator.is_main_process:
            return
        n = min(self.config.num_samples_to_log, len(r.prompts))
        with (self.output_dir / SAMPLES_FILE).open("a", encoding="utf-8") as f:
            for i in range(n):
                row = {
                    "step": step,
                    "prompt": r.prompts[i],
                    "query": r.texts.prompts[i],
                    "response": r.texts.responses[i],
                    "score": float(r.raw_scores[i]),
                    "reward": float(a["scores"][i]),
                }
                f.write(json.dumps(row, ensure_ascii=False) + "\n")

    def _plot(self) -> None:
        """reward_curve.png: score and KL against step."""
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        steps = [row["step"] for row in self.history]
        fig = Figure(figsize=(9, 3.5), tight_layout=True)
        FigureCanvasAgg(fig)
        for i, (key, label) in enumerate(
            (("objective/scores", "score"), ("objective/kl", "KL(policy || ref)"))
        ):
            ax = fig.add_subplot(1, 2, i + 1)
            ax.plot(
                steps, [row[key] for row in self.history], marker="." if len(steps) < 50 else ""
            )
            ax.set_xlabel("step")
            ax.set_title(label)
            ax.grid(alpha=0.3)
        fig.savefig(self.output_dir / PLOT_FILE, dpi=100)

    # ----------------------------------------------------------------------------- saving

    def save_model(self, output_dir: str | os.PathLike[str]) -> None:
        """Save the policy (or its adapter) with the tokenizer, and the value model under
        ``value_model/``."""
        acc = self.accelerator
        acc.wait_for_everyone()
        if acc.is_main_process:
            out = Path(output_dir)
            wrapper: PolicyAndValue = acc.unwrap_model(self.model)
            wrapper.policy.save_pretrained(out)
            self.tokenizer.save_pretrained(out)
            wrapper.value_model.save_pretrained(out / "value_model")
        acc.wait_for_everyone()

    def save_checkpoint(self) -> Path:
        """Write ``checkpoint-N`` (models, optimiser, scheduler, RNG, progress) atomically."""
        acc = self.accelerator
        step = self.state.step
        final = self.output_dir / f"{CHECKPOINT_PREFIX}{step}"
        tmp = self.output_dir / f".tmp-{CHECKPOINT_PREFIX}{step}"
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        acc.wait_for_everyone()
        torch.save(_rng_state(self.np_rng), tmp / f"rng_state_{acc.process_index}.pt")
        if acc.is_main_process:
            wrapper: PolicyAndValue = acc.unwrap_model(self.model)
            wrapper.policy.save_pretrained(tmp / "policy")
            self.tokenizer.save_pretrained(tmp / "policy")
            wrapper.value_model.save_pretrained(tmp / "value_model")
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(self.lr_scheduler.state_dict(), tmp / "scheduler.pt")
            state = {
                "step": step,
                "episode": self.state.episode,
                "num_total_batches": self.config.num_total_batches,
                "batch_size": self.config.batch_size,
                "world_size": acc.num_processes,
                "seed": self.config.seed,
                # The data order is a function of (seed, step): this is the dataloader position.
                "data_position": step,
                "config": self.config.to_dict(),
            }
            (tmp / STATE_FILE).write_text(json.dumps(state, indent=2), encoding="utf-8")
        acc.wait_for_everyone()
        if acc.is_main_process:
            # Re-saving a step (after resuming from an older checkpoint): the old folder is
            # moved aside, not deleted, until the new one is in place; a kill in between
            # leaves the older checkpoints to resume from.
            stale = final.with_name(f".old-{final.name}")
            if final.exists():
                shutil.rmtree(stale, ignore_errors=True)
                os.replace(final, stale)
            os.replace(tmp, final)
            shutil.rmtree(stale, ignore_errors=True)
            self._rotate_checkpoints()
            logger.info("saved %s", final)
        acc.wait_for_everyone()
        return final

    def _rotate_checkpoints(self) -> None:
        limit = self.config.save_total_limit
        if not limit:
            return
        for old in list_checkpoints(self.output_dir)[:-limit]:
            shutil.rmtree(old, ignore_errors=True)

    def _find_resume_checkpoint(self) -> Path | None:
        target = self.config.resume_from_checkpoint
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

    def _load_checkpoint(self, path: Path) -> None:
        """Restore models, optimiser, scheduler, RNG and progress from ``path``."""
        acc = self.accelerator
        state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
        if state.get("batch_size") != self.config.batch_size:
            raise ConfigError(
                f"{path} was written with batch_size {state.get('batch_size')}, this run has "
                f"{self.config.batch_size}; resuming would change the data order"
            )
        wrapper: PolicyAndValue = acc.unwrap_model(self.model)
        _load_weights(wrapper.policy, path / "policy")
        _load_weights(wrapper.value_model, path / "value_model")
        self.optimizer.load_state_dict(
            torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
        )
        self.lr_scheduler.load_state_dict(
            torch.load(path / "scheduler.pt", map_location="cpu", weights_only=True)
        )
        rng_file = path / f"rng_state_{acc.process_index}.pt"
        if rng_file.exists():
            _set_rng_state(torch.load(rng_file, weights_only=False), self.np_rng)
        else:
            logger.warning("%s has no RNG state for rank %d", path, acc.process_index)
        self.state = TrainerState(step=int(state["step"]), episode=int(state["episode"]))
        logger.info("resumed from %s at step %d", path, self.state.step)


# ================================================================================= helpers


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


def _load_weights(model: nn.Module, folder: Path) -> None:
    """Load a ``save_pretrained`` folder into an existing model (PEFT: the adapter only)."""
    from safetensors.torch import load_file

    if _is_peft(model):
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


def _rng_state(np_rng: np.random.Generator) -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "trainer_numpy": np_rng.bit_generator.state,
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping[str, Any], np_rng: np.random.Generator) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    np_rng.bit_generator.state = state["trainer_numpy"]
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _launched_on_cpu() -> bool:
    """Several processes launched (``accelerate launch``/torchrun) on a machine without an
    accelerator: ask accelerate for multi-CPU (gloo) instead of N independent runs."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    accel = getattr(torch, "accelerator", None)
    has_accelerator = accel.is_available() if accel is not None else torch.cuda.is_available()
    return not has_accelerator


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _torch_dtype(name: str) -> Any:
    return "auto" if name == "auto" else getattr(torch, name)


def _name_of(model: Any) -> str | None:
    name = getattr(getattr(_unwrap_peft(model), "config", None), "_name_or_path", None)
    return name or None


def _available_trackers(report_to: str | Sequence[str]) -> list[str]:
    """The requested trackers that are installed (others are skipped with a warning)."""
    import importlib.util

    wanted = [report_to] if isinstance(report_to, str) else list(report_to)
    wanted = [w.strip() for w in wanted if w and w.strip().lower() != "none"]
    if "all" in wanted:
        wanted = list(_TRACKER_MODULES)
        quiet = True
    else:
        quiet = False
    out = []
    for name in wanted:
        modules = _TRACKER_MODULES.get(name)
        if modules is None:
            raise ConfigError(
                f"report_to: unknown tracker {name!r} (known: {sorted(_TRACKER_MODULES)})"
            )
        if any(importlib.util.find_spec(m) is not None for m in modules):
            out.append(name)
        elif not quiet:
            logger.warning("report_to: %s is not installed; not reporting to it", name)
    return out


def _tracker_config(cfg: PPOConfig) -> dict[str, Any]:
    """The config flattened to values trackers accept."""
    out: dict[str, Any] = {}
    for k, v in cfg.to_dict().items():
        out[k] = v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
    return {k: ("" if v is None else v) for k, v in out.items()}


def _progress(cfg: PPOConfig, acc: Accelerator, start: int) -> Any:
    from tqdm import tqdm

    return tqdm(
        total=cfg.num_total_batches,
        initial=start,
        desc="PPO",
        unit="step",
        disable=cfg.disable_tqdm or not acc.is_main_process,
        dynamic_ncols=True,
    )
