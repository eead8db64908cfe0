"""Stopping a run without losing an update: SIGTERM and Ctrl-C.

A checkpoint must hold a *completed* update. While an update's rollout runs (generation,
reference passes, the reward call, which may wait minutes for a restarting server) the
weights are still those of the last completed update, so a signal stops the run at once. Once
the PPO epochs have begun, the weights are half-updated: the signal is noted and the run
stops when that update ends. A second Ctrl-C stops at once, whatever the phase.

Before the run (loading models, reading data) there is nothing to save: ``ppo-client train``
installs :func:`stop_at_once` first thing, so a signal then raises :class:`TrainingStopped`
where the process is. The signal is also remembered, so that a library which swallows the
exception cannot let the run start anyway: the run's :class:`StopSignals` sees it on entry.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import types
from collections.abc import Iterator
from typing import Any

__all__ = ["StopSignals", "TrainingStopped", "stop_at_once"]

logger = logging.getLogger(__name__)

_SIGNALS = (signal.SIGTERM, signal.SIGINT)

#: The first signal that came before a run's StopSignals took over (see stop_at_once).
_received_early: int | None = None


class TrainingStopped(BaseException):
    """The run was stopped by a signal; ``exit_code`` is the shell's 128 + signal number.

    A BaseException, like KeyboardInterrupt: it is raised wherever the signal lands, and code
    that catches ``Exception`` (a retry loop, a library's import fallback) must let it pass.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _raise_at_once(signum: int, _frame: types.FrameType | None) -> None:
    global _received_early
    if _received_early is None:
        _received_early = signum
    raise TrainingStopped(signum)


@contextlib.contextmanager
def stop_at_once() -> Iterator[None]:
    """Within the block SIGINT and SIGTERM raise TrainingStopped wherever they land (from the
    main thread only; elsewhere a plain block). For a whole run, start-up included; the
    run's :class:`StopSignals` takes over inside it. The previous handlers come back after."""
    global _received_early
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _received_early = None
    previous = {sig: signal.signal(sig, _raise_at_once) for sig in _SIGNALS}
    try:
        # A launcher may start this process with the signals blocked, so that none is lost
        # while the interpreter starts (reward_server.launcher.held_for_children): one that
        # came meanwhile is delivered here, to the handler just installed.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _received_early = None


def stop_in_chain(exc: BaseException) -> TrainingStopped | KeyboardInterrupt | None:
    """The stop (TrainingStopped or KeyboardInterrupt) that ``exc`` was raised from or
    during, if any: its ``__cause__``/``__context__`` chain, followed to the end."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, TrainingStopped | KeyboardInterrupt):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


class StopSignals:
    """SIGTERM/SIGINT handlers for the duration of a run (installed from the main thread only).

    ``immediate``: whether a signal may end the rollout phase at once. Under several processes
    it should not: the ranks must stop at the same update (see :meth:`requested_by_any`).
    """

    def __init__(self, *, immediate: bool = True) -> None:
        self.immediate = immediate
        self.requested: int | None = None
        self._interruptible = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        if self.requested is None:
            # A signal during start-up whose TrainingStopped something swallowed.
            self.requested = _received_early
        return self

    def __exit__(self, *exc_info: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, _frame: types.FrameType | None) -> None:
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: now, mid-update or not
        self.requested = signum
        if self._interruptible:
            raise TrainingStopped(signum)
        logger.warning(
            "%s: stopping when the current update ends (Ctrl-C again to stop at once)",
            signal.Signals(signum).name,
        )

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """A phase that a signal may end at once (raising TrainingStopped)."""
        if self.requested is not None and self.immediate:
            raise TrainingStopped(self.requested)
        self._interruptible = self.immediate
        try:
            yield
        finally:
            self._interruptible = False

    def requested_by_any(self, accelerator: Any) -> int | None:
        """The signal asked for on this rank or any other (every rank must call it)."""
        if accelerator.num_processes == 1:
            return self.requested
        import torch

        mine = torch.tensor([float(self.requested or 0)], device=accelerator.device)
        signum = int(accelerator.reduce(mine, reduction="max").item())
        return signum or None
