"""Running reward normalisation (``PPOConfig.reward_normalization: running``).

Scores of different reward models (or one model drifting during training) live on
different scales. OpenRLHF's ``normalize_reward`` whitens each reward, ``(r - mean) / std``,
with statistics of the reward model's scores; here the statistics are those of the last
``window`` scores the run has seen (this update's included, from every rank), so they
follow the policy as it changes. With one score in the window there is no spread to
measure: the score is only centred (divided by 1).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

import torch

__all__ = ["RunningNormalizer"]


class RunningNormalizer:
    """Whitens scores with the mean and (Bessel-corrected) standard deviation of the last
    ``window`` scores seen; ``eps`` is the smallest standard deviation divided by."""

    def __init__(self, window: int, eps: float = 1e-8) -> None:
        if window < 2:
            raise ValueError(f"the normalisation window must hold at least 2 scores, got {window}")
        self.window = window
        self.eps = eps
        self._seen: deque[float] = deque(maxlen=window)

    def __len__(self) -> int:
        return len(self._seen)

    def update(self, scores: Iterable[float]) -> None:
        """Add scores to the window (the oldest beyond ``window`` drop out)."""
        for score in scores:
            value = float(score)
            if not math.isfinite(value):
                raise ValueError(f"cannot normalise a non-finite score: {value}")
            self._seen.append(value)

    def stats(self) -> tuple[float, float]:
        """Mean and standard deviation of the window (0 and 1 while it is empty)."""
        n = len(self._seen)
        if n == 0:
            return 0.0, 1.0
        mean = math.fsum(self._seen) / n
        if n == 1:
            return mean, 1.0
        var = math.fsum((x - mean) ** 2 for x in self._seen) / (n - 1)
        return mean, max(math.sqrt(var), self.eps)

    def __call__(self, scores: torch.Tensor, seen: torch.Tensor | None = None) -> torch.Tensor:
        """Add ``seen`` (default: ``scores``; pass every rank's scores so that all ranks keep
        the same window) to the window, then return ``(scores - mean) / std``."""
        self.update((scores if seen is None else seen).detach().flatten().tolist())
        mean, std = self.stats()
        return (scores - mean) / std

    def state(self) -> list[float]:
        """The window's scores, oldest first (what a checkpoint keeps)."""
        return list(self._seen)

    def load(self, scores: Iterable[float]) -> None:
        """Replace the window by saved scores."""
        self._seen.clear()
        self.update(scores)
