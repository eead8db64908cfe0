"""Who may call: the API key check (``Authorization: Bearer <key>``) as the dependency every
scoring route declares.

The key's SHA-256 is compared in constant time with every tenant's (``--api-keys``, or the
one ``--api-key``); the tenant it belongs to becomes :data:`current_tenant` for the rest of
the request. Keys are never logged, on success or failure.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from reward_server.config.tenants import DEFAULT_TENANT, Tenant, TenantKeys, current_tenant
from reward_server.errors import UnauthorizedError

__all__ = [
    "TENANT_STATE",
    "Authorized",
    "get_tenant_keys",
    "require_api_key",
]

#: Where the request's tenant name is kept in ``request.state`` (the scope's "state"), for
#: the metrics middleware, which runs outside the route.
TENANT_STATE = "tenant"


def get_tenant_keys(request: Request) -> TenantKeys:
    """The app's live tenants table (reloaded in place by SIGHUP and file changes)."""
    return request.app.state.tenant_keys  # type: ignore[no-any-return]


_bearer = HTTPBearer(
    auto_error=False,
    description="The server's API key (--api-key), or a tenant's key (--api-keys).",
)


# async on purpose: FastAPI runs a plain def dependency on a worker thread, in a copy of
# the context, and the tenant set there would never reach the route. An async one runs in
# the request's own task, so the route and every task it starts see current_tenant.
async def require_api_key(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Tenant:
    """Check ``Authorization: Bearer <key>`` against the tenants' keys (when any is
    configured) and make its tenant the request's :data:`current_tenant`."""
    keys = get_tenant_keys(request)
    if not keys.required:
        tenant = DEFAULT_TENANT
    else:
        if credentials is None:
            raise UnauthorizedError("missing API key: send 'Authorization: Bearer <key>'")
        found = keys.authenticate(credentials.credentials)
        if found is None:
            raise UnauthorizedError("wrong API key")
        tenant = found
    current_tenant.set(tenant)
    setattr(request.state, TENANT_STATE, tenant.name)
    return tenant


Authorized = Annotated[Tenant, Depends(require_api_key)]
