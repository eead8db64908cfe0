"""PPO step time: reward behind the server vs in process, overlapped vs not.

The same tiny policy, MiniLM reward model, prompts and seed in every variant, so every
variant samples the same responses and gets the same scores (checked: ``score_gap``):

- ``remote``: the trainer's reward is a :class:`~reward_client.RewardClient` talking to
  ``reward-server`` in another process;
- ``inprocess``: the same reward model loaded in the trainer's process
  (:class:`reward_server.engines.transformers.RewardModel`, the code the server runs, minus HTTP);
- ``overlapped`` (``overlap_reward=True``, the trainer's default for the HTTP client): the
  reward request of a chunk runs on a worker thread while the policy/reference/value passes
  of that chunk, and the generation of the next chunk, run;
- ``serial`` (``overlap_reward=False``, the default for any other reward function): the
  reward is computed before those passes.

A step's time is the trainer's own ``time/rollout_s + time/update_s``; the first
``warmup_steps`` of each run are dropped.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import model_server_env, summary
from reward_server.launcher import running_server

logger = logging.getLogger(__name__)

VARIANTS = (
    ("remote", True),
    ("inprocess", True),
    ("remote", False),
    ("inprocess", False),
)


@dataclass
class PPOBenchConfig:
    """Sizes of the PPO step benchmark."""

    reward_model_path: str
    policy_path: str
    n_prompts: int = 64
    per_device_train_batch_size: int = 8
    num_mini_batches: int = 2
    rollout_chunk: int = 8
    response_length: int = 32
    num_ppo_epochs: int = 2
    warmup_steps: int = 1
    steps: int = 4
    rounds: int = 2
    seed: int = 0
    torch_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    server_args: tuple[str, ...] = ()


class InProcessReward:
    """The reward model called in the trainer's process: render, tokenize, one forward."""

    def __init__(self, model_path: str) -> None:
        from reward_server.engines.transformers import RewardModel

        self.rm = RewardModel.load(model_path, dtype="float32", device="cpu")

    def __call__(self, prompts: Sequence[Any], responses: Sequence[str]) -> list[float]:
        texts = self.rm.render_pairs(list(prompts), list(responses))
        encoded = self.rm.encode(texts, truncate=True)
        return self.rm.score_batch([e.input_ids for e in encoded])


def _train_once(
    cfg: PPOBenchConfig,
    reward_fn: Any,
    overlapped: bool,
    prompts: list[str],
    out_dir: Path,
    *,
    steps: int | None = None,
    warmup_steps: int | None = None,
) -> list[dict[str, Any]]:
    """One short PPO run; returns the trainer's per-step metrics."""
    from ppo_client.config import PPOConfig
    from ppo_client.trainer import PPOTrainer

    batch = cfg.per_device_train_batch_size * cfg.num_mini_batches
    steps = cfg.steps if steps is None else steps
    warmup_steps = cfg.warmup_steps if warmup_steps is None else warmup_steps
    config = PPOConfig(
        model_name_or_path=cfg.policy_path,
        output_dir=str(out_dir),
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=1,
        num_mini_batches=cfg.num_mini_batches,
        local_rollout_forward_batch_size=cfg.rollout_chunk,
        num_ppo_epochs=cfg.num_ppo_epochs,
        total_episodes=batch * (warmup_steps + steps),
        response_length=cfg.response_length,
        temperature=1.0,
        learning_rate=1e-4,
        seed=cfg.seed,
        save_steps=10_000,
        logging_steps=10_000,
        num_sample_generations=0,
        disable_tqdm=True,
        overlap_reward=overlapped,
    )
    trainer = PPOTrainer(
        config, train_dataset=[{"prompt": p} for p in prompts], reward_fn=reward_fn
    )
    return trainer.train()


def run_ppo_bench(cfg: PPOBenchConfig) -> dict[str, Any]:
    """Step times of the four variants; ratios remote/in-process and overlapped/serial."""
    import torch

    from bench.models import make_prompts
    from ppo_client.trainer import default_overlap
    from reward_client import RewardClient

    torch.set_num_threads(cfg.torch_threads)
    prompts = make_prompts(cfg.n_prompts, seed=cfg.seed)
    server_env = model_server_env(cfg.torch_threads)
    steps: dict[str, list[float]] = {}
    waits: dict[str, list[float]] = {}
    scores: dict[str, list[list[float]]] = {}
    with (
        running_server(cfg.reward_model_path, *cfg.server_args, env=server_env, timeout=180) as s,
        RewardClient(s.url) as client,
        tempfile.TemporaryDirectory(prefix="ppo-bench-") as tmp,
    ):
        local = InProcessReward(cfg.reward_model_path)
        rewards = {"remote": client, "inprocess": local}
        # Warm both reward paths and one trainer (allocator, kernels, connections): untimed.
        for fn in rewards.values():
            fn(prompts[:8], prompts[8:16])
        _train_once(cfg, local, True, prompts, Path(tmp) / "warmup", steps=1, warmup_steps=0)
        for rnd in range(cfg.rounds):
            for where, overlapped in VARIANTS:
                name = f"{where}/{'overlapped' if overlapped else 'serial'}"
                history = _train_once(
                    cfg,
                    rewards[where],
                    overlapped,
                    prompts,
                    Path(tmp) / f"{where}-{overlapped}-{rnd}",
                )
                kept = history[cfg.warmup_steps :]
                times = [h["time/rollout_s"] + h["time/update_s"] for h in kept]
                steps.setdefault(name, []).extend(times)
                waits.setdefault(name, []).extend(h["time/reward_wait_s"] for h in kept)
                scores.setdefault(name, []).append([h["objective/raw_scores"] for h in history])
                logger.info(
                    "PPO round %d %s: step %.3fs (median of %d)",
                    rnd + 1,
                    name,
                    summary(times)["median"],
                    len(times),
                )

    defaults = {
        where: f"{where}/{'overlapped' if default_overlap(fn, torch.device('cpu')) else 'serial'}"
        for where, fn in (("remote", client), ("inprocess", local))
    }

    def ratio(a: str, b: str) -> dict[str, float]:
        return summary(x / y for x, y in zip(steps[a], steps[b], strict=False) if y > 0)

    runs_scores = [run for runs in scores.values() for run in runs]
    gap = max(
        (abs(x - y) for run in runs_scores for x, y in zip(run, runs_scores[0], strict=False)),
        default=0.0,
    )
    results = {
        "config": {
            k: v for k, v in asdict(cfg).items() if k not in ("reward_model_path", "policy_path")
        },
        "step_s": {name: summary(v) for name, v in steps.items()},
        "reward_wait_s": {name: summary(v) for name, v in waits.items()},
        # What the trainer picks when not told (ppo_client.trainer.default_overlap): serial
        # in process; for the client, serial too here (trainer on CPU, server on 127.0.0.1).
        "defaults": defaults,
        "ratios": {
            "remote/inprocess (defaults)": ratio(defaults["remote"], defaults["inprocess"]),
            "remote/inprocess (overlapped)": ratio("remote/overlapped", "inprocess/overlapped"),
            "remote/inprocess (serial)": ratio("remote/serial", "inprocess/serial"),
            "overlapped/serial (remote)": ratio("remote/overlapped", "remote/serial"),
            "overlapped/serial (inprocess)": ratio("inprocess/overlapped", "inprocess/serial"),
        },
        # Same seed and models: every variant must see the same mean raw score per step.
        "score_gap": gap,
    }
    value = results["ratios"]["remote/inprocess (defaults)"]
    results["targets"] = [
        {
            "name": "PPO step remote / in-process",
            "value": value,
            "op": "<=",
            "threshold": 1.10,
            "holds": bool(value["median"] <= 1.10),
        }
    ]
    return results
