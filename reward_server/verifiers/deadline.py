"""A request's deadline inside a verifier: the items still running when it comes end with
the reason ``deadline`` (their work cancelled), the ones done keep their verdicts."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Sequence
from typing import Any

from reward_server.verifiers.items import Verdict

__all__ = ["past", "remaining", "settle_by"]


def remaining(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (a ``time.monotonic()`` instant; None: no deadline),
    never below 0."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def past(deadline: float | None) -> bool:
    """Whether ``deadline`` has come."""
    return deadline is not None and time.monotonic() >= deadline


async def settle_by(
    work: Sequence[Coroutine[Any, Any, Verdict]], deadline: float | None, fill: float
) -> list[Verdict]:
    """Each item's verdict, the items running at once; at ``deadline`` the unfinished ones
    are cancelled and get ``Verdict(fill, {}, "deadline")``. Past it already, nothing runs."""
    if deadline is None:
        return list(await asyncio.gather(*work))
    if past(deadline):
        for coroutine in work:
            coroutine.close()  # never started: no "never awaited" warning
        return [Verdict(fill, {}, "deadline") for _ in work]
    tasks = [asyncio.ensure_future(coroutine) for coroutine in work]
    try:
        await asyncio.wait(tasks, timeout=remaining(deadline))
    finally:
        late = [task for task in tasks if not task.done()]
        for task in late:
            task.cancel()
        await asyncio.gather(*late, return_exceptions=True)
    return [
        task.result() if not task.cancelled() else Verdict(fill, {}, "deadline") for task in tasks
    ]
