"""The HTTP layer: FastAPI routes, error table, auth, body limit and lifespan.

request -> validate (schemas) -> render + tokenize (one tokenizer thread) -> batcher.submit
-> response. This module knows HTTP; the batcher knows futures and budgets; the model
knows torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any, Protocol, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reward_server import __version__
from reward_server.batcher import Batcher, BatcherClosedError, QueueFullError
from reward_server.config import ServerSettings
from reward_server.metrics import CONTENT_TYPE, Metrics
from reward_server.model import ChatTemplateError, TextTooLongError
from reward_server.schemas import (
    ErrorResponse,
    GetRewardRequest,
    GetRewardResponse,
    HealthResponse,
    InfoResponse,
    ScoreRequest,
    ScoreResponse,
)

logger = logging.getLogger("reward_server")

T = TypeVar("T")


class ScorerLike(Protocol):
    """What the app needs from a reward model (``reward_server.model.RewardModel``)."""

    name: str
    max_length: int

    def render_pairs(self, queries: Sequence[str], responses: Sequence[str]) -> list[str]: ...

    def render_conversations(
        self, conversations: Sequence[Sequence[Mapping[str, str]]]
    ) -> list[str]: ...

    def encode(self, texts: Sequence[str], *, truncate: bool) -> list[Any]: ...

    def score_batch(self, batch: Sequence[Sequence[int]]) -> list[float]: ...

    def info(self) -> dict[str, object]: ...


# --------------------------------------------------------------------------- errors


class TooManyItemsError(ValueError):
    """A request carries more items than the server accepts at once."""


class EmptyTextError(ValueError):
    """An item tokenizes to nothing, so there is no token to read a score from."""


class UnauthorizedError(PermissionError):
    """Missing or wrong API key."""


class NotReadyError(RuntimeError):
    """The model is still loading (the lifespan has not finished starting)."""


class ScoringError(RuntimeError):
    """The model failed on a request (details are logged, never sent)."""


class ClientDisconnectedError(ConnectionError):
    """The client went away before its scores were ready; its queued work was dropped."""


class BodyTooLargeError(StarletteHTTPException):
    """A request body over ``max_body_bytes`` (raised from the body reader)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body exceeds the limit of {limit} bytes")


#: The one table from exception kinds to HTTP status and error ``type``.
ERRORS: dict[type[BaseException], tuple[int, str]] = {
    RequestValidationError: (422, "invalid_request"),
    ChatTemplateError: (422, "chat_template"),
    EmptyTextError: (422, "empty_text"),
    UnauthorizedError: (401, "unauthorized"),
    TooManyItemsError: (413, "too_many_items"),
    TextTooLongError: (413, "text_too_long"),
    BodyTooLargeError: (413, "body_too_large"),
    QueueFullError: (429, "queue_full"),
    NotReadyError: (503, "not_ready"),
    BatcherClosedError: (503, "shutting_down"),
    ScoringError: (500, "model_error"),
    # nginx's "client closed request": nobody reads it, but metrics count it.
    ClientDisconnectedError: (499, "client_disconnected"),
}

_KNOWN_ERRORS = tuple(ERRORS)

#: Kinds of plain HTTP errors raised by the framework itself (routing, body parsing).
_HTTP_KINDS = {
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
}

_ERROR_DOCS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": kind}
    for status, kind in (
        (401, "Missing or wrong API key"),
        (413, "Too many items, a text too long with truncation off, or a body too large"),
        (422, "Malformed input"),
        (429, "Queue full; retry after the Retry-After header"),
        (500, "The model failed on this request"),
        (503, "Not ready or shutting down"),
    )
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


def _loc(parts: Sequence[int | str]) -> str:
    """``("body", "texts", 2)`` -> ``texts[2]``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


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
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        if not loc and err.get("type") == "missing":
            msg = "a JSON request body is required"
        elif not loc and err.get("type") in _NOT_AN_OBJECT:
            msg = "the request body must be a JSON object (Content-Type: application/json)"
        messages.append(f"{_loc(loc)}: {msg}" if loc else msg)
    more = f" (and {len(errors) - 3} more errors)" if len(errors) > 3 else ""
    return "; ".join(messages) + more


def _message(exc: BaseException, status: int) -> str:
    if isinstance(exc, RequestValidationError):
        return describe_validation(exc)
    if isinstance(exc, TextTooLongError):
        return (
            f"item {exc.index} has {exc.num_tokens} tokens, over the limit of "
            f"{exc.max_length}, and truncation is off"
        )
    if isinstance(exc, QueueFullError):
        return f"the scoring queue is full; retry in {_retry_after(exc)} s"
    if isinstance(exc, BatcherClosedError):
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


def error_response(
    status: int,
    kind: str,
    message: str,
    metrics: Metrics | None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The JSON error body every failure answers with."""
    if metrics is not None:
        metrics.errors.labels(status=str(status), type=kind).inc()
    return JSONResponse(
        ErrorResponse(error=message, type=kind).model_dump(), status_code=status, headers=headers
    )


async def _handle_error(request: Request, exc: Exception) -> Response:
    """Turn any exception into the JSON error answer of the table."""
    status, kind = classify(exc)
    headers: dict[str, str] = {}
    if isinstance(exc, StarletteHTTPException) and exc.headers:
        headers.update(exc.headers)
    if isinstance(exc, QueueFullError):
        headers["Retry-After"] = _retry_after(exc)
    if isinstance(exc, UnauthorizedError):
        headers["WWW-Authenticate"] = "Bearer"
    if status >= 500 and not isinstance(exc, (ScoringError, NotReadyError, BatcherClosedError)):
        logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    service = getattr(request.app.state, "service", None)
    metrics = service.metrics if service is not None else None
    return error_response(status, kind, _message(exc, status), metrics, headers)


# --------------------------------------------------------------------------- middleware


def _json_error_bytes(message: str, kind: str) -> bytes:
    return ErrorResponse(error=message, type=kind).model_dump_json().encode()


class BodyLimitMiddleware:
    """Reject request bodies over ``limit`` bytes with 413 before reading them fully.

    A declared Content-Length over the limit is answered at once; a chunked or lying body
    is counted as it streams in and cut off as soon as it passes the limit.
    """

    def __init__(self, app: ASGIApp, limit: int, metrics: Metrics | None = None) -> None:
        self.app = app
        self.limit = limit
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = -1
                if declared > self.limit:
                    await self._reject(scope, receive, send)
                    return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLargeError(self.limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLargeError:
            # Normally the app's exception handler answers; this covers readers outside it.
            if started:
                raise
            await self._reject(scope, receive, send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            413,
            "body_too_large",
            f"request body exceeds the limit of {self.limit} bytes",
            self.metrics,
            headers={"Connection": "close"},
        )
        await response(scope, receive, send)


#: Endpoints counted by name in metrics; anything else is "other" (bounded label set).
_ENDPOINTS = frozenset(
    {"/score", "/get_reward", "/health", "/info", "/metrics", "/docs", "/openapi.json"}
)


class MetricsMiddleware:
    """Count every HTTP answer by endpoint and status, and time it."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = path if path in _ENDPOINTS else "other"
        status = 500
        begin = time.perf_counter()

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        in_progress = self.metrics.in_progress.labels(endpoint=endpoint)
        in_progress.inc()
        try:
            await self.app(scope, receive, recording_send)
        finally:
            in_progress.dec()
            self.metrics.requests.labels(endpoint=endpoint, status=str(status)).inc()
            self.metrics.request_seconds.labels(endpoint=endpoint).observe(
                time.perf_counter() - begin
            )


# --------------------------------------------------------------------------- service


class Service:
    """Per-app state: settings, model, batcher, metrics and the tokenizer thread."""

    def __init__(
        self, settings: ServerSettings, model: ScorerLike | None, metrics: Metrics
    ) -> None:
        self.settings = settings
        self.model = model
        self.metrics = metrics
        self.batcher: Batcher | None = None
        # --max-batch-tokens, or its default for the model's device once the model is known.
        self.max_batch_tokens: int | None = settings.max_batch_tokens
        self.draining = False
        # One thread renders and tokenizes: off the event loop, and never two calls into a
        # fast tokenizer at once (its Rust backend is not re-entrant across threads).
        self._tokenizer_thread: ThreadPoolExecutor | None = None

    @property
    def ready(self) -> bool:
        """True once the model is loaded and the batcher runs, until draining begins."""
        return (
            self.model is not None
            and self.batcher is not None
            and self.batcher.running
            and not self.draining
        )

    @property
    def max_client_batch(self) -> int:
        """Items per request accepted (a request larger than the queue could never fit)."""
        return self.settings.effective_max_client_batch

    async def start(self) -> None:
        """Load the model if needed (off the event loop) and start the batcher."""
        s = self.settings
        if self.model is None:
            from reward_server.model import RewardModel

            self.model = await asyncio.to_thread(load_model, s, RewardModel)
        self._tokenizer_thread = ThreadPoolExecutor(1, thread_name_prefix="reward-tokenize")
        self.max_batch_tokens = s.batch_token_budget(
            str(getattr(self.model, "device", "cpu")), self.model.max_length
        )
        self.batcher = Batcher(
            self.model.score_batch,
            max_batch_tokens=self.max_batch_tokens,
            max_batch_size=s.max_batch_size,
            max_wait_ms=s.max_wait_ms,
            max_queue=s.max_queue,
            observer=self.metrics,
            # The thread the model was loaded on (see reward_server.model.compute_thread).
            executor=getattr(self.model, "executor", None),
        )
        await self.batcher.start()
        batcher = self.batcher
        self.metrics.track_queue(lambda: float(batcher.queued))
        self.metrics.ready.set_function(lambda: 1.0 if self.ready else 0.0)
        if self.model.max_length > self.max_batch_tokens:
            logger.warning(
                "max_length %d exceeds max_batch_tokens %d: raise --max-batch-tokens or lower "
                "--max-length",
                self.model.max_length,
                self.max_batch_tokens,
            )
        if s.max_client_batch > s.max_queue:
            logger.warning(
                "max_client_batch %d exceeds max_queue %d; accepting at most %d items a request",
                s.max_client_batch,
                s.max_queue,
                s.max_queue,
            )

    def begin_drain(self) -> None:
        """Report 503 on /health from now on (called first thing on SIGTERM)."""
        if not self.draining:
            logger.info("draining: finishing queued work before exit")
        self.draining = True

    async def stop(self) -> None:
        """Drain: finish queued work, then stop the batcher and the tokenizer thread."""
        self.begin_drain()
        if self.batcher is not None:
            await self.batcher.stop(drain=True)
        if self._tokenizer_thread is not None:
            self._tokenizer_thread.shutdown(wait=True)

    async def _in_tokenizer_thread(self, fn: Callable[[], T]) -> T:
        assert self._tokenizer_thread is not None
        return await asyncio.get_running_loop().run_in_executor(self._tokenizer_thread, fn)

    async def score(
        self,
        request: Request,
        endpoint: str,
        n_items: int,
        render: Callable[[ScorerLike], list[str]],
        truncate: bool | None,
    ) -> tuple[list[float], list[Any]]:
        """Render, tokenize and score ``n_items`` items; returns scores and encodings."""
        # Draining does not refuse work here: after SIGTERM uvicorn accepts no new
        # connections, so whatever still arrives was already in flight and is finished;
        # the batcher refuses (503) only once it stops, after those requests are done.
        if self.model is None or self.batcher is None:
            raise NotReadyError("the model is loading")
        if n_items > self.max_client_batch:
            raise TooManyItemsError(
                f"{n_items} items in one request; the limit is {self.max_client_batch} "
                f"(split the request)"
            )
        model, batcher = self.model, self.batcher
        do_truncate = (not self.settings.no_truncate) if truncate is None else truncate
        try:
            encoded = await self._in_tokenizer_thread(
                lambda: model.encode(render(model), truncate=do_truncate)
            )
            for i, item in enumerate(encoded):
                if item.num_tokens == 0:
                    raise EmptyTextError(f"item {i} encodes to no tokens; nothing to score")
            scores = await _cancel_on_disconnect(
                request, batcher.submit([item.input_ids for item in encoded])
            )
            if len(scores) != len(encoded):
                raise RuntimeError(f"{len(scores)} scores for {len(encoded)} items")
            for i, value in enumerate(scores):
                if not math.isfinite(value):
                    raise RuntimeError(f"non-finite score {value} for item {i}")
        except _KNOWN_ERRORS:  # these answer through the table
            raise
        except Exception as exc:
            logger.error("scoring failed on %s (%d items)", endpoint, n_items, exc_info=exc)
            raise ScoringError(
                "the reward model failed on this request; the error is in the server log"
            ) from exc
        self.metrics.items.labels(endpoint=endpoint).inc(len(encoded))
        self.metrics.tokens.inc(sum(item.num_tokens for item in encoded))
        self.metrics.truncated.inc(sum(1 for item in encoded if item.truncated))
        return [float(s) for s in scores], encoded


async def _cancel_on_disconnect(request: Request, work: Awaitable[T]) -> T:
    """Await ``work``, cancelling it if the client goes away (its queued items are dropped)."""
    task = asyncio.ensure_future(work)
    disconnected = False

    async def watch() -> None:
        nonlocal disconnected
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                disconnected = True
                task.cancel()
                return

    watcher = asyncio.create_task(watch())
    try:
        return await task
    except asyncio.CancelledError:
        if not disconnected:
            raise
        logger.info("client disconnected from %s; its queued items were dropped", request.url.path)
        raise ClientDisconnectedError("client disconnected") from None
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher


def load_model(settings: ServerSettings, model_cls: Any) -> Any:
    """Load the reward model named by ``settings`` (raises ModelLoadError).

    The load runs on the process's compute thread, where the batcher later runs every pass
    (see :func:`reward_server.model.compute_thread`).
    """
    from reward_server.model import run_on_compute_thread

    return run_on_compute_thread(
        lambda: model_cls.load(
            settings.model,
            adapter=settings.adapter,
            merge_adapter=settings.merge_adapter,
            dtype=settings.dtype,
            device=settings.device,
            max_length=settings.max_length,
            truncation_side=settings.truncation_side,
            label_index=settings.label_index,
            chat_template=settings.chat_template,
            trust_remote_code=settings.trust_remote_code,
        )
    )


# --------------------------------------------------------------------------- routes


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
            return _loc(path)
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


router = APIRouter(route_class=StrictJSONRoute)


def _render_request(body: ScoreRequest) -> Callable[[ScorerLike], list[str]]:
    """The function that turns a ScoreRequest into strings with a given model."""
    if body.texts is not None:
        texts = body.texts
        return lambda model: list(texts)
    if body.queries is not None and body.responses is not None:
        queries, responses = body.queries, body.responses
        return lambda model: model.render_pairs(queries, responses)
    conversations = [
        [{"role": m.role, "content": m.content} for m in conv] for conv in body.conversations or []
    ]
    return lambda model: model.render_conversations(conversations)


@router.post("/score", response_model=ScoreResponse, responses=_ERROR_DOCS)
async def score(
    body: ScoreRequest, request: Request, service: ServiceDep, _auth: Authorized
) -> ScoreResponse:
    """Score texts, query/response pairs or conversations with the reward model."""
    scores, encoded = await service.score(
        request, "/score", body.num_items, _render_request(body), body.truncate
    )
    assert service.model is not None
    return ScoreResponse(
        scores=scores,
        tokens=[e.num_tokens for e in encoded],
        truncated=[e.truncated for e in encoded],
        model=service.model.name,
    )


@router.post("/get_reward", response_model=GetRewardResponse, responses=_ERROR_DOCS)
async def get_reward(
    body: GetRewardRequest, request: Request, service: ServiceDep, _auth: Authorized
) -> GetRewardResponse:
    """OpenRLHF remote reward: score complete texts given as ``query``."""
    texts = body.query
    scores, encoded = await service.score(
        request, "/get_reward", len(texts), lambda model: list(texts), None
    )
    return GetRewardResponse(
        rewards=scores,
        scores=scores,
        extra_logs={
            "tokens": [float(e.num_tokens) for e in encoded],
            "truncated": [1.0 if e.truncated else 0.0 for e in encoded],
        },
    )


@router.get(
    "/health",
    response_model=HealthResponse,
    responses={503: {"model": ErrorResponse, "description": "Loading or draining"}},
)
async def health(service: ServiceDep) -> Response | HealthResponse:
    """200 when the model is loaded and the batcher runs; 503 while loading or draining."""
    if service.ready:
        return HealthResponse(status="ok")
    message = "draining" if service.draining else "loading"
    return error_response(503, "not_ready", message, None)


@router.get("/info", response_model=InfoResponse, responses=_ERROR_DOCS)
async def info(service: ServiceDep, _auth: Authorized) -> InfoResponse:
    """The model served and the server's batching limits (never the API key)."""
    if service.model is None:
        raise NotReadyError("the model is loading")
    s = service.settings
    details = dict(service.model.info())
    return InfoResponse.model_validate(
        {
            **details,
            "truncate": not s.no_truncate,
            "max_batch_tokens": service.max_batch_tokens,
            "max_batch_size": s.max_batch_size,
            "max_wait_ms": s.max_wait_ms,
            "max_client_batch": service.max_client_batch,
            "max_queue": s.max_queue,
            "max_body_bytes": s.max_body_bytes,
            "auth": s.api_key is not None,
            "version": __version__,
        }
    )


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {CONTENT_TYPE.split(";")[0]: {}}, "description": "Prometheus text"}
    },
)
async def metrics(service: ServiceDep) -> Response:
    """Prometheus metrics in the text exposition format."""
    return Response(service.metrics.render(), media_type=CONTENT_TYPE)


# --------------------------------------------------------------------------- app


def create_app(settings: ServerSettings, *, model: ScorerLike | None = None) -> FastAPI:
    """Build the FastAPI app; with ``model`` None the lifespan loads it from ``settings``."""
    metrics_ = Metrics()
    service = Service(settings, model, metrics_)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(
        title="reward-server",
        version=__version__,
        summary="A sequence-classification reward model behind HTTP: text in, scores out.",
        lifespan=lifespan,
    )
    app.state.service = service
    app.include_router(router)
    if settings.api_key is None:
        _drop_security_from_openapi(app)
    for exc_type in (*ERRORS, StarletteHTTPException, Exception):
        app.add_exception_handler(exc_type, _handle_error)
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes, metrics=metrics_)
    app.add_middleware(MetricsMiddleware, metrics=metrics_)
    return app


def _drop_security_from_openapi(app: FastAPI) -> None:
    """Without an API key nothing needs auth: say so in /openapi.json too."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        schema = generate()
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                operation.pop("security", None)
        schema.get("components", {}).pop("securitySchemes", None)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
