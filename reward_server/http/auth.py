"""Who may call: the service of the app as a dependency, and the API key check (constant
time, ``Authorization: Bearer <key>``), as the dependencies every scoring route declares."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from reward_server.errors import UnauthorizedError
from reward_server.scoring.service import Service

__all__ = ["Authorized", "ServiceDep", "get_service", "require_api_key"]


def get_service(request: Request) -> Service:
    """The app's Service."""
    return request.app.state.service  # type: ignore[no-any-return]


_bearer = HTTPBearer(
    auto_error=False,
    description="The server's API key, when it was started with --api-key.",
)


def require_api_key(
    service: Annotated[Service, Depends(get_service)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Check ``Authorization: Bearer <key>`` in constant time when a key is configured."""
    key = service.settings.api_key
    if key is None:
        return
    if credentials is None:
        raise UnauthorizedError("missing API key: send 'Authorization: Bearer <key>'")
    given = credentials.credentials.encode("utf-8", "surrogateescape")
    if not hmac.compare_digest(given, key.get_secret_value().encode("utf-8")):
        raise UnauthorizedError("wrong API key")


ServiceDep = Annotated[Service, Depends(get_service)]
Authorized = Annotated[None, Depends(require_api_key)]
