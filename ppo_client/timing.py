"""Where one rollout's seconds go (:class:`RolloutClock`), read for its ``time/`` metrics.

The rollout enters a phase around each piece of work that a metric counts; time spent in a
phase nested inside another is the inner phase's only. A reward request handed over while
rows still generate is therefore waiting, not generating, with no subtraction by the
caller; time outside every phase (the policy, reference and value passes) counts nowhere.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Literal, TypeAlias

__all__ = ["Phase", "RolloutClock"]

#: ``generate``: sampling (with the engine's weight sync) and decoding for the reward;
#: ``reward_wait``: this thread blocked on the reward (handing a request over, which is the
#: whole call when the reward is scored inline, and gathering the answers).
Phase: TypeAlias = Literal["generate", "reward_wait"]


class RolloutClock:
    """The timing of one rollout: ``generate_s``, ``reward_wait_s`` and ``reward_tail_s``.

    Phases are entered on the rollout's thread only; :meth:`scored` may be called from
    the reward's worker thread. ``now`` is the clock read (the test seam).
    """

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self._now = now
        self._seconds: dict[Phase, float] = {"generate": 0.0, "reward_wait": 0.0}
        self._open: list[Phase] = []  # the phases entered and not left, innermost last
        self._since = 0.0  # when the innermost phase started or resumed
        self._sampled_at: float | None = None
        self._answered_at: float | None = None
        self._lock = threading.Lock()

    def generating(self) -> contextlib.AbstractContextManager[None]:
        """Count the time inside as ``time/generate_s``."""
        return self._phase("generate")

    def waiting(self) -> contextlib.AbstractContextManager[None]:
        """Count the time inside as ``time/reward_wait_s``."""
        return self._phase("reward_wait")

    @contextlib.contextmanager
    def _phase(self, phase: Phase) -> Iterator[None]:
        self._charge()
        self._open.append(phase)
        try:
            yield
        finally:
            self._charge()
            self._open.pop()

    def _charge(self) -> None:
        """The time since the last change to the phase that was running (if any)."""
        now = self._now()
        if self._open:
            self._seconds[self._open[-1]] += now - self._since
        self._since = now

    def sampled(self) -> None:
        """Sampling has ended (the last call counts: with chunks, the last chunk's end)."""
        self._sampled_at = self._now()

    def scored(self) -> None:
        """A reward request has been answered (any thread)."""
        at = self._now()
        with self._lock:
            if self._answered_at is None or at > self._answered_at:
                self._answered_at = at

    @property
    def generate_s(self) -> float:
        return self._seconds["generate"]

    @property
    def reward_wait_s(self) -> float:
        return self._seconds["reward_wait"]

    @property
    def reward_tail_s(self) -> float:
        """From the end of sampling to the reward's last answer: the reward work left when
        generation ended, whether the passes then hid it or not (0 when every answer came
        before; read it once every request is answered)."""
        if self._sampled_at is None or self._answered_at is None:
            return 0.0
        return max(0.0, self._answered_at - self._sampled_at)
