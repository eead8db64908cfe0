"""What every scoring route shares: the app's registry as a dependency, and one call into
the scoring pipeline that stops when the client hangs up, gives the request its deadline
and counts the items by endpoint.

A client that disconnects mid-request cancels the pipeline's work: its rows still queued are
dropped, so a trainer that gave up does not keep the model busy.

A request's deadline is the time budget its client has left, sent as the header
:data:`TIMEOUT_HEADER` (milliseconds, the way RPC frameworks pass a remaining budget) or, on
``/score``, as the body's ``timeout_ms``; without one, ``--request-timeout-s``; never more
than ``--max-request-timeout-s``. It counts from when the route starts the request's work.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Awaitable
from typing import Annotated, TypeVar

from fastapi import Depends, Request

from reward_server.errors import BadDeadlineError, ClientDisconnectedError
from reward_server.http.metrics import HttpMetrics
from reward_server.scoring.code_runs import CodeRun, CodeRunResult
from reward_server.scoring.items import Items
from reward_server.scoring.pipeline import ScoreOptions, ScoringPipeline
from reward_server.scoring.registry import ModelRegistry
from reward_server.scoring.scored import Scored

__all__ = [
    "TIMEOUT_HEADER",
    "RegistryDep",
    "deadline",
    "get_pipeline",
    "get_registry",
    "run_code",
    "score",
]

logger = logging.getLogger("reward_server")

T = TypeVar("T")

#: The request header carrying the client's remaining time budget, in milliseconds.
TIMEOUT_HEADER = "X-Request-Timeout-Ms"


def get_registry(request: Request) -> ModelRegistry:
    """The app's served models."""
    return request.app.state.registry  # type: ignore[no-any-return]


def get_pipeline(request: Request) -> ScoringPipeline:
    """The app's scoring pipeline."""
    return request.app.state.pipeline  # type: ignore[no-any-return]


RegistryDep = Annotated[ModelRegistry, Depends(get_registry)]


def deadline(request: Request, timeout_ms: float | None = None) -> float:
    """The request's deadline, a ``time.monotonic()`` instant: ``timeout_ms`` (a body's), else
    the :data:`TIMEOUT_HEADER` header, else the server's default; at most its maximum.
    BadDeadlineError (422) for a header that is not a positive number."""
    settings = get_registry(request).settings
    if timeout_ms is None:
        raw = request.headers.get(TIMEOUT_HEADER)
        if raw is not None:
            try:
                timeout_ms = float(raw.strip())
            except ValueError:
                raise BadDeadlineError(
                    f"{TIMEOUT_HEADER}: {raw[:40]!r} is not a number of milliseconds"
                ) from None
            if not (math.isfinite(timeout_ms) and timeout_ms > 0):
                raise BadDeadlineError(
                    f"{TIMEOUT_HEADER}: {raw[:40]!r} is not a positive number of milliseconds"
                )
    seconds = settings.request_timeout_s if timeout_ms is None else timeout_ms / 1000.0
    return time.monotonic() + min(seconds, settings.max_request_timeout_s)


async def score(
    request: Request,
    endpoint: str,
    items: Items,
    options: ScoreOptions = ScoreOptions(),
    timeout_ms: float | None = None,
) -> Scored:
    """Score ``items`` through the app's pipeline by the request's :func:`deadline`
    (``timeout_ms``: the body's), cancelled if the client hangs up; the items count under
    ``endpoint``."""
    options = dataclasses.replace(options, deadline=deadline(request, timeout_ms))
    work = get_pipeline(request).score(items, options)
    scored = await cancel_on_disconnect(request, endpoint, work)
    metrics: HttpMetrics = request.app.state.http_metrics
    metrics.items.labels(endpoint=endpoint).inc(len(scored.scores))
    return scored


async def run_code(request: Request, run: CodeRun) -> CodeRunResult:
    """Run one program in the code verifier's sandbox, cancelled if the client hangs up."""
    return await cancel_on_disconnect(request, "/run_code", get_pipeline(request).run_code(run))


async def cancel_on_disconnect(request: Request, endpoint: str, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it if the client goes away (ClientDisconnectedError then)."""
    task = asyncio.ensure_future(work)
    disconnected = False

    async def watch() -> None:
        nonlocal disconnected
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                disconnected = True
                task.cancel()
                return

    watcher = asyncio.create_task(watch())
    try:
        return await task
    except asyncio.CancelledError:
        if not disconnected:
            raise
        logger.info("client disconnected from %s; its queued items were dropped", endpoint)
        raise ClientDisconnectedError("client disconnected") from None
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher
