"""The deadline of the request being scored, as the scoring pipeline sets it for the served
models it fans out to (a context variable: each model's task copies it at creation).

A served model that can settle part of its items by the deadline (a verifier: the items
done keep their verdicts, the rest get ``deadline``) reads it; every other model is
cancelled by the pipeline when the deadline comes, its unstarted rows dropped and its items
masked ``deadline`` as a whole.
"""

from __future__ import annotations

from contextvars import ContextVar

__all__ = ["current_deadline"]

#: The request's deadline as a ``time.monotonic()`` instant; None: it has none.
current_deadline: ContextVar[float | None] = ContextVar("reward_deadline", default=None)
