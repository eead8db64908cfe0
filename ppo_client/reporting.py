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
from ppo_client.streaming import NO_REASON

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
    "skipped_metrics",
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
    """TRL's metric names, averaged over ranks (counts summed, wait times maxed).

    Rows the reward masked (``a.valid`` false) are in no statistic: the per-row means are
    over the other rows, the losses' over the micro-batches that had any (a micro-batch
    of masked rows only has none), and a rank whose rows were all masked is left out of
    the average over ranks. Without masked rows every figure is the plain mean it was.
    """
    mask, valid = a.mask, a.valid
    all_valid = bool(valid.all())

    def rows(per_row: torch.Tensor) -> torch.Tensor:
        """Mean of per-row values (B,) over the rows in the update (NaN if none)."""
        return per_row.mean() if all_valid else per_row[valid].mean()

    non_score = rows(a.non_score_reward.sum(1))
    truncated_frac = float("nan")
    if r.truncated is not None:
        kept = [t for t, ok in zip(r.truncated, valid.tolist(), strict=True) if ok]
        truncated_frac = sum(kept) / max(len(kept), 1)
    means = {
        "objective/kl": rows(a.kl.sum(1)),
        "objective/entropy": rows((-r.logprobs * mask).sum(1)),
        "objective/non_score_reward": non_score,
        "objective/rlhf_reward": non_score + rows(a.scores),
        "objective/scores": rows(a.scores),
        "objective/raw_scores": rows(r.raw_scores),
        "policy/approxkl_avg": stats.mean(stats.approxkl),
        "policy/clipfrac_avg": stats.mean(stats.pg_clipfrac),
        "loss/policy_avg": stats.mean(stats.pg_loss),
        "loss/value_avg": stats.mean(stats.vf_loss),
        "val/clipfrac_avg": stats.mean(stats.vf_clipfrac),
        "policy/entropy_avg": stats.mean(stats.entropy),
        "val/ratio": stats.mean(stats.ratio),
        "val/response_length": rows((r.seq_lengths + 1).float()),
        "reward/truncated_frac": torch.tensor(truncated_frac),
    }
    local = torch.stack([v.float().to(acc.device) for v in means.values()])
    extras = torch.tensor(
        [
            float((a.has_eos & valid).sum()),
            r.reward_wait_s,
            r.generate_s,
            r.reward_tail_s,
            float(valid.sum()),
        ],
        device=acc.device,
        dtype=torch.float32,
    )
    gathered = acc.gather(torch.cat([local, extras]).unsqueeze(0))  # (world, K + 5)
    k = len(means)
    ranks_in = gathered[:, k + 4] > 0  # ranks with rows in the update
    per_rank = gathered[:, :k] if bool(ranks_in.all()) else gathered[ranks_in, :k]
    avg = per_rank.mean(0).tolist()
    metrics: dict[str, Any] = dict(zip(means, avg, strict=True))
    metrics["val/ratio_var"] = _ratio_var(acc, stats)
    metrics["val/num_eos_tokens"] = int(gathered[:, k].sum().item())
    metrics["time/reward_wait_s"] = float(gathered[:, k + 1].max().item())
    metrics["time/generate_s"] = float(gathered[:, k + 2].max().item())
    metrics["time/reward_tail_s"] = float(gathered[:, k + 3].max().item())
    metrics["lr"] = lr
    metrics["episode"] = episode
    if r.truncated is None:
        del metrics["reward/truncated_frac"]
    if r.engine_logprobs is not None:
        metrics.update(logprob_gap(acc, r, mask))
    if r.step_scores is not None:
        metrics.update(_step_metrics(acc, r.step_scores, valid.tolist()))
    return metrics


def _ratio_var(acc: Accelerator, stats: UpdateStats) -> float:
    """Variance of the micro-batches' mean ratios over every rank, of those that took part
    in the update (0.0 when fewer than 2 did: no spread to measure)."""
    ratios = acc.gather(stats.ratio.flatten())
    counted = acc.gather(stats.tokens.flatten()) > 0
    if bool(counted.all()):
        return float(ratios.var().item())
    if int(counted.sum()) < 2:
        return 0.0
    return float(ratios[counted].var().item())


def skipped_metrics(*, lr: float, episode: int) -> dict[str, Any]:
    """The metrics of an update that did not happen because the reward masked every row:
    only the schedule's (no statistic has a row to be computed over, and none is logged
    as NaN)."""
    return {"lr": lr, "episode": episode}


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


def _step_metrics(
    acc: Accelerator, step_scores: list[list[float]], valid: list[bool]
) -> dict[str, float]:
    """reward_mode process: the mean step score over every step of every response (all
    ranks) and the mean number of steps per response, over the rows not masked."""
    kept = [row for row, ok in zip(step_scores, valid, strict=True) if ok]
    total = float(sum(s for row in kept for s in row))
    steps = sum(len(row) for row in kept)
    local = torch.tensor([[total, steps, len(kept)]], device=acc.device)
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
    # An update skipped because the reward masked every row has no score and no KL.
    history = [row for row in history if "objective/scores" in row]
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
            updated = "objective/scores" in metrics  # else skipped: every row masked
            if updated:
                self._progress.set_postfix(
                    score=f"{metrics['objective/scores']:.3f}",
                    kl=f"{metrics['objective/kl']:.3f}",
                )
            if self._waiting:  # the reward answered: back to the plain description
                self._progress.set_description_str("PPO")
                self._waiting = False
            self._progress.update(1)
            every = self.config.logging_steps
            if updated and every > 0 and step % every == 0:
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

    def write_samples(self, step: int, r: Rollout, scores: torch.Tensor | None) -> None:
        """A few of this update's rollouts (rank 0) with their raw and transformed scores
        (``scores`` None: an update skipped because every row was masked); a row the
        reward masked has null scores and its reason under ``masked``."""
        if not self.accelerator.is_main_process:
            return
        n = min(self.config.num_samples_to_log, len(r.prompts))
        with (self.output_dir / SAMPLES_FILE).open("a", encoding="utf-8") as f:
            for i in range(n):
                valid = bool(r.valid[i])
                row = {
                    "step": step,
                    "prompt": r.prompts[i],
                    "query": r.texts.prompts[i],
                    "response": r.texts.responses[i],
                    "score": float(r.raw_scores[i]) if valid else None,
                    "reward": float(scores[i]) if valid and scores is not None else None,
                }
                if not valid:
                    row["masked"] = (r.masked[i] if r.masked is not None else None) or NO_REASON
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
