"""vLLM's pooling API on this server: ``POST /classify`` (and ``/v1/classify``), ``POST
/pooling`` and ``GET /v1/models``, field for field as vLLM 0.32 answers them, so that vLLM
clients (verl's reward loop among them) score against this server unchanged.

Differences kept on purpose: ``activation``, the name verl still sends, is honoured as
well as ``use_activation`` (vLLM 0.32 ignores it and returns the sigmoid); token-id inputs
are refused (the server tokenizes); status codes are this server's (422 for malformed
input where vLLM says 400). Which items were truncated comes in the ``X-Reward-Truncated``
header.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from fastapi import APIRouter, Request, Response
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    model_validator,
)

from reward_server.errors import NotReadyError
from reward_server.http.auth import Authorized
from reward_server.http.compat import (
    ANSWER_HEADERS,
    ProtocolRoute,
    activate,
    check_model,
    fill_masked,
    masked_header,
    model_aliases,
    row_labels,
    rows,
    truncated_header,
)
from reward_server.http.errors import ERROR_DOCS
from reward_server.http.json_types import StrList, Text, integer, one_of
from reward_server.http.schemas import Conversation, plain_conversation
from reward_server.http.scoring import RegistryDep, score
from reward_server.scoring.items import Conversations, Items, Texts
from reward_server.scoring.pipeline import ScoreOptions
from reward_server.scoring.registry import ModelRegistry
from reward_server.scoring.scored import Scored

__all__ = [
    "ClassificationData",
    "ClassificationResponse",
    "ModelCard",
    "ModelList",
    "PoolingData",
    "PoolingRequest",
    "PoolingResponse",
    "UsageInfo",
    "VLLMErrorInfo",
    "VLLMErrorResponse",
    "VLLMRequest",
    "router",
    "vllm_error_body",
]

# ------------------------------------------------------------------------------- errors

#: vLLM's error ``type`` by status (the names its OpenAI-style clients know).
_ERROR_TYPES = {
    400: "BadRequestError",
    401: "Unauthorized",
    404: "NotFoundError",
    413: "BadRequestError",
    422: "UnprocessableEntityError",
    429: "TooManyRequests",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class VLLMErrorInfo(BaseModel):
    """The error of a vLLM error answer."""

    message: str
    type: str
    param: str | None = None
    code: int


class VLLMErrorResponse(BaseModel):
    """vLLM's error answer: ``{"error": {"message", "type", "param", "code"}}``."""

    error: VLLMErrorInfo


def vllm_error_body(status: int, kind: str, message: str, param: str | None) -> dict[str, Any]:
    """An error answer in vLLM's shape."""
    info = VLLMErrorInfo(
        message=message, type=_ERROR_TYPES.get(status, "BadRequestError"), param=param, code=status
    )
    return VLLMErrorResponse(error=info).model_dump()


class _VLLMRoute(ProtocolRoute):
    error_body = staticmethod(vllm_error_body)


_ERRORS = {status: {**doc, "model": VLLMErrorResponse} for status, doc in ERROR_DOCS.items()}
_ERRORS[404] = {"model": VLLMErrorResponse, "description": "The model named is not served"}
#: The answers of /classify and /pooling: a success's headers, and the errors.
_ANSWERS: dict[int | str, dict[str, Any]] = {200: {"headers": ANSWER_HEADERS}, **_ERRORS}

router = APIRouter(route_class=_VLLMRoute, tags=["vLLM"])

# ------------------------------------------------------------------------------- bodies


class VLLMRequest(BaseModel):
    """``/classify`` (and ``/pooling``): exactly one of ``input`` (a text or texts) and
    ``messages`` (one conversation, rendered with the reward model's chat template)."""

    model_config = ConfigDict(
        extra="ignore",  # vLLM accepts (and logs) unknown fields
        json_schema_extra={
            # _one_input's rule (null is not given).
            "oneOf": [
                {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
                for name in ("input", "messages")
            ],
            "examples": [
                {"input": ["a complete text"], "use_activation": False},
                {"messages": [{"role": "user", "content": "hi"}]},
            ],
        },
    )

    model: str | None = Field(default=None, description="The served model or its alias.")
    input: one_of("a text or a list of texts", string=Text, list=StrList) | None = Field(
        default=None, description="A text or a list of texts."
    )
    messages: Conversation | None = Field(
        default=None, description="One conversation, rendered with the model's chat template."
    )
    use_activation: StrictBool | None = Field(
        default=None,
        description="false: raw logits; default true: sigmoid of one label, softmax of several.",
    )
    activation: StrictBool | None = Field(
        default=None, description="The old name of use_activation (verl sends it); false wins."
    )
    truncate_prompt_tokens: integer(ge=-1) | None = Field(
        default=None,
        description="Keep at most this many tokens per item (-1: the model's limit); "
        "default: the server's truncation setting.",
    )

    @model_validator(mode="after")
    def _one_input(self) -> VLLMRequest:
        if (self.input is None) == (self.messages is None):
            raise ValueError("give exactly one of input or messages")
        return self

    @property
    def raw(self) -> bool:
        """True when either activation flag is false."""
        return self.use_activation is False or self.activation is False

    def items(self) -> Items:
        """The request's items: its texts, or its one conversation."""
        if self.messages is not None:
            return Conversations((plain_conversation(self.messages),))
        # A lone text is a list of one (the answer is a list either way).
        texts = [self.input] if isinstance(self.input, str) else self.input or []
        return Texts(tuple(texts))

    def limits(self) -> tuple[bool | None, int | None]:
        """``(truncate, max_tokens)`` for the pipeline from ``truncate_prompt_tokens``."""
        k = self.truncate_prompt_tokens
        if k is None:
            return None, None
        if k < 0:
            return True, None
        return True, max(k, 1)


class PoolingRequest(VLLMRequest):
    """``/pooling``: as ``/classify``; ``task`` may name ``classify`` (the only one served)."""

    task: Literal["classify"] | None = None


class UsageInfo(BaseModel):
    """Token counts of an answer (vLLM's UsageInfo)."""

    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: dict[str, Any] | None = None
    completion_tokens_details: dict[str, Any] | None = None


class ClassificationData(BaseModel):
    """One item of a ``/classify`` answer."""

    index: int
    label: str | None
    probs: list[float] = Field(description="Every label's probability, or raw logit.")
    num_classes: int


class ClassificationResponse(BaseModel):
    """vLLM's ``/classify`` answer."""

    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ClassificationData]
    usage: UsageInfo


class PoolingData(BaseModel):
    """One item of a ``/pooling`` answer."""

    index: int
    object: str = "pooling"
    data: list[float]


class PoolingResponse(BaseModel):
    """vLLM's ``/pooling`` answer."""

    id: str
    object: str = "list"
    created: int
    model: str
    data: list[PoolingData]
    usage: UsageInfo


class ModelCard(BaseModel):
    """One served model, as vLLM lists it."""

    id: str
    object: str = "model"
    created: int
    owned_by: str = "reward-server"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[dict[str, Any]] = Field(default_factory=list)


class ModelList(BaseModel):
    """``GET /v1/models``."""

    object: str = "list"
    data: list[ModelCard]


# ------------------------------------------------------------------------------- routes


async def _logits(
    body: VLLMRequest, request: Request, response: Response, registry: ModelRegistry
) -> tuple[list[list[float]], Scored, str]:
    """Every label's value per item (activated unless asked raw), the results, model name
    (with several models: their combined score as one label, named after them all)."""
    if registry.loaded:
        check_model(body.model, registry.name)
    truncate, max_tokens = body.limits()
    options = ScoreOptions(truncate=truncate, max_tokens=max_tokens)
    scored = await score(request, request.url.path, body.items(), options)
    response.headers.update(truncated_header(scored.truncated))
    response.headers.update(masked_header(scored))
    values = rows(scored) if body.raw else [activate(row) for row in rows(scored)]
    values = fill_masked(scored, values)
    return values, scored, registry.name


def _usage(scored: Scored) -> UsageInfo:
    tokens = sum(scored.tokens)
    return UsageInfo(prompt_tokens=tokens, total_tokens=tokens)


@router.post(
    "/classify",
    response_model=ClassificationResponse,
    responses=_ANSWERS,
    operation_id="vllm_classify",
)
@router.post(
    "/v1/classify",
    response_model=ClassificationResponse,
    responses=_ANSWERS,
    operation_id="vllm_v1_classify",
)
async def classify(
    body: VLLMRequest,
    request: Request,
    response: Response,
    registry: RegistryDep,
    _auth: Authorized,
) -> ClassificationResponse:
    """vLLM's classification: every label's probability (or raw logit) per item."""
    values, scored, name = await _logits(body, request, response, registry)
    labels = row_labels(scored)
    data = []
    for i, row in enumerate(values):
        best = max(range(len(row)), key=row.__getitem__)
        label = labels[best] if best < len(labels) else None
        data.append(ClassificationData(index=i, label=label, probs=row, num_classes=len(row)))
    return ClassificationResponse(
        id=f"classify-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=name,
        data=data,
        usage=_usage(scored),
    )


@router.post("/pooling", response_model=PoolingResponse, responses=_ANSWERS)
async def pooling(
    body: PoolingRequest,
    request: Request,
    response: Response,
    registry: RegistryDep,
    _auth: Authorized,
) -> PoolingResponse:
    """vLLM's pooling of a classifier: every label's probability (or raw logit) per item."""
    values, scored, name = await _logits(body, request, response, registry)
    return PoolingResponse(
        id=f"pool-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=name,
        data=[PoolingData(index=i, data=row) for i, row in enumerate(values)],
        usage=_usage(scored),
    )


@router.get(
    "/v1/models",
    response_model=ModelList,
    # No body and no scoring: a wrong key or a server still loading are its only errors.
    responses={status: _ERRORS[status] for status in (401, 503)},
)
async def models(registry: RegistryDep, _auth: Authorized) -> ModelList:
    """The served model, as vLLM lists its models (clients probe it to find the name)."""
    if not registry.loaded:
        raise NotReadyError("the model is loading")
    name = registry.name
    max_len = registry.max_length
    cards = [
        ModelCard(id=alias, created=int(time.time()), root=name, max_model_len=max_len)
        for alias in sorted(model_aliases(name), key=lambda a: a != name)
    ]
    return ModelList(data=cards)
