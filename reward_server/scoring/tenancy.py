"""The tenant of the request being scored, for the schedulers (issue 23).

The HTTP layer's auth dependency sets :data:`current_tenant` in the request's task; the
scoring core reads it where it queues work (the context is copied into the tasks a request
starts), so no signature between the route and the scheduler has to carry it."""

from __future__ import annotations

from contextvars import ContextVar

from reward_server.config.tenants import DEFAULT_TENANT, Tenant

__all__ = ["current_tenant"]

current_tenant: ContextVar[Tenant] = ContextVar("reward_server_tenant", default=DEFAULT_TENANT)
