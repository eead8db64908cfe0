"""The HTTP routes: validate the body (schemas), check the key, hand the items to the
service, shape the answer. No torch; failures answer through :mod:`reward_server.http.errors`."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from reward_server import __version__
from reward_server.errors import NotReadyError, UnauthorizedError
from reward_server.http.errors import ERROR_DOCS, error_response
from reward_server.http.schemas import (
    ErrorResponse,
    GetRewardRequest,
    GetRewardResponse,
    HealthResponse,
    InfoResponse,
    ScoreRequest,
    ScoreResponse,
)
from reward_server.http.strict_json import StrictJSONRoute
from reward_server.scoring.metrics import CONTENT_TYPE
from reward_server.scoring.served import Conversation, Items
from reward_server.scoring.service import Scored, Service
from reward_server.text.policy_template import recover_conversations

__all__ = ["get_service", "require_api_key", "router"]


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

router = APIRouter(route_class=StrictJSONRoute)


def _request_items(body: ScoreRequest) -> Items:
    """A ScoreRequest's items: texts for a model, and conversations when the response is
    known (pairs and conversations)."""
    if body.texts is not None:
        texts = body.texts
        return Items(len(texts), lambda model: list(texts))
    if body.queries is not None and body.responses is not None:
        queries, responses = body.queries, body.responses
        pairs = [
            [{"role": "user", "content": q}, {"role": "assistant", "content": r}]
            for q, r in zip(queries, responses, strict=True)
        ]
        return Items(
            len(queries),
            lambda model: model.render_pairs(queries, responses),
            lambda: pairs,
            (queries, responses),
        )
    conversations = [
        [{"role": m.role, "content": m.content} for m in conv] for conv in body.conversations or []
    ]
    return Items(
        len(conversations),
        lambda model: model.render_conversations(conversations),
        lambda: conversations,
    )


def _query_items(body: GetRewardRequest, service: Service) -> Items:
    """As given, or through the policy's template back to conversations (in the tokenizer
    thread with the rest of the rendering)."""
    texts, template = body.query, service.policy_template
    if template is None:
        return Items(len(texts), lambda model: list(texts))
    prompts = body.prompts

    def conversations() -> list[Conversation]:
        return recover_conversations(template, texts, prompts)

    return Items(
        len(texts), lambda model: model.render_conversations(conversations()), conversations
    )


def _score_response(scored: Scored, body: ScoreRequest) -> ScoreResponse:
    """The /score answer: scores, tokens and truncation, and the breakdown that applies."""
    steps = scored.steps()
    return ScoreResponse(
        scores=scored.scores,
        tokens=scored.tokens,
        truncated=scored.truncated,
        model=scored.name,
        components=scored.components() if body.components or len(scored.results) > 1 else None,
        objectives=scored.objectives(),
        step_scores=None if steps is None else [list(r.step_scores or ()) for r in steps],
        step_ends=None if steps is None else [list(r.step_ends or ()) for r in steps],
        steps_dropped=None if steps is None else [r.steps_dropped for r in steps],
        outcome_scores=scored.outcome_scores,
    )


@router.post(
    "/score",
    response_model=ScoreResponse,
    response_model_exclude_none=True,
    responses=ERROR_DOCS,
)
async def score(
    body: ScoreRequest, request: Request, service: ServiceDep, _auth: Authorized
) -> ScoreResponse:
    """Score texts, query/response pairs or conversations with the reward model(s)."""
    scored = await service.score(
        request.receive, "/score", _request_items(body), truncate=body.truncate, model=body.model
    )
    return _score_response(scored, body)


@router.post("/get_reward", response_model=GetRewardResponse, responses=ERROR_DOCS)
async def get_reward(
    body: GetRewardRequest, request: Request, service: ServiceDep, _auth: Authorized
) -> GetRewardResponse:
    """OpenRLHF remote reward: score complete texts given as ``query`` (with --policy-tokenizer,
    their conversations recovered from the policy's chat template); with several models, their
    combined score."""
    texts = body.query
    if not texts:
        # OpenRLHF before 0.11.2 sends empty shards to all but one of several servers.
        return GetRewardResponse(rewards=[], scores=[], extra_logs={})
    scored = await service.score(
        request.receive, "/get_reward", _query_items(body, service), truncate=None
    )
    return GetRewardResponse(
        rewards=scored.scores,
        scores=scored.scores,
        extra_logs={
            "tokens": [float(n) for n in scored.tokens],
            "truncated": [1.0 if t else 0.0 for t in scored.truncated],
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


@router.get("/info", response_model=InfoResponse, responses=ERROR_DOCS)
async def info(service: ServiceDep, _auth: Authorized) -> InfoResponse:
    """The models served and the server's batching limits (never the API key); the top-level
    model fields describe the first model."""
    if service.model is None:
        raise NotReadyError("the model is loading")
    s = service.settings
    return InfoResponse.model_validate(
        {
            **service.model.info(),
            "truncate": not s.no_truncate,
            "max_batch_tokens": service.max_batch_tokens,
            "max_batch_size": s.max_batch_size,
            "max_wait_ms": s.max_wait_ms,
            "max_client_batch": service.max_client_batch,
            "max_queue": s.max_queue,
            "max_body_bytes": s.max_body_bytes,
            "auth": s.api_key is not None,
            "policy_tokenizer": s.policy_tokenizer,
            "engine": service.engine,
            "models": service.models_info(),
            "aggregate": service.aggregate,
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
