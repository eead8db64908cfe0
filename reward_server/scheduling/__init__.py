"""Scheduling: the one admission core every kind's work goes through, between the scoring
core and what runs the work (model engines' rows, verifier workers' items, sandbox slots'
programs, connections to remote services).

* :mod:`~reward_server.scheduling.fairness`: admission (:class:`Admission`: the queue limit,
  each tenant's share of it and rate limit, one Retry-After from the measured rate), the
  tenants' rate buckets (one :class:`TokenBuckets` per app, which the registry owns), deficit
  round robin and what a tenant was served lately.
* :mod:`~reward_server.scheduling.fair_queue` and :mod:`~reward_server.scheduling.seats`: the
  one fair queue (a sparse tenant's work first, else turns by weight) in front of an
  executor's seats: each kind says what a piece of its work costs and how many seats it has
  (vLLM's rows, a verifier pool's worker processes, a code verifier's sessions and sandbox
  slots, a remote service's connections); cancelling a piece takes it out of the queue.
* :mod:`~reward_server.scheduling.contract`: the :class:`Scheduler` the core submits model
  rows to, the two ways an engine runs rows (a blocking ``run_batch`` function, or a
  :class:`RowRunner` that batches by itself), :class:`BatchLimits`, :class:`BatchStats` and
  the one check that a scheduler's answers fit its rows (:func:`check_count`).
* :mod:`~reward_server.scheduling.batcher` and :mod:`~reward_server.scheduling.tenant_queues`:
  the micro-batcher for blocking engines (its own windows, the pass-cost model, passes on the
  compute thread; one queue of rows per tenant, turns on the same deficit round robin).
* :mod:`~reward_server.scheduling.admission`: admission and fair hand-off for an engine that
  batches by itself (its rows are seats).
* :mod:`~reward_server.scheduling.rate_limit`: the sliding-window start limit of requests to a
  remote reward service (``max_rpm``).

:func:`make_scheduler` is the one constructor of a model's scheduler: it picks it from what
the engine offers. No torch and no HTTP here. Outside this package no module makes a queue or
a semaphore or reads a tenant's share (``tests/unit/test_scheduling_boundary.py``).
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
from reward_server.scheduling.fair_queue import FairQueue
from reward_server.scheduling.fairness import Admission, TokenBuckets
from reward_server.scheduling.seats import Seats

__all__ = [
    "Admission",
    "AdmissionScheduler",
    "BatchLimits",
    "BatchObserver",
    "BatchRunner",
    "BatchStats",
    "Batcher",
    "FairQueue",
    "RowRunner",
    "Scheduler",
    "Seats",
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
