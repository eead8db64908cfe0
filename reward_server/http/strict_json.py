"""JSON request bodies as RFC 8259 has them: NaN and Infinity are refused, naming where."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from fastapi.routing import APIRoute

from reward_server.errors import field_path

__all__ = ["StrictJSONRequest", "StrictJSONRoute", "parse_strict_json"]


class _NonStandardConstant(ValueError):
    """NaN, Infinity or -Infinity in a request body (Python accepts them; JSON does not)."""


def _reject_constant(name: str) -> Any:
    raise _NonStandardConstant(name)


#: A JSON string, or one of the non-standard constants outside strings.
_CONSTANT_OR_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN)')


def _non_finite_path(value: Any) -> str:
    """Where the first non-finite number sits in decoded JSON, e.g. ``texts[0]``."""
    stack: list[tuple[Any, tuple[int | str, ...]]] = [(value, ())]
    while stack:  # iterative depth-first walk, document order
        node, path = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            return field_path(path)
        if isinstance(node, dict):
            stack.extend((v, (*path, str(k))) for k, v in reversed(node.items()))
        elif isinstance(node, list):
            stack.extend((v, (*path, i)) for i, v in reversed(list(enumerate(node))))
    return ""


def parse_strict_json(body: bytes) -> Any:
    """``json.loads`` that refuses NaN and Infinity literals (RFC 8259 has no such values).

    The error names the field and the character where the first one stands.
    """
    try:
        return json.loads(body, parse_constant=_reject_constant)
    except _NonStandardConstant as exc:
        text = body.decode(json.detect_encoding(body), "replace")
        pos = next((m.start(1) for m in _CONSTANT_OR_STRING.finditer(text) if m.group(1)), 0)
        where = _non_finite_path(json.loads(body))
        message = f"{exc} is not a JSON value (send a finite number or null)"
        raise json.JSONDecodeError(f"{where}: {message}" if where else message, text, pos) from None


class StrictJSONRequest(Request):
    """A request whose JSON body may not hold NaN or Infinity."""

    async def json(self) -> Any:
        """The decoded body (FastAPI answers a JSONDecodeError with 422 json_invalid)."""
        if not hasattr(self, "_json"):
            self._json = parse_strict_json(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    """Route whose handler parses bodies with :class:`StrictJSONRequest`."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        """Wrap FastAPI's handler so that it reads the body strictly."""
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_handler
