"""What a run reports: each update's metrics (TRL's names) to metrics.jsonl, trackers, the
progress bar and the log; sample rollouts to samples.jsonl; the reward curve (matplotlib,
optional) at the end."""

from __future__ import annotations

import importlib.util
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ppo_client.config import ConfigError, PPOConfig

if TYPE_CHECKING:
    from accelerate import Accelerator

    from ppo_client.ppo import Advantages, UpdateStats
    from ppo_client.rollout import Rollout
    from reward_client import RetryEvent

__all__ = [
    "METRICS_FILE",
    "PLOT_FILE",
    "SAMPLES_FILE",
    "RunReport",
    "available_trackers",
    "plot_reward_curve",
    "step_metrics",
    "tracker_config",
]

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
PLOT_FILE = "reward_curve.png"

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


# ================================================================================= trackers


def available_trackers(report_to: str | Sequence[str]) -> list[str]:
    """The requested trackers that are installed (others are skipped with a warning)."""
    wanted = [report_to] if isinstance(report_to, str) else list(report_to)
    wanted = [w.strip() for w in wanted if w and w.strip().lower() != "none"]
    quiet = "all" in wanted
    if quiet:
        wanted = list(_TRACKER_MODULES)
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


def tracker_config(options: dict[str, Any]) -> dict[str, Any]:
    """The run's options flattened to values trackers accept."""
    out: dict[str, Any] = {}
    for k, v in options.items():
        out[k] = v if isinstance(v, (int, float, str, bool)) or v is None else str(v)
    return {k: ("" if v is None else v) for k, v in out.items()}


# ================================================================================= metrics


@torch.no_grad()
def step_metrics(
    acc: Accelerator,
    r: Rollout,
    a: Advantages,
    stats: UpdateStats,
    *,
    lr: float,
    episode: int,
) -> dict[str, Any]:
    """TRL's metric names, averaged over ranks (counts summed, wait times maxed)."""
    mask = a.mask
    non_score = a.non_score_reward.sum(1).mean()
    truncated_frac = (
        sum(r.truncated) / max(len(r.truncated), 1) if r.truncated is not None else float("nan")
    )
    means = {
        "objective/kl": a.kl.sum(1).mean(),
        "objective/entropy": (-r.logprobs * mask).sum(1).mean(),
        "objective/non_score_reward": non_score,
        "objective/rlhf_reward": non_score + a.scores.mean(),
        "objective/scores": a.scores.mean(),
        "objective/raw_scores": r.raw_scores.mean(),
        "policy/approxkl_avg": stats.approxkl.mean(),
        "policy/clipfrac_avg": stats.pg_clipfrac.mean(),
        "loss/policy_avg": stats.pg_loss.mean(),
        "loss/value_avg": stats.vf_loss.mean(),
        "val/clipfrac_avg": stats.vf_clipfrac.mean(),
        "policy/entropy_avg": stats.entropy.mean(),
        "val/ratio": stats.ratio.mean(),
        "val/response_length": (r.seq_lengths + 1).float().mean(),
        "reward/truncated_frac": torch.tensor(truncated_frac),
    }
    local = torch.stack([v.float().to(acc.device) for v in means.values()])
    extras = torch.tensor(
        [float(a.has_eos.sum()), r.reward_wait_s, r.generate_s, r.reward_tail_s],
        device=acc.device,
        dtype=torch.float32,
    )
    gathered = acc.gather(torch.cat([local, extras]).unsqueeze(0))  # (world, K + 4)
    avg = gathered[:, : len(means)].mean(0).tolist()
    metrics: dict[str, Any] = dict(zip(means, avg, strict=True))
    metrics["val/ratio_var"] = acc.gather(stats.ratio.flatten()).var().item()
    metrics["val/num_eos_tokens"] = int(gathered[:, len(means)].sum().item())
    metrics["time/reward_wait_s"] = float(gathered[:, len(means) + 1].max().item())
    metrics["time/generate_s"] = float(gathered[:, len(means) + 2].max().item())
    metrics["time/reward_tail_s"] = float(gathered[:, len(means) + 3].max().item())
    metrics["lr"] = lr
    metrics["episode"] = episode
    if r.truncated is None:
        del metrics["reward/truncated_frac"]
    if r.engine_logprobs is not None:
        metrics.update(logprob_gap(acc, r, mask))
    if r.step_scores is not None:
        metrics.update(_step_metrics(acc, r.step_scores))
    return metrics


def logprob_gap(acc: Accelerator, r: Rollout, mask: torch.Tensor) -> dict[str, float]:
    """rollout_engine vllm: how far the engine's log-prob of each sampled token is from the
    trainer's own (``|trainer - engine|`` over the response tokens of every rank): mean
    and max."""
    assert r.engine_logprobs is not None
    gap = (r.logprobs - r.engine_logprobs).abs() * mask
    local = torch.stack([gap.sum(), mask.sum(), gap.max()]).float().unsqueeze(0)
    total, count, _ = acc.gather(local.to(acc.device)).sum(0).tolist()
    top = acc.gather(local.to(acc.device))[:, 2].max().item()
    return {
        "rollout/logprob_gap_mean": total / count if count else float("nan"),
        "rollout/logprob_gap_max": float(top),
    }


def _step_metrics(acc: Accelerator, step_scores: list[list[float]]) -> dict[str, float]:
    """reward_mode process: the mean step score over every step of every response (all
    ranks) and the mean number of steps per response."""
    total = float(sum(s for row in step_scores for s in row))
    steps = sum(len(row) for row in step_scores)
    local = torch.tensor([[total, steps, len(step_scores)]], device=acc.device)
    total, steps, responses = acc.gather(local).sum(0).tolist()
    return {
        "objective/step_scores_mean": total / steps if steps else float("nan"),
        "objective/steps_per_response": steps / responses if responses else float("nan"),
    }


# ================================================================================= files


def plot_reward_curve(history: list[dict[str, Any]], path: Path) -> bool:
    """Score and KL against step, to ``path``; False (and a log line) without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        logger.warning("matplotlib is not installed: %s not written", path.name)
        return False
    steps = [row["step"] for row in history]
    fig = Figure(figsize=(9, 3.5), tight_layout=True)
    FigureCanvasAgg(fig)
    for i, (key, label) in enumerate(
        (("objective/scores", "score"), ("objective/kl", "KL(policy || ref)"))
    ):
        ax = fig.add_subplot(1, 2, i + 1)
        ax.plot(steps, [row[key] for row in history], marker="." if len(steps) < 50 else "")
        ax.set_xlabel("step")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    fig.savefig(path, dpi=100)
    return True


class RunReport:
    """The files, trackers, progress bar and log lines of one run (files on rank 0 only)."""

    def __init__(
        self, config: PPOConfig, accelerator: Accelerator, output_dir: Path, total_steps: int
    ) -> None:
        self.config = config
        self.accelerator = accelerator
        self.output_dir = output_dir
        self.total_steps = total_steps
        self.history: list[dict[str, Any]] = []
        self._progress: Any = None
        self._waiting = False

    def start(self, step: int, options: dict[str, Any]) -> None:
        """Open the logs at ``step`` (0: fresh; else resumed), the trackers and the progress bar."""
        cfg, acc = self.config, self.accelerator
        if acc.is_main_process:
            self._prepare_logs(step)
        if acc.log_with:
            acc.init_trackers(cfg.run_name or "ppo_client", config=tracker_config(options))
        from tqdm import tqdm

        self._progress = tqdm(
            total=self.total_steps,
            initial=step,
            desc="PPO",
            unit="step",
            disable=cfg.disable_tqdm or not acc.is_main_process,
            dynamic_ncols=True,
        )

    def _prepare_logs(self, step: int) -> None:
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
                if row.get("step", 0) <= step:
                    kept.append(line)
                    if name == METRICS_FILE:
                        self.history.append(row)
            if step == 0:
                kept, self.history = [], []  # a fresh run starts fresh logs
            path.write_text("".join(k + "\n" for k in kept), encoding="utf-8")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """metrics.jsonl, trackers, progress bar and (every logging_steps) a log line."""
        acc = self.accelerator
        row = {"step": step, **metrics}
        self.history.append(row)
        if acc.is_main_process:
            with (self.output_dir / METRICS_FILE).open("a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            self._progress.set_postfix(
                score=f"{metrics['objective/scores']:.3f}", kl=f"{metrics['objective/kl']:.3f}"
            )
            if self._waiting:  # the reward answered: back to the plain description
                self._progress.set_description_str("PPO")
                self._waiting = False
            self._progress.update(1)
            every = self.config.logging_steps
            if every > 0 and step % every == 0:
                logger.info(
                    "step %d/%s: score %.4f kl %.4f loss/policy %.4f loss/value %.4f",
                    step,
                    self.total_steps,
                    metrics["objective/scores"],
                    metrics["objective/kl"],
                    metrics["loss/policy_avg"],
                    metrics["loss/value_avg"],
                )
        if acc.log_with:
            acc.log(metrics, step=step)

    def write_samples(self, step: int, r: Rollout, scores: torch.Tensor) -> None:
        """A few of this update's rollouts (rank 0) with their raw and transformed scores."""
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
                    "reward": float(scores[i]),
                }
                if r.texts.labels is not None:  # label_column: what the reward compared with
                    row["label"] = r.texts.labels[i]
                if r.step_scores is not None and r.step_tokens is not None:
                    # Where each step's score went: the policy tokens, up to the stop token.
                    row["response_ids"] = r.responses[i, : int(r.seq_lengths[i]) + 1].tolist()
                    row["step_scores"] = r.step_scores[i]
                    row["step_tokens"] = r.step_tokens[i]
                f.write(json.dumps(row, ensure_ascii=False) + "\n")

    def waiting(self, event: RetryEvent) -> None:
        """Show on the progress bar that the reward server is being waited for (the reward
        client's ``on_retry`` hook; called from the reward's thread)."""
        if self._progress is not None:
            self._progress.set_description_str(
                f"PPO (waiting for the reward server: {event.waited_s:.0f} s of "
                f"{event.budget_s:.0f} s)"
            )
            self._waiting = True

    def close(self) -> None:
        """Close the progress bar."""
        if self._progress is not None:
            self._progress.close()

    def finish(self) -> None:
        """The reward curve (rank 0), then the trackers' end."""
        if self.accelerator.is_main_process:
            plot_reward_curve(self.history, self.output_dir / PLOT_FILE)
        self.accelerator.end_training()
