"""PPOTrainer: RLHF PPO (TRL's algorithm) whose reward step sends text to a reward callable.

One update reads top to bottom in :meth:`PPOTrainer.train`:

1. sample a batch of prompts (a seeded order that a resumed run repeats; :mod:`.data`);
2. generate responses chunk by chunk (top_k=0, top_p=1, temperature; :mod:`.rollout`);
3. truncate each at its stop token, decode prompt and response to text and send them to the
   reward function on a worker thread (:mod:`.reward`); while that request is in flight,
   compute the policy's and the reference's log-probs and the critic's values for the chunk;
4. transform the scores ((score - baseline) * scale, missing-EOS penalty); a rollout whose
   reward was masked (None: it could not be computed) is left out of steps 4-7, and an
   update with every rollout masked is skipped with a warning;
5. per-token KL penalty with the score added at the last response token, optional reward
   whitening, GAE, advantage whitening (steps 4-5: :func:`.ppo.compute_advantages`);
6. ``num_ppo_epochs`` passes over ``num_mini_batches`` mini-batches, each one optimiser step
   accumulated over ``gradient_accumulation_steps`` micro-batches, with the clipped policy
   and value losses;
7. log metrics (TRL's names; :mod:`.reporting`), write samples, checkpoint
   (:mod:`.checkpoint`).

Models are built in :mod:`.models`, batch sizes derived in :mod:`.sizes`.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import GradientAccumulationPlugin
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase, get_scheduler

from ppo_client import ppo
from ppo_client.checkpoint import (
    Checkpointer,
    RunInfo,
    TrainerState,
    TrainingParts,
    rng_state,
    seed_everything,
    set_rng_state,
)
from ppo_client.config import ConfigError, PPOConfig
from ppo_client.data import PromptDataset, batch_indices, load_prompt_dataset
from ppo_client.models import (
    Models,
    PolicyAndValue,
    Reference,
    build_models,
    is_peft,
    load_tokenizer,
)
from ppo_client.normalization import RunningNormalizer
from ppo_client.precision import use_bf16
from ppo_client.reporting import RunReport, available_trackers, skipped_metrics, step_metrics
from ppo_client.reward import (
    RewardFn,
    check_labels_taken,
    check_process_reward,
    default_overlap,
    default_reward_fn,
    reward_executor,
    score_rollouts,
)
from ppo_client.rollout import Prompt, Rollout, RolloutCollector, pad_token_id_for
from ppo_client.sizes import BatchSizes, run_config
from ppo_client.stopping import StopSignals, TrainingStopped

if TYPE_CHECKING:
    from ppo_client.vllm_rollout import VllmRollout

__all__ = ["PPOTrainer", "RewardFn", "default_overlap", "load_prompt_dataset"]

logger = logging.getLogger(__name__)


class PPOTrainer:
    """PPO for a causal-LM policy whose reward comes from text (a reward server or any callable).

    ``policy``, ``ref_policy``, ``value_model``, ``tokenizer`` and ``train_dataset`` are built from
    ``config`` when not given. ``reward_fn`` is any callable ``(prompts, responses) ->
    list[float | None]`` (None: a masked reward, that rollout is left out of the update); an
    object with ``score_pairs_detailed``/``score_detailed`` (the
    :class:`~reward_client.RewardClient`) also reports truncation and each masked item's
    reason. By default a ``RewardClient`` for ``config.reward_url`` is used.
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
        self.accelerator = acc = _make_accelerator(config)
        self.output_dir = Path(config.output_dir)
        if acc.is_main_process:
            self.output_dir.mkdir(parents=True, exist_ok=True)
        seed_everything(config.seed)  # same initial weights (value head) on every rank

        # 1. tokenizer, prompt data and batch sizes
        self.tokenizer = load_tokenizer(config, tokenizer, policy)
        self.pad_token_id = pad_token_id_for(self.tokenizer)
        self.stop_token_id = config.resolved_stop_token_id(self.tokenizer.eos_token_id)
        if train_dataset is None:
            train_dataset = load_prompt_dataset(config)
        self.dataset = PromptDataset(train_dataset, config.dataset_text_field, config.label_column)
        self.sizes = BatchSizes.from_config(config, acc.num_processes, len(self.dataset))
        # 2. models and optimiser (a new value head or adapters draw from the seeded RNG)
        self._set_up_models(build_models(config, self.tokenizer, policy, ref_policy, value_model))
        # 3. the reward and the rollout step
        self._owns_reward_fn = reward_fn is None
        self._set_up_rollouts(reward_fn if reward_fn is not None else default_reward_fn(config))
        # 4. per-rank randomness, reports, checkpoints (and resuming from one)
        self.local_seed = config.seed + acc.process_index * 100003  # a prime, as TRL
        seed_everything(self.local_seed)
        self.np_rng = np.random.default_rng(self.local_seed)  # PPO mini-batch shuffles
        self.state = TrainerState()
        self._started = (time.time(), self.state.episode)  # (clock, episode) of this train()
        self.report = RunReport(config, acc, self.output_dir, self.sizes.num_total_batches)
        self.checkpoints = self._checkpointer()
        self._resume_dir = self.checkpoints.find(config.resume_from_checkpoint)
        if self._resume_dir is not None:
            self.state = self.checkpoints.load(self._resume_dir)
        self.normalizer: RunningNormalizer | None = None
        if config.reward_normalization == "running":
            self.normalizer = RunningNormalizer(config.reward_normalization_window)
            self.normalizer.load(self.state.reward_window)
        _log_sizes(config, self.sizes)

    def _set_up_models(self, models: Models) -> None:
        """Policy and critic in one prepared module, their optimiser and schedule; the
        reference on the device."""
        cfg, acc = self.config, self.accelerator
        self.is_peft = is_peft(models.policy)
        self.model = PolicyAndValue(models.policy, models.value_model, cfg.response_length)
        self.optimizer = _make_optimizer(self.model, cfg)
        self.lr_scheduler = _make_scheduler(self.optimizer, cfg, self.sizes)
        self.model, self.optimizer = acc.prepare(self.model, self.optimizer)
        ref = models.ref_policy
        self.ref_policy = ref.to(acc.device) if ref is not None else None

    def _set_up_rollouts(self, reward_fn: RewardFn) -> None:
        """The reward (overlapped or not), the rollout step and the advantage options."""
        cfg, acc = self.config, self.accelerator
        self.reward_fn = reward_fn
        check_labels_taken(reward_fn, cfg.label_column)
        if cfg.reward_mode == "process":
            check_process_reward(reward_fn)
        self.overlap_reward = (
            default_overlap(reward_fn, acc.device)
            if cfg.overlap_reward is None
            else cfg.overlap_reward
        )
        self.rollouts = RolloutCollector(
            config=cfg,
            accelerator=acc,
            tokenizer=self.tokenizer,
            reference=Reference(self.ref_policy, cfg.response_length),
            score=functools.partial(score_rollouts, reward_fn),
            stop_token_id=self.stop_token_id,
            pad_token_id=self.pad_token_id,
        )
        self.advantage_params = _advantage_params(cfg, self.stop_token_id, self.tokenizer)

    def _rollout_engine(self) -> VllmRollout | None:
        """rollout_engine vllm: this rank's engine, built from the policy's checkpoint (for
        one train(): it is closed at its end, before accelerate takes down the process
        group vLLM's shares)."""
        cfg = self.config
        if cfg.rollout_engine != "vllm":
            return None
        if cfg.model_name_or_path is None:
            raise ConfigError("rollout_engine: vllm loads the policy from model_name_or_path")
        from ppo_client.vllm_rollout import VllmRollout, adapter_rank

        policy = self.accelerator.unwrap_model(self.model).policy
        dtype = str(next(policy.parameters()).dtype).removeprefix("torch.")
        length = None
        if cfg.max_prompt_length is not None:
            length = cfg.max_prompt_length + cfg.response_length
        return VllmRollout(
            cfg.model_name_or_path,
            response_length=cfg.response_length,
            temperature=cfg.temperature,
            stop_token_id=self.stop_token_id,
            pad_token_id=self.pad_token_id,
            seed=cfg.seed + self.accelerator.process_index * 100003,
            max_model_len=length,
            dtype=dtype,
            memory_share=cfg.vllm_memory_share,
            engine_args=cfg.vllm_engine_args,
            lora_rank=adapter_rank(policy) if cfg.vllm_lora == "adapter" else None,
        )

    def _checkpointer(self) -> Checkpointer:
        """Saves and loads this run's checkpoints (models, optimiser, schedule, RNG)."""
        cfg, sizes = self.config, self.sizes
        parts = TrainingParts(
            self.model, self.tokenizer, self.optimizer, self.lr_scheduler, self.np_rng
        )
        info = RunInfo(
            num_total_batches=sizes.num_total_batches,
            batch_size=sizes.batch_size,
            world_size=self.accelerator.num_processes,
            seed=cfg.seed,
            config=run_config(cfg, sizes),
        )
        return Checkpointer(self.accelerator, self.output_dir, parts, info, cfg.save_total_limit)

    # ----------------------------------------------------------------------------- train

    def train(self) -> list[dict[str, Any]]:
        """Run the remaining updates; returns the metrics of every step (also in metrics.jsonl).

        On SIGTERM/Ctrl-C, or when the reward fails for good, the last completed update is
        checkpointed before the exception (TrainingStopped, the reward's error) leaves.
        """
        cfg, sizes = self.config, self.sizes
        self.report.start(self.state.step, run_config(cfg, sizes))
        self._started = (time.time(), self.state.episode)
        pool = reward_executor(self.overlap_reward)
        self._show_reward_waits()
        self.rollouts.engine = self._rollout_engine()
        try:
            with StopSignals(immediate=self.accelerator.num_processes == 1) as stop:
                for step in range(self.state.step + 1, sizes.num_total_batches + 1):
                    self._update(step, pool, stop)
                    # 8. a signal that came during the update stops the run now it is whole
                    signum = stop.requested_by_any(self.accelerator)
                    if signum is not None and step < sizes.num_total_batches:
                        self._checkpoint_on_exit()
                        raise TrainingStopped(signum)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            self.report.close()
            engine, self.rollouts.engine = self.rollouts.engine, None
            if engine is not None:
                engine.close()
        self.save_model(self.output_dir)
        self.report.finish()
        return self.report.history

    def _update(self, step: int, pool: Executor, stop: StopSignals) -> None:
        """One PPO update, from this step's prompts to its metrics and checkpoint."""
        cfg, sizes = self.config, self.sizes
        t0 = time.perf_counter()
        # 1. this update's prompts: a seeded order that a resumed run repeats
        indices = batch_indices(
            step - 1, len(self.dataset), sizes, cfg.seed, self.accelerator.process_index
        )
        prompts, labels = self.dataset.get(indices), self.dataset.labels(indices)
        # 2.-3. generate, truncate, decode, score (passes run while the reward works); a
        # signal or a reward that finally fails ends the run here, checkpointed
        rollout = self._collect(prompts, labels, pool, stop)
        t1 = time.perf_counter()
        self.state.episode += sizes.batch_size
        valid_rows, all_rows = self._row_counts(rollout.valid)
        if valid_rows == 0:
            # Nothing to learn from: no advantage, no loss, no statistic has a row to be
            # computed over. The step still counts (data, schedule, checkpoints go on).
            logger.warning(
                "update %d skipped: the reward masked all %d rollouts (see the log lines "
                "above for the reasons)",
                step,
                all_rows,
            )
            metrics = skipped_metrics(
                lr=self.lr_scheduler.get_last_lr()[0], episode=self.state.episode
            )
            advantages = None
        else:
            # 4.-5. (running-normalised) transformed scores -> KL-penalised per-token rewards,
            # with the step scores on their tokens in process mode -> GAE advantages; rows
            # the reward masked are left out of all of it
            advantages = ppo.compute_advantages(
                rollout,
                self.advantage_params,
                scores=self._normalized(rollout.raw_scores, rollout.valid, valid_rows < all_rows),
                step_rewards=rollout.step_rewards,
                valid=rollout.valid,
            )
            # 6. clipped PPO updates over shuffled mini-batches
            stats = self._ppo_epochs(rollout, advantages, valid_rows < all_rows)
            # 7. metrics
            metrics = step_metrics(
                self.accelerator,
                rollout,
                advantages,
                stats,
                lr=self.lr_scheduler.get_last_lr()[0],
                episode=self.state.episode,
            )
        metrics["objective/masked_frac"] = (all_rows - valid_rows) / all_rows
        t2 = time.perf_counter()
        self.state.step = step
        # 7. metrics, samples, checkpoint
        start_time, start_episode = self._started
        elapsed = max(time.time() - start_time, 1e-9)
        metrics["eps"] = int((self.state.episode - start_episode) / elapsed)
        metrics["time/rollout_s"] = t1 - t0
        metrics["time/update_s"] = t2 - t1
        self.lr_scheduler.step()
        self.report.log(step, metrics)
        sample_every = (
            max(1, sizes.num_total_batches // cfg.num_sample_generations)
            if cfg.num_sample_generations > 0
            else 0
        )
        if sample_every and (step - 1) % sample_every == 0:
            self.report.write_samples(
                step, rollout, None if advantages is None else advantages.scores
            )
        if step % sizes.save_every(cfg.save_steps) == 0:
            self.save_checkpoint()

    def _row_counts(self, valid: torch.Tensor) -> tuple[int, int]:
        """How many rows the reward scored (not masked), and how many there are, over every
        rank: every rank takes the same branch (skip, normalise) from them."""
        local = torch.tensor([[int(valid.sum()), valid.numel()]], device=self.accelerator.device)
        valid_rows, all_rows = self.accelerator.gather(local).sum(0).tolist()
        return int(valid_rows), int(all_rows)

    def _normalized(
        self, raw_scores: torch.Tensor, valid: torch.Tensor, rows_masked: bool
    ) -> torch.Tensor | None:
        """Running-normalised scores (None when normalisation is off); the window takes
        every rank's scores, so that all ranks whiten alike, except those of masked rows
        (``rows_masked``: some rank has them), which are placeholders."""
        if self.normalizer is None:
            return None
        acc = self.accelerator
        seen = acc.gather(raw_scores)
        if rows_masked:
            seen = seen[acc.gather(valid.long()) > 0]
        scores = self.normalizer(raw_scores, seen)
        self.state.reward_window = self.normalizer.state()
        return scores

    def _collect(
        self, prompts: list[Prompt], labels: list[Any] | None, pool: Executor, stop: StopSignals
    ) -> Rollout:
        """The rollout of one update (each prompt's label sent with its rollouts). If it does
        not finish (a signal, a reward server that stayed away past
        ``reward_retry_timeout``), the weights are still those of the last completed update:
        checkpoint that, with the RNG as it then was, and re-raise."""
        rng = rng_state(self.np_rng)
        try:
            with stop.interruptible():
                return self.rollouts.collect(self.model, prompts, pool, labels)
        except BaseException as exc:
            logger.error("update %d did not complete: %s", self.state.step + 1, exc)
            set_rng_state(rng, self.np_rng)
            self._checkpoint_on_exit()
            raise

    def _checkpoint_on_exit(self) -> None:
        """Checkpoint the last completed update (unless there is none or it is saved), and
        close a reward client of our own so that no retry outlives the run."""
        done = self.state.step
        saved = self.checkpoints.find("latest") if done else None
        if done and (saved is None or saved.name != f"checkpoint-{done}"):
            self.save_checkpoint()
        if self._owns_reward_fn and hasattr(self.reward_fn, "close"):
            self.reward_fn.close()

    def _show_reward_waits(self) -> None:
        """Let the progress bar say when the reward client is waiting for its server."""
        if getattr(self.reward_fn, "on_retry", False) is None:
            self.reward_fn.on_retry = self.report.waiting  # type: ignore[attr-defined]

    def _ppo_epochs(
        self, r: Rollout, a: ppo.Advantages, rows_masked: bool = False
    ) -> ppo.UpdateStats:
        """Clipped PPO updates over shuffled mini-batches; per-micro-batch statistics.

        With masked rows (``rows_masked``: on any rank) a micro-batch may hold none but
        masked rows: its loss is 0, and the others' losses are scaled so that each
        optimiser step is the mean over the micro-batches that have rows; a mini-batch
        with no row anywhere takes no step (:func:`.ppo.micro_batch_scales`).
        """
        cfg, sizes, device = self.config, self.sizes, self.accelerator.device
        shape = (cfg.num_ppo_epochs, cfg.num_mini_batches, cfg.gradient_accumulation_steps)
        stats = ppo.UpdateStats.zeros(shape, device)
        self.model.train()
        size = cfg.per_device_train_batch_size
        # Every epoch's shuffle, drawn in the order the epochs run (the same draws as one
        # per epoch: nothing else uses this generator in between).
        orders = [
            torch.from_numpy(self.np_rng.permutation(sizes.local_batch_size))
            for _ in range(cfg.num_ppo_epochs)
        ]
        scales = self._micro_batch_scales(a, orders) if rows_masked else None
        for epoch, order in enumerate(orders):
            for mb in range(cfg.num_mini_batches):
                scale = 1.0 if scales is None else scales[epoch][mb]
                if scale == 0.0:
                    # Every rank takes this branch: the scales come from all ranks' rows.
                    logger.debug("epoch %d, mini-batch %d: every row masked, no step", epoch, mb)
                    continue
                lo = mb * sizes.local_mini_batch_size
                mini = order[lo : lo + sizes.local_mini_batch_size]
                for ga in range(cfg.gradient_accumulation_steps):
                    idx = mini[ga * size : (ga + 1) * size].to(device)
                    self._micro_step(r, a, idx, stats, (epoch, mb, ga), scale)
        return stats

    def _micro_batch_scales(
        self, a: ppo.Advantages, orders: list[torch.Tensor]
    ) -> list[list[float]]:
        """The loss scale of each (epoch, mini-batch) from every rank's tokens per
        micro-batch in the update."""
        cfg, acc = self.config, self.accelerator
        row_tokens = a.mask.sum(1)  # (B,)
        shape = (cfg.num_mini_batches, cfg.gradient_accumulation_steps, -1)
        local = torch.stack(
            [row_tokens[order.to(row_tokens.device)].reshape(shape).sum(-1) for order in orders]
        )  # (epochs, mini-batches, micro-batches)
        tokens = acc.gather(local).reshape(acc.num_processes, *local.shape)
        scales: list[list[float]] = ppo.micro_batch_scales(tokens).tolist()
        return scales

    def _micro_step(
        self,
        r: Rollout,
        a: ppo.Advantages,
        idx: torch.Tensor,
        stats: ppo.UpdateStats,
        at: tuple[int, int, int],
        scale: float = 1.0,
    ) -> None:
        """One micro-batch: losses and backward (the loss times ``scale``, see
        :meth:`_ppo_epochs`); the optimiser steps on the last of a mini-batch."""
        cfg, acc = self.config, self.accelerator
        with acc.accumulate(self.model):
            logits, vpred = self.model(
                input_ids=r.query_responses[idx],
                attention_mask=r.attention_mask[idx],
                position_ids=r.position_ids[idx],
            )
            logits = logits / cfg.temperature
            new_logprobs = ppo.logprobs_from_logits(logits, r.responses[idx])
            mask = a.mask[idx]
            weights = None
            if cfg.rollout_is_cap is not None and r.engine_logprobs is not None:
                weights = ppo.truncated_is_weights(
                    r.logprobs[idx], r.engine_logprobs[idx], cfg.rollout_is_cap
                )
            pg = ppo.policy_loss(
                new_logprobs, r.logprobs[idx], a.advantages[idx], mask, cfg.cliprange, weights
            )
            vf = ppo.value_loss(vpred, a.values[idx], a.returns[idx], mask, cfg.cliprange_value)
            loss = pg.loss + cfg.vf_coef * vf.loss
            if scale != 1.0:
                loss = loss * scale
            acc.backward(loss)
            if cfg.max_grad_norm is not None and acc.sync_gradients:
                acc.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad()
        with torch.no_grad():
            entropy = ppo.masked_mean_or_zero(ppo.entropy_from_logits(logits.detach()), mask)
            # tokens 0: every row of this micro-batch was masked (zero loss, left out of
            # the statistics)
            stats.record(at, pg, vf, entropy, tokens=mask.sum())

    # ----------------------------------------------------------------------------- saving

    def save_model(self, output_dir: str | os.PathLike[str]) -> None:
        """Save the policy (or its adapter) with the tokenizer, and the value model under
        ``value_model/``."""
        self.checkpoints.save_model(Path(output_dir))

    def save_checkpoint(self) -> Path:
        """Write ``checkpoint-N`` (models, optimiser, scheduler, RNG, progress) atomically."""
        return self.checkpoints.save(self.state)


# ================================================================================= set-up


def _launched_on_cpu() -> bool:
    """Several processes launched (``accelerate launch``/torchrun) on a machine without an
    accelerator: ask accelerate for multi-CPU (gloo) instead of N independent runs."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    accel = getattr(torch, "accelerator", None)
    has_accelerator = accel.is_available() if accel is not None else torch.cuda.is_available()
    return not has_accelerator


def _mixed_precision(config: PPOConfig) -> str | None:
    """``"bf16"`` when the run trains in bf16 (``bf16: auto`` resolved for the device the
    accelerator will pick), else None."""
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if config.bf16 == "auto" and launcher != "no":  # accelerate launch --mixed_precision X
        logger.info("bf16: auto: accelerate launch's --mixed_precision %s applies", launcher)
        return None
    return "bf16" if use_bf16(_training_device(), config.bf16, what="PPO training") else None


def _training_device() -> str:
    """The device type accelerate will train on (it takes the accelerator when there is one)."""
    if _launched_on_cpu():
        return "cpu"
    accel = getattr(torch, "accelerator", None)
    if accel is None:  # torch before 2.6
        return "cuda" if torch.cuda.is_available() else "cpu"
    current = accel.current_accelerator()
    return "cpu" if current is None else str(current.type)


def _make_accelerator(config: PPOConfig) -> Accelerator:
    return Accelerator(
        cpu=_launched_on_cpu(),
        # Explicit: the update loop assumes exactly this many micro-batches per step.
        gradient_accumulation_plugin=GradientAccumulationPlugin(
            num_steps=config.gradient_accumulation_steps, sync_with_dataloader=False
        ),
        # None: accelerate's own setting (``accelerate launch --mixed_precision``) applies.
        mixed_precision=_mixed_precision(config),
        log_with=available_trackers(config.report_to) or None,
        project_dir=config.output_dir,
    )


def _make_optimizer(model: nn.Module, config: PPOConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters; no weight decay on biases and norms."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        [g for g in groups if g["params"]],
        lr=config.learning_rate,
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_epsilon,
    )


def _make_scheduler(optimizer: torch.optim.Optimizer, config: PPOConfig, sizes: BatchSizes) -> Any:
    """The learning-rate schedule, stepped once per update (not per optimiser step), as in TRL;
    not prepared, so that accelerate does not step it once per process."""
    total = sizes.num_total_batches
    warmup = config.warmup_steps or math.ceil(config.warmup_ratio * total)
    return get_scheduler(
        config.lr_scheduler_type,
        optimizer,
        num_warmup_steps=warmup,
        num_training_steps=total,
    )


def _advantage_params(
    config: PPOConfig, stop_token_id: int | None, tokenizer: PreTrainedTokenizerBase
) -> ppo.AdvantageParams:
    """The options of steps 4-5; the missing-EOS check looks for the stop token (else EOS)."""
    return ppo.AdvantageParams(
        reward_baseline=config.reward_baseline,
        reward_scale=config.reward_scale,
        missing_eos_penalty=config.missing_eos_penalty,
        eos_token_id=stop_token_id if stop_token_id is not None else tokenizer.eos_token_id,
        kl_estimator=config.kl_estimator,
        kl_coef=config.kl_coef,
        whiten_rewards=config.whiten_rewards,
        gamma=config.gamma,
        lam=config.lam,
    )


def _log_sizes(config: PPOConfig, sizes: BatchSizes) -> None:
    logger.info(
        "PPO: %d updates of %d rollouts (%d per rank), %d mini-batch(es) of %d per rank, "
        "%d micro-batch(es) of %d",
        sizes.num_total_batches,
        sizes.batch_size,
        sizes.local_batch_size,
        config.num_mini_batches,
        sizes.local_mini_batch_size,
        config.gradient_accumulation_steps,
        config.per_device_train_batch_size,
    )
