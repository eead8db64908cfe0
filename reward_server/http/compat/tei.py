"""text-embeddings-inference's ``POST /predict`` on this server, answered as TEI does.

``inputs`` follows TEI's rules: a string is one sequence; a list of one or two strings is one
sequence (two: a ``[text, text_pair]`` pair); a list of such lists is a batch. A pair is
rendered as this server renders a query/response pair (the reward model's chat template,
or the two joined). One sequence gets a flat list of ``{"score", "label"}`` (every label,
highest score first), a batch a list of those lists. ``raw_scores`` false applies TEI's
activation (sigmoid of one label, softmax of several). Errors are TEI's ``{"error",
"error_type"}`` with this server's status codes.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from reward_server.http.auth import Authorized
from reward_server.http.compat import (
    ANSWER_HEADERS,
    ProtocolRoute,
    activate,
    fill_masked,
    masked_header,
    row_labels,
    rows,
    truncated_header,
)
from reward_server.http.errors import ERROR_DOCS
from reward_server.http.json_types import Text
from reward_server.http.scoring import score
from reward_server.scoring.items import Items, Pairs, Sequences, Texts
from reward_server.scoring.pipeline import ScoreOptions

__all__ = [
    "PredictRequest",
    "Prediction",
    "TEIErrorResponse",
    "router",
    "tei_error_body",
]

#: TEI's ``error_type`` by status.
_ERROR_TYPES = {
    401: "Unauthorized",
    413: "Validation",
    422: "Validation",
    429: "Overloaded",
    500: "Backend",
    503: "Unhealthy",
}


class TEIErrorResponse(BaseModel):
    """TEI's error answer."""

    error: str
    error_type: str


def tei_error_body(status: int, kind: str, message: str, param: str | None) -> dict[str, Any]:
    """An error answer in TEI's shape."""
    error_type = _ERROR_TYPES.get(status, "Validation" if status < 500 else "Backend")
    return TEIErrorResponse(error=message, error_type=error_type).model_dump()


class _TEIRoute(ProtocolRoute):
    error_body = staticmethod(tei_error_body)


router = APIRouter(route_class=_TEIRoute, tags=["TEI"])

#: One sequence: a text, or a text and its pair.
Sequence_ = list[Text]
_SEQUENCE = {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 2}


class PredictRequest(BaseModel):
    """TEI's ``/predict`` body."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {"inputs": "a complete text", "raw_scores": True},
                {"inputs": [["a prompt", "its response"], ["a text"]], "raw_scores": True},
            ]
        },
    )

    inputs: Text | list[Text] | list[Sequence_] = Field(
        description="A text, one [text] or [text, text_pair], or a batch of those.",
        # _sequences_fit's rule, a sequence of one or two strings, that the types alone
        # leave out of the schema (the server's own messages stay).
        json_schema_extra={
            "anyOf": [
                {"type": "string"},
                _SEQUENCE,
                {"type": "array", "items": _SEQUENCE, "minItems": 1},
            ]
        },
    )
    raw_scores: StrictBool = Field(default=False, description="true: raw logits.")
    truncate: StrictBool | None = Field(
        default=None, description="Truncate over-long inputs; default: the server's setting."
    )

    @model_validator(mode="after")
    def _sequences_fit(self) -> PredictRequest:
        for i, sequence in enumerate(self.sequences):
            if not 1 <= len(sequence) <= 2:
                where = f"inputs[{i}]" if self.batched else "inputs"
                raise ValueError(
                    f"{where} holds {len(sequence)} strings; a sequence is [text] or "
                    "[text, text_pair]"
                )
        return self

    @property
    def batched(self) -> bool:
        """True when ``inputs`` is a list of sequences (the answer is a list of lists)."""
        return (
            isinstance(self.inputs, list) and bool(self.inputs) and isinstance(self.inputs[0], list)
        )

    @property
    def sequences(self) -> list[list[str]]:
        """Every sequence of the request, in order."""
        if isinstance(self.inputs, str):
            return [[self.inputs]]
        if self.batched:
            return [list(s) for s in self.inputs]  # type: ignore[union-attr]
        return [list(self.inputs)]  # type: ignore[arg-type]

    def items(self) -> Items:
        """Texts as given, pairs as query/response pairs, in order."""
        sequences = self.sequences
        if all(len(s) == 1 for s in sequences):
            return Texts(tuple(s[0] for s in sequences))
        if all(len(s) == 2 for s in sequences):
            return Pairs(tuple(s[0] for s in sequences), tuple(s[1] for s in sequences))
        return Sequences(tuple((s[0],) if len(s) == 1 else (s[0], s[1]) for s in sequences))


class Prediction(BaseModel):
    """One label's score."""

    score: float
    label: str


_ERRORS = {status: {**doc, "model": TEIErrorResponse} for status, doc in ERROR_DOCS.items()}
#: /predict's answers: a success's headers, and the errors.
_ANSWERS: dict[int | str, dict[str, Any]] = {200: {"headers": ANSWER_HEADERS}, **_ERRORS}


@router.post(
    "/predict",
    response_model=list[Prediction] | list[list[Prediction]],
    responses=_ANSWERS,
)
async def predict(
    body: PredictRequest,
    request: Request,
    response: Response,
    _auth: Authorized,
) -> list[Prediction] | list[list[Prediction]]:
    """TEI's sequence classification: every label's score per sequence, highest first."""
    scored = await score(request, "/predict", body.items(), ScoreOptions(truncate=body.truncate))
    response.headers.update(truncated_header(scored.truncated))
    response.headers.update(masked_header(scored))
    labels = row_labels(scored)
    answers = []
    activated = rows(scored) if body.raw_scores else [activate(row) for row in rows(scored)]
    for values in fill_masked(scored, activated):
        ranked = sorted(zip(values, labels, strict=True), key=lambda p: -p[0])
        answers.append([Prediction(score=score, label=label) for score, label in ranked])
    return answers if body.batched else answers[0]
