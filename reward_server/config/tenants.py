"""Tenants: who shares this server (issue 23). A tenant is a name, a scheduling weight and
optional limits; ``--api-keys FILE`` lists them with the SHA-256 of each one's key.

The keys file's loading and reloading live here too (plain data, no HTTP), and
:data:`current_tenant`, the tenant of the request being served: the HTTP layer's auth
dependency sets it in the request's task, and the schedulers read it where they queue work
(the context is copied into the tasks a request starts), so no signature between the route
and a scheduler has to carry it. It lives in this lowest layer so that both the scoring
core and the engines' own schedulers can read it."""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

__all__ = ["DEFAULT_TENANT", "Tenant", "current_tenant"]


@dataclass(frozen=True, slots=True)
class Tenant:
    """One caller of the server, as the keys file names it.

    ``weight``: its share of the batches when several tenants wait (weighted fair queueing
    on tokens). ``tokens_per_s``: a rate limit on the tokens it sends (None: none).
    ``queue_share``: the fraction of ``--max-queue`` its queued items may take (None: all).
    """

    name: str
    weight: float = 1.0
    tokens_per_s: float | None = None
    queue_share: float | None = None


#: Every request when the server has no keys file (no key, or one ``--api-key``).
DEFAULT_TENANT = Tenant("default")

#: The tenant of the request being served (DEFAULT_TENANT outside a request).
current_tenant: ContextVar[Tenant] = ContextVar("reward_server_tenant", default=DEFAULT_TENANT)
