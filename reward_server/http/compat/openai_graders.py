"""OpenAI's graders API on this server, so that code written against the ``openai`` package
(``client.fine_tuning.alpha.graders.run`` and ``.validate``) works with its ``base_url``
pointed here, and the endpoint-grader contract that a fine-tuning job calls over HTTP:

- ``POST /v1/fine_tuning/alpha/graders/run``: ``{grader, model_sample, item}`` ->
  ``{reward, sub_rewards, metadata: {name, type, execution_time, scores, token_usage,
  sampled_model_name, errors: {<flag>: bool, ...details}}, model_grader_token_usage_per_model}``,
  OpenAI's shape field for field. A grade that fails is a 200 with reward 0 and its flag
  set, as OpenAI answers; a grader object that is not valid is a 422 naming the field.
- ``POST /v1/fine_tuning/alpha/graders/validate``: ``{grader}`` -> ``{grader}`` (as parsed),
  or the same 422.
- ``POST /v1/graders/{name}``: the endpoint-grader contract (``{sample, item, trace_id}`` ->
  ``{"score": float}``) for the ``kind: grader`` entry ``name`` of the models file;
  ``sample`` is the response's text or an object with ``output_text`` (and ``output_tools``).
  An item whose grade failed answers ``{"score": null, "error": <flag>}`` (masked) or the
  entry's ``on_error`` score.

All three are behind the server's API keys (``Authorization: Bearer KEY``), like every route.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field

from reward_server.config.graders import GRADER_FLAGS, GraderObject
from reward_server.errors import NotReadyError, UnknownModelError
from reward_server.http.auth import Authorized
from reward_server.http.compat import ProtocolRoute
from reward_server.http.compat.vllm import VLLMErrorResponse, vllm_error_body
from reward_server.http.errors import ERROR_DOCS
from reward_server.http.scoring import deadline, get_registry, score
from reward_server.http.strict_json import StrictJSONRoute
from reward_server.scoring.items import Conversations
from reward_server.scoring.pipeline import ScoreOptions

__all__ = [
    "EndpointGradeRequest",
    "EndpointGradeResponse",
    "GraderRunRequest",
    "GraderRunResponse",
    "GraderValidateRequest",
    "endpoint_router",
    "router",
]


class _OpenAIRoute(ProtocolRoute):
    """OpenAI's error shape (``{"error": {"message", "type", "param", "code"}}``), which the
    ``openai`` package reads into its exceptions' messages."""

    error_body = staticmethod(vllm_error_body)


#: The OpenAI routes' error answers, in OpenAI's shape; a 422 also for a grader object that
#: JSON Schema cannot refuse (a template variable outside item and sample, a formula that
#: does not parse, a python source that does not compile or defines no grade).
_OPENAI_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {**doc, "model": VLLMErrorResponse} for status, doc in ERROR_DOCS.items()
}
_OPENAI_ERRORS[422] = {
    "model": VLLMErrorResponse,
    "description": "A body this schema refuses, or a grader object that is not valid: a "
    "template variable outside item and sample, a multi grader's formula that does not "
    "parse or names no grader of it, a python source that does not compile or defines no "
    "grade, a label_model's passing_labels not among its labels (invalid_request)",
}

#: OpenAI's graders API (its error shape).
router = APIRouter(route_class=_OpenAIRoute, tags=["openai-graders"])
logger = logging.getLogger(__name__)
#: The endpoint-grader contract (this server's error shape).
endpoint_router = APIRouter(route_class=StrictJSONRoute, tags=["openai-graders"])

_EXAMPLE = {
    "type": "string_check",
    "name": "exact",
    "input": "{{ sample.output_text }}",
    "reference": "{{ item.answer }}",
    "operation": "eq",
}


class GraderRunRequest(BaseModel):
    """OpenAI's ``graders/run`` body."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"grader": _EXAMPLE, "model_sample": "Paris", "item": {"answer": "Paris"}}]
        },
    )

    grader: GraderObject = Field(description="The grader object, as OpenAI defines it.")
    model_sample: str = Field(
        description="The model's sample: sample.output_text (and output_json when it is JSON)."
    )
    item: Any = Field(default=None, description="The dataset row: the item namespace.")


class GraderValidateRequest(BaseModel):
    """OpenAI's ``graders/validate`` body."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"grader": _EXAMPLE}]}
    )

    grader: GraderObject = Field(description="The grader object to check.")


class RunErrors(BaseModel):
    """``metadata.errors``: one flag per kind of failure, and the details of some."""

    model_config = ConfigDict(extra="allow")

    formula_parse_error: bool = False
    invalid_variable_error: bool = False
    model_grader_parse_error: bool = False
    model_grader_refusal_error: bool = False
    model_grader_server_error: bool = False
    model_grader_server_error_details: str | None = None
    other_error: bool = False
    python_grader_runtime_error: bool = False
    python_grader_runtime_error_details: str | None = None
    python_grader_server_error: bool = False
    python_grader_server_error_type: str | None = None
    sample_parse_error: bool = False
    truncated_observation_error: bool = False
    unresponsive_reward_error: bool = False


class RunMetadata(BaseModel):
    """``metadata`` of a run."""

    name: str
    type: str
    execution_time: float
    scores: dict[str, float]
    token_usage: int | None = None
    sampled_model_name: str | None = None
    errors: RunErrors


class GraderRunResponse(BaseModel):
    """OpenAI's ``graders/run`` answer."""

    reward: float
    sub_rewards: dict[str, float]
    metadata: RunMetadata
    model_grader_token_usage_per_model: dict[str, Any]


def _errors(flags: dict[str, str]) -> RunErrors:
    """The errors object of a run's flags (``flag -> detail``)."""
    errors = RunErrors(**{flag: True for flag in flags if flag in GRADER_FLAGS})
    for flag, detail in flags.items():
        if flag == "python_grader_runtime_error":
            errors.python_grader_runtime_error_details = detail[-2000:]
        elif flag == "python_grader_server_error":
            errors.python_grader_server_error_type = detail
        elif flag == "model_grader_server_error":
            errors.model_grader_server_error_details = detail
    return errors


@router.post(
    "/v1/fine_tuning/alpha/graders/run",
    response_model=GraderRunResponse,
    responses=_OPENAI_ERRORS,
)
async def run_grader(
    body: GraderRunRequest, request: Request, _auth: Authorized
) -> GraderRunResponse:
    """Run a grader on one sample and item, as OpenAI's graders API does."""
    runs = get_registry(request).grader_runs
    if runs is None:
        raise NotReadyError("the server is not started")
    run = await runs.run(body.grader, body.model_sample, body.item, deadline(request))
    request.app.state.http_metrics.items.labels(endpoint=request.url.path).inc()
    return GraderRunResponse(
        reward=run.reward,
        sub_rewards=runs.sub_rewards(body.grader, run),
        metadata=RunMetadata(
            name=body.grader.name,
            type=body.grader.type,
            execution_time=run.execution_time,
            scores=run.scores,
            token_usage=sum(run.tokens.values()) if run.tokens else None,
            errors=_errors(run.errors),
        ),
        model_grader_token_usage_per_model={
            model: {"total_tokens": tokens} for model, tokens in run.tokens.items()
        },
    )


@router.post("/v1/fine_tuning/alpha/graders/validate", responses=_OPENAI_ERRORS)
async def validate_grader(body: GraderValidateRequest, _auth: Authorized) -> dict[str, Any]:
    """Check a grader object: the grader as parsed, or a 422 naming its bad field."""
    return {"grader": body.grader.model_dump(exclude_none=True)}


class SampleObject(BaseModel):
    """A sample as an object: its text and tool calls (OpenAI's sample namespace)."""

    model_config = ConfigDict(extra="ignore")

    output_text: str = Field(description="The response's text.")
    output_tools: list[dict[str, Any]] | None = Field(
        default=None, description="The response's tool calls, OpenAI's shape."
    )


class EndpointGradeRequest(BaseModel):
    """The endpoint-grader contract's body: the sample, the item, a trace id."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {"sample": {"output_text": "Paris"}, "item": {"answer": "Paris"}, "trace_id": "t1"}
            ]
        },
    )

    sample: str | SampleObject = Field(
        description="The response: its text, or an object with output_text (and output_tools)."
    )
    item: Any = Field(default=None, description="The dataset row (the item namespace).")
    trace_id: str | None = Field(default=None, description="The caller's id of the call (logged).")


class EndpointGradeResponse(BaseModel):
    """The endpoint-grader contract's answer."""

    score: float | None
    error: str | None = None


@endpoint_router.post(
    "/v1/graders/{name}", response_model=EndpointGradeResponse, responses=ERROR_DOCS
)
async def endpoint_grade(
    name: str, body: EndpointGradeRequest, request: Request, _auth: Authorized
) -> EndpointGradeResponse:
    """The endpoint-grader contract for the models file's ``kind: grader`` entry ``name``."""
    registry = get_registry(request)
    logger.debug("endpoint grader %s: trace %s", name, body.trace_id)
    graders = [m.name for m in registry.served if m.kind == "grader"]
    if name not in graders:
        raise UnknownModelError(f"no kind: grader entry named {name!r} (served: {graders})")
    if isinstance(body.sample, str):
        text, calls = body.sample, None
    else:
        text, calls = body.sample.output_text, body.sample.output_tools
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    items = Conversations(((message,),), (body.item,))
    scored = await score(request, "/v1/graders", items, ScoreOptions(model=name))
    (result,) = scored.results[name]
    return EndpointGradeResponse(score=None if result.masked else result.score, error=result.error)
