"""This server's own routes: ``/score``, ``/health``, ``/info``, ``/metrics``. Each validates
the body (:mod:`~reward_server.http.schemas`), checks the key (:mod:`~reward_server.http.auth`),
hands the items to the scoring pipeline as plain data (:mod:`~reward_server.http.scoring`)
and shapes the answer. Other servers' routes
(vLLM, TEI, OpenRLHF) are in :mod:`reward_server.http.compat`. No torch; failures answer
through :mod:`reward_server.http.errors`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from reward_server import __version__
from reward_server.errors import NotReadyError
from reward_server.http.auth import Authorized
from reward_server.http.errors import ERROR_DOCS, error_response
from reward_server.http.schemas import (
    ErrorResponse,
    HealthResponse,
    InfoResponse,
    ScoreRequest,
    ScoreResponse,
    plain_conversation,
)
from reward_server.http.scoring import RegistryDep
from reward_server.http.scoring import score as score_items
from reward_server.http.strict_json import StrictJSONRoute
from reward_server.scoring.items import Conversations, Items, Pairs, Texts
from reward_server.scoring.metrics import CONTENT_TYPE
from reward_server.scoring.pipeline import ScoreOptions
from reward_server.scoring.scored import Scored

__all__ = ["router"]


router = APIRouter(route_class=StrictJSONRoute)

#: /score's error answers: the shared ones, and its own 422 checks (ScoreRequest's rules
#: beyond its schema).
SCORE_ERRORS: dict[int | str, dict[str, Any]] = {
    **ERROR_DOCS,
    422: {
        **ERROR_DOCS[422],
        "description": ERROR_DOCS[422]["description"] + "; and here: queries and responses "
        "of unequal length, labels not one per item, groups not a partition of some items "
        "sharing their prompt (invalid_request), a model that is not served (unknown_model)",
    },
}


def _request_items(body: ScoreRequest) -> Items:
    """A ScoreRequest's items: texts, pairs or conversations, as plain data, with their
    labels."""
    labels = None if body.labels is None else tuple(body.labels)
    if body.texts is not None:
        return Texts(tuple(body.texts), labels)
    each = body.item_tools()
    tools = tuple(each) if any(t is not None for t in each) else None
    if body.queries is not None and body.responses is not None:
        return Pairs(tuple(body.queries), tuple(body.responses), labels, tools)
    return Conversations(
        tuple(plain_conversation(messages) for messages in body.conversation_messages()),
        labels,
        tools,
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
        masked=scored.masked(),
        verifier_errors=scored.verifier_errors(),
        tests=scored.tests(),
        criteria=scored.criteria(),  # type: ignore[arg-type]
    )


@router.post(
    "/score",
    response_model=ScoreResponse,
    response_model_exclude_none=True,
    responses=SCORE_ERRORS,
)
async def score(body: ScoreRequest, request: Request, _auth: Authorized) -> ScoreResponse:
    """Score texts, query/response pairs or conversations with the reward model(s)."""
    scored = await score_items(
        request,
        "/score",
        _request_items(body),
        ScoreOptions(
            truncate=body.truncate,
            model=body.model,
            cache=body.cache,
            groups=None if body.groups is None else tuple(tuple(g) for g in body.groups),
        ),
        timeout_ms=body.timeout_ms,
    )
    return _score_response(scored, body)


@router.get(
    "/health",
    response_model=HealthResponse,
    responses={503: {"model": ErrorResponse, "description": "Loading or draining"}},
)
async def health(registry: RegistryDep) -> Response | HealthResponse:
    """200 when the models are loaded and their schedulers run; 503 while loading or draining."""
    if registry.ready:
        return HealthResponse(status="ok")
    message = "draining" if registry.draining else "loading"
    return error_response(503, "not_ready", message, None)


@router.get(
    "/info",
    response_model=InfoResponse,
    # No body and no scoring: a wrong key or a server still loading are its only errors.
    responses={status: ERROR_DOCS[status] for status in (401, 503)},
)
async def info(registry: RegistryDep, _auth: Authorized) -> InfoResponse:
    """The models served and the server's batching limits (never the API key); the top-level
    model fields describe the first model."""
    if not registry.loaded:
        raise NotReadyError("the model is loading")
    s = registry.settings
    first = registry.model  # None when only verifiers are served: no model fields then
    return InfoResponse.model_validate(
        {
            **(first.info() if first is not None else {}),
            "truncate": not s.no_truncate,
            "max_batch_tokens": registry.max_batch_tokens,
            "max_batch_size": s.max_batch_size,
            "max_wait_ms": s.max_wait_ms,
            "max_client_batch": s.effective_max_client_batch,
            "max_queue": s.max_queue,
            "max_body_bytes": s.max_body_bytes,
            "auth": s.tenants is not None,
            "policy_tokenizer": s.policy_tokenizer,
            "engine": registry.engine,
            "models": registry.models_info(),
            "aggregate": registry.aggregate,
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
async def metrics(registry: RegistryDep) -> Response:
    """Prometheus metrics in the text exposition format."""
    return Response(registry.metrics.render(), media_type=CONTENT_TYPE)
