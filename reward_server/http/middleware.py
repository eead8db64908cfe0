"""ASGI middlewares of the app: the request body limit and the HTTP metrics."""

from __future__ import annotations

import time
from collections.abc import Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reward_server.http.auth import TENANT_STATE
from reward_server.http.errors import (
    BodyTooLargeError,
    ErrorBody,
    default_error_body,
    error_response,
)
from reward_server.http.metrics import ENDPOINTS, OTHER_ENDPOINT, HttpMetrics

__all__ = ["BodyLimitMiddleware", "MetricsMiddleware"]


class _HTTPMiddleware:
    """Base of the middlewares here: non-HTTP scopes (the lifespan) pass straight through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.handle(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one HTTP request."""
        raise NotImplementedError


class _ResponseWatch:
    """Wraps ``send`` to see the status of the answer once it starts (None before)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.status: int | None = None

    async def send(self, message: Message) -> None:
        """Pass the message on, noting the status of ``http.response.start``."""
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
        await self._send(message)


class _BodyCounter:
    """Wraps ``receive`` to count body bytes and raise BodyTooLargeError past ``limit``."""

    def __init__(self, receive: Receive, limit: int) -> None:
        self._receive = receive
        self._limit = limit
        self._received = 0

    async def receive(self) -> Message:
        """The next message, after adding its body to the count."""
        message = await self._receive()
        if message["type"] == "http.request":
            self._received += len(message.get("body", b""))
            if self._received > self._limit:
                raise BodyTooLargeError(self._limit)
        return message


def _declared_length(scope: Scope) -> int:
    """The largest Content-Length the request declares; -1 for none (or not a number)."""
    lengths = [
        _to_int(value) for name, value in scope.get("headers", ()) if name == b"content-length"
    ]
    return max(lengths, default=-1)


def _to_int(value: bytes) -> int:
    try:
        return int(value)
    except ValueError:
        return -1


class BodyLimitMiddleware(_HTTPMiddleware):
    """Reject request bodies over ``limit`` bytes with 413 before reading them fully.

    A declared Content-Length over the limit is answered at once; a chunked or lying body
    is counted as it streams in and cut off as soon as it passes the limit.
    """

    def __init__(
        self,
        app: ASGIApp,
        limit: int,
        metrics: HttpMetrics | None = None,
        error_bodies: Mapping[str, ErrorBody] | None = None,
    ) -> None:
        """``error_bodies``: the error shape of paths that answer in another protocol's."""
        super().__init__(app)
        self.limit = limit
        self.metrics = metrics
        self.error_bodies = dict(error_bodies or {})

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request unless its body is, or turns out to be, too large."""
        if _declared_length(scope) > self.limit:
            await self._reject(scope, receive, send)
            return
        body = _BodyCounter(receive, self.limit)
        answer = _ResponseWatch(send)
        try:
            await self.app(scope, body.receive, answer.send)
        except BodyTooLargeError:
            # Normally the app's exception handler answers; this covers readers outside it.
            if answer.status is not None:
                raise
            await self._reject(scope, receive, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            413,
            "body_too_large",
            f"request body exceeds the limit of {self.limit} bytes",
            self.metrics,
            headers={"Connection": "close"},
            body=self.error_bodies.get(scope.get("path", ""), default_error_body),
        )
        await response(scope, receive, send)


class MetricsMiddleware(_HTTPMiddleware):
    """Count every HTTP answer by endpoint and status, and time it."""

    def __init__(self, app: ASGIApp, metrics: HttpMetrics) -> None:
        super().__init__(app)
        self.metrics = metrics

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request, counting it in flight, then by status, and timing it."""
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else OTHER_ENDPOINT
        begin = time.perf_counter()
        answer = _ResponseWatch(send)
        in_progress = self.metrics.in_progress.labels(endpoint=endpoint)
        in_progress.inc()
        try:
            await self.app(scope, receive, answer.send)
        finally:
            in_progress.dec()
            # The tenant is set by the auth dependency once the key matched (401s belong to
            # no tenant).
            self.metrics.on_answer(
                endpoint,
                answer.status or 500,
                time.perf_counter() - begin,
                scope.get("state", {}).get(TENANT_STATE),
            )
