"""Every failure's HTTP answer: the one table from exception to status and ``type``, the
readable message, the JSON error body and the handlers that send it (no torch)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from reward_server.errors import (
    BadDeadlineError,
    ChatTemplateError,
    ClientDisconnectedError,
    EmptyTextError,
    GroupsError,
    LabelError,
    ModelLoadError,
    ModelNotFoundError,
    ModelsFileError,
    NotReadyError,
    NotRunningError,
    PolicyTemplateError,
    PolicyTemplateLoadError,
    QueueFullError,
    ResponseNotFoundError,
    RunRefusedError,
    ScoringError,
    StepsTruncatedError,
    TenantLimitError,
    TextTooLongError,
    TooManyItemsError,
    UnauthorizedError,
    UnknownModelError,
    UnrenderableError,
    field_path,
)
from reward_server.http.schemas import ErrorResponse

if TYPE_CHECKING:
    from reward_server.http.metrics import HttpMetrics

logger = logging.getLogger("reward_server")

__all__ = [
    "ERRORS",
    "ERROR_DOCS",
    "BodyTooLargeError",
    "ErrorBody",
    "answer_error",
    "classify",
    "default_error_body",
    "describe_validation",
    "error_response",
    "install_error_handlers",
]


class BodyTooLargeError(StarletteHTTPException):
    """A request body over ``max_body_bytes`` (raised from the body reader).

    An HTTPException, so that FastAPI's body parsing passes it on instead of turning it
    into a generic 400.
    """

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body exceeds the limit of {limit} bytes")


#: Start-up failures: a request never meets one unless something is badly wrong.
_LOAD_ERRORS = dict.fromkeys(
    (ModelLoadError, ModelsFileError, PolicyTemplateLoadError), "load_error"
)

#: Error ``type`` of each exception kind, by HTTP status.
_KINDS_BY_STATUS: dict[int, dict[type[BaseException], str]] = {
    401: {UnauthorizedError: "unauthorized"},
    404: {ModelNotFoundError: "model_not_found"},
    413: {
        TooManyItemsError: "too_many_items",
        TextTooLongError: "text_too_long",
        BodyTooLargeError: "body_too_large",
        StepsTruncatedError: "steps_truncated",
    },
    422: {
        RequestValidationError: "invalid_request",
        ChatTemplateError: "chat_template",
        UnrenderableError: "unrenderable",
        PolicyTemplateError: "policy_template",
        EmptyTextError: "empty_text",
        ResponseNotFoundError: "response_not_found",
        UnknownModelError: "unknown_model",
        RunRefusedError: "run_refused",
        BadDeadlineError: "bad_deadline",
        GroupsError: "bad_groups",
        LabelError: "bad_label",
    },
    429: {QueueFullError: "queue_full", TenantLimitError: "tenant_limit"},
    # nginx's "client closed request": nobody reads it, but metrics count it.
    499: {ClientDisconnectedError: "client_disconnected"},
    500: {ScoringError: "model_error", **_LOAD_ERRORS},
    503: {NotReadyError: "not_ready", NotRunningError: "shutting_down"},
}

#: The one table from exception kinds to HTTP status and error ``type``.
ERRORS: dict[type[BaseException], tuple[int, str]] = {
    exc: (status, kind) for status, kinds in _KINDS_BY_STATUS.items() for exc, kind in kinds.items()
}

#: 5xx kinds whose message is safe to send (it names no internal detail).
_SAFE_5XX = (ScoringError, NotReadyError, NotRunningError)

#: Kinds of plain HTTP errors raised by the framework itself (routing, body parsing).
_HTTP_KINDS = {
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
}

#: The error answers of the scoring routes, for the OpenAPI document: what each status
#: means, by the error ``type`` of the table above. A route names its own 422 checks in front
#: of the shared ones (its body's rules that JSON Schema cannot state).
ERROR_DOCS: dict[int | str, dict[str, Any]] = {
    401: {
        "model": ErrorResponse,
        "description": "Missing or wrong API key (unauthorized)",
        "headers": {"WWW-Authenticate": {"schema": {"type": "string", "const": "Bearer"}}},
    },
    413: {
        "model": ErrorResponse,
        "description": "More items than --max-client-batch (too_many_items), a text over the "
        "model's limit with truncation off (text_too_long), a process model's steps all cut "
        "by truncation (steps_truncated), or a body over --max-body-bytes (body_too_large)",
    },
    422: {
        "model": ErrorResponse,
        "description": "Malformed input (invalid_request): a body this schema refuses, a "
        "string that is not Unicode text (a lone surrogate escape); or input the served "
        "models cannot score: a chat template refusing a conversation (chat_template) or "
        "unable to show its tool calls, tool results or tools (unrenderable), an item that "
        "encodes to no token (empty_text), a process model given texts or a conversation "
        "not ending with the assistant's turn (response_not_found), a model scoring in groups "
        "given none or a group it cannot compare (bad_groups), an X-Request-Timeout-Ms "
        "header that is not a positive number (bad_deadline)",
    },
    429: {
        "model": ErrorResponse,
        "description": "The queue is full (queue_full) or the tenant is over its limit "
        "(tenant_limit); retry after the Retry-After header's seconds",
        "headers": {"Retry-After": {"schema": {"type": "integer", "minimum": 1}}},
    },
    500: {
        "model": ErrorResponse,
        "description": "The model failed on this request (model_error), or the server did "
        "(internal_error)",
    },
    503: {
        "model": ErrorResponse,
        "description": "Not ready (not_ready) or shutting down (shutting_down)",
    },
}


def classify(exc: BaseException) -> tuple[int, str]:
    """Status and error type of an exception, looked up along its class hierarchy."""
    for cls in type(exc).__mro__:
        if cls in ERRORS:
            return ERRORS[cls]
    if isinstance(exc, StarletteHTTPException):
        if exc.status_code == 400:
            # FastAPI raises a bare 400 only when the body cannot be decoded as JSON at all
            # (invalid UTF-8, nesting too deep): malformed input, like invalid JSON.
            return 422, "invalid_request"
        return exc.status_code, _HTTP_KINDS.get(exc.status_code, "http_error")
    return 500, "internal_error"


#: Validation error types meaning "the body is not a JSON object".
_NOT_AN_OBJECT = frozenset({"model_attributes_type", "model_type", "dict_type"})


def describe_validation(exc: RequestValidationError) -> str:
    """One readable line naming the offending fields of a validation error."""
    errors = list(exc.errors())
    messages = []
    for err in errors[:3]:
        if err.get("type") == "json_invalid":
            detail = (err.get("ctx") or {}).get("error", "")
            pos = err["loc"][-1] if err.get("loc") else "?"
            return f"request body is not valid JSON: {detail} (at character {pos})"
        raw_loc = tuple(err.get("loc", ()))
        loc = list(raw_loc[1:]) if raw_loc[:1] == ("body",) else list(raw_loc)
        # A field of several JSON types puts the type it took in the path ("<list>").
        loc = [part for part in loc if not (isinstance(part, str) and part.startswith("<"))]
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        if not loc and err.get("type") == "missing":
            msg = "a JSON request body is required"
        elif not loc and err.get("type") in _NOT_AN_OBJECT:
            msg = "the request body must be a JSON object (Content-Type: application/json)"
        messages.append(f"{field_path(loc)}: {msg}" if loc else msg)
    more = f" (and {len(errors) - 3} more errors)" if len(errors) > 3 else ""
    return "; ".join(messages) + more


def _message(exc: BaseException, status: int) -> str:
    """The ``error`` text of an answer: readable, and never an internal detail on 5xx."""
    if isinstance(exc, RequestValidationError):
        return describe_validation(exc)
    if isinstance(exc, TextTooLongError):
        return (
            f"item {exc.index} has {exc.num_tokens} tokens, over the limit of "
            f"{exc.max_length}, and truncation is off"
        )
    if isinstance(exc, TenantLimitError):
        return str(exc)  # names the tenant and its own limit (a share or a rate)
    if isinstance(exc, QueueFullError):
        return f"the scoring queue is full; retry in {_retry_after(exc)} s"
    if isinstance(exc, NotRunningError):
        return "the server is shutting down"
    if isinstance(exc, StarletteHTTPException):
        if exc.status_code == 400:
            return "request body is not valid JSON (it must be UTF-8 and not nested too deeply)"
        return str(exc.detail)
    if status >= 500 and not isinstance(exc, (ScoringError, NotReadyError)):
        return "internal server error"
    return str(exc) or type(exc).__name__


def _retry_after(exc: BaseException) -> str:
    """Whole seconds for the Retry-After header, at least 1."""
    seconds = float(getattr(exc, "retry_after", 1.0) or 1.0)
    return str(max(1, math.ceil(seconds)))


def _headers(exc: BaseException) -> dict[str, str]:
    """Extra headers of an error answer (Retry-After, WWW-Authenticate, the exception's)."""
    headers: dict[str, str] = {}
    if isinstance(exc, StarletteHTTPException) and exc.headers:
        headers.update(exc.headers)
    if isinstance(exc, QueueFullError):
        headers["Retry-After"] = _retry_after(exc)
    if isinstance(exc, UnauthorizedError):
        headers["WWW-Authenticate"] = "Bearer"
    return headers


#: Builds the JSON body of an error answer from its status, kind, message and the request
#: field at fault (None when unknown): each protocol's clients expect their own shape.
ErrorBody = Callable[[int, str, str, "str | None"], dict[str, Any]]


def default_error_body(status: int, kind: str, message: str, param: str | None) -> dict[str, Any]:
    """This server's shape: ``{"error": message, "type": kind}``."""
    return ErrorResponse(error=message, type=kind).model_dump()


def error_response(
    status: int,
    kind: str,
    message: str,
    metrics: HttpMetrics | None,
    headers: Mapping[str, str] | None = None,
    *,
    body: ErrorBody = default_error_body,
    param: str | None = None,
) -> JSONResponse:
    """The JSON error body every failure answers with (counted in ``metrics``)."""
    if metrics is not None:
        metrics.on_error(status, kind)
    return JSONResponse(body(status, kind, message, param), status_code=status, headers=headers)


def answer_error(
    request: Request, exc: BaseException, body: ErrorBody = default_error_body
) -> JSONResponse:
    """Any exception as the error answer of the table, its body in ``body``'s shape."""
    status, kind = classify(exc)
    if status >= 500 and not isinstance(exc, _SAFE_5XX):
        logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    metrics = getattr(request.app.state, "http_metrics", None)
    param = getattr(exc, "param", None)
    return error_response(
        status, kind, _message(exc, status), metrics, _headers(exc), body=body, param=param
    )


async def _handle_error(request: Request, exc: Exception) -> Response:
    """Turn any exception into the JSON error answer of the table."""
    return answer_error(request, exc)


def install_error_handlers(app: FastAPI) -> None:
    """Answer every exception of ``app`` through the table (the rest as 500)."""
    for exc_type in (*ERRORS, StarletteHTTPException, Exception):
        app.add_exception_handler(exc_type, _handle_error)
