"""Scheduling: every queue, batch window and tenant turn of the server, between the scoring
core (which submits token-id rows) and the engines (which only run rows).

* :mod:`~reward_server.scheduling.contract`: the :class:`Scheduler` the core submits to, the
  two ways an engine runs rows (a blocking ``run_batch`` function, or a :class:`RowRunner`
  that batches by itself), :class:`BatchLimits`, :class:`BatchStats` and the one check that a
  scheduler's answers fit its rows (:func:`check_count`).
* :mod:`~reward_server.scheduling.batcher`: the micro-batcher (windows, the pass-cost model,
  passes on the compute thread) for blocking engines.
* :mod:`~reward_server.scheduling.admission`: admission and fair hand-off for an engine that
  batches by itself.
* :mod:`~reward_server.scheduling.tenant_queues` and :mod:`~reward_server.scheduling.fairness`:
  one queue per tenant, deficit round robin, per-tenant admission and rate buckets (one
  :class:`TokenBuckets` per app, which the registry owns).
* :mod:`~reward_server.scheduling.rate_limit`: the sliding-window start limit of requests to a
  remote reward service.

:func:`make_scheduler` is the one constructor: it picks the scheduler from what the engine
offers. No torch and no HTTP here.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from reward_server.scheduling.admission import AdmissionScheduler
from reward_server.scheduling.batcher import Batcher
from reward_server.scheduling.contract import (
    BatchLimits,
    BatchObserver,
    BatchRunner,
    BatchStats,
    RowRunner,
    Scheduler,
    check_count,
)
from reward_server.scheduling.fairness import TokenBuckets

__all__ = [
    "AdmissionScheduler",
    "BatchLimits",
    "BatchObserver",
    "BatchRunner",
    "BatchStats",
    "Batcher",
    "RowRunner",
    "Scheduler",
    "TokenBuckets",
    "check_count",
    "make_scheduler",
]


def make_scheduler(
    engine: RowRunner | BatchRunner,
    limits: BatchLimits,
    *,
    observer: BatchObserver | None = None,
    buckets: TokenBuckets | None = None,
    executor: Executor | None = None,
    convert: Callable[[Any], Any] = float,
) -> Scheduler:
    """The scheduler for ``engine``: admission around its own batching when it is a
    :class:`RowRunner`, else the micro-batcher over its ``run_batch`` function (run on
    ``executor``, each value checked by ``convert``). ``buckets``: the app's tenant rate
    buckets, shared by every served model's scheduler."""
    if isinstance(engine, RowRunner):
        return AdmissionScheduler(engine, limits, observer=observer, buckets=buckets)
    return Batcher(
        engine, limits, observer=observer, executor=executor, convert=convert, buckets=buckets
    )
