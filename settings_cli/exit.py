"""How ``reward-server`` and ``ppo-client`` end their process: :func:`exit_now`."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import threading
from typing import NoReturn

__all__ = ["exit_now"]


def exit_now(code: int) -> NoReturn:
    """End the process with ``code`` now that its work is done, its outcome printed and saved.

    The interpreter's own exit could hold a finished process for a long time after its last
    line, for nothing: it joins every non-daemon thread (a trainer's may still be inside a
    reward request, up to ``reward_timeout`` against a hanging server), then tears every
    module down, garbage-collecting several times over the millions of objects that torch and
    transformers make (about 1 s of CPU for a tiny model's server, 2 s beside vLLM, tens of
    seconds for a trainer on a loaded machine), a trainer's torch.distributed group among
    them, whose teardown can wait forever on a rank that has already exited (see
    ``ppo_client.cli._last_trainer``). Exit handlers still run (they flush logs and
    trackers and remove temporary folders), then the process ends without the joins and the
    teardown: every file the command writes is closed by then.
    """
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):  # too late to stop anything: ignore
            signal.signal(sig, signal.SIG_IGN)
    logging.shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)
