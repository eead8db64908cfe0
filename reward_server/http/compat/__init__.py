"""Other servers' HTTP shapes on this server: vLLM's (:mod:`.vllm`), TEI's (:mod:`.tei`),
OpenRLHF's (:mod:`.openrlhf`), slime's (:mod:`.slime`) and NeMo Gym's (:mod:`.nemo_gym`).

Each protocol is one module with its request and response bodies and its routes; all of
them score through the same :class:`~reward_server.scoring.pipeline.ScoringPipeline` as ``/score`` (admission,
batching, auth, truncation, metrics; with several models, their combined score as one label) and answer errors from the one error table, in the body
shape that protocol's clients read (:class:`ProtocolRoute`). Here: what they share.

Only NeMo Gym's shape can carry a masked item (no reward could be computed; ``null`` in
``/score``), as its ``mask_sample``; in the others it is :data:`MASK_FILL` in every value
of its row (after any activation), and the answer's header :data:`MASKED_HEADER` lists the
masked items.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from pathlib import PurePath
from typing import Any, ClassVar

from fastapi import APIRouter, Request
from fastapi.responses import Response

from reward_server.errors import ModelNotFoundError
from reward_server.http.errors import ErrorBody, answer_error, default_error_body
from reward_server.http.strict_json import StrictJSONRoute
from reward_server.scoring.scored import Scored

__all__ = [
    "AGGREGATE_LABEL",
    "ANSWER_HEADERS",
    "MASKED_HEADER",
    "MASK_FILL",
    "TRUNCATED_HEADER",
    "ProtocolRoute",
    "activate",
    "check_model",
    "fill_masked",
    "masked_header",
    "model_aliases",
    "protocol_error_bodies",
    "row_labels",
    "rows",
    "truncated_header",
]

#: Response header listing which items were truncated (``0,1,0``): the protocols' bodies
#: have no field for it, and nothing is silent.
TRUNCATED_HEADER = "X-Reward-Truncated"


#: The one label of :func:`rows` when several models score: their combined score.
AGGREGATE_LABEL = "aggregate"

#: Response header listing the masked items by index (``0,5,7``); absent when none is.
MASKED_HEADER = "X-Reward-Masked"

#: The value a masked item gets in the shapes that cannot carry null.
MASK_FILL = 0.0

#: The headers of a scoring answer, for the OpenAPI document (``responses={200: ...}``).
ANSWER_HEADERS: dict[str, dict[str, Any]] = {
    TRUNCATED_HEADER: {
        "description": "Per item in order, 1 where a model truncated it, else 0: 0,1,0",
        "schema": {"type": "string", "pattern": "^([01](,[01])*)?$"},
    },
    MASKED_HEADER: {
        "description": "The masked items' indices (no reward could be computed): 0,5,7; "
        "absent when none is",
        "schema": {"type": "string", "pattern": "^([0-9]+(,[0-9]+)*)?$"},
    },
}


def rows(scored: Scored) -> list[list[float]]:
    """One row per item for the vLLM and TEI shapes: the one model's every logit (or its
    score alone when the engine gives no more), or with several models their combined
    score alone (:data:`AGGREGATE_LABEL`); a masked item's row is :data:`MASK_FILL`."""
    width = len(row_labels(scored))
    if len(scored.results) > 1:
        return [[MASK_FILL if s is None else s] for s in scored.scores]
    (results,) = scored.results.values()
    return [[MASK_FILL] * width if r.masked else list(r.logits) or [r.score] for r in results]


def fill_masked(scored: Scored, values: list[list[float]]) -> list[list[float]]:
    """``values`` (one row per item, activated or not) with each masked item's row all
    :data:`MASK_FILL`."""
    reasons = scored.masked() or []
    return [
        [MASK_FILL] * len(row) if i < len(reasons) and reasons[i] is not None else row
        for i, row in enumerate(values)
    ]


def masked_header(scored: Scored) -> dict[str, str]:
    """The masked-items header of an answer (empty when no item is masked)."""
    reasons = scored.masked()
    if reasons is None:
        return {}
    return {MASKED_HEADER: ",".join(str(i) for i, r in enumerate(reasons) if r is not None)}


def row_labels(scored: Scored) -> list[str]:
    """The names of the values in each of :func:`rows`' rows."""
    if len(scored.results) > 1:
        return [AGGREGATE_LABEL]
    (labels,) = scored.labels.values()
    return labels


class ProtocolRoute(StrictJSONRoute):
    """A route whose every failure answers through the error table in ``error_body``'s shape
    (validation, auth, admission and model errors alike)."""

    error_body: ClassVar[ErrorBody] = staticmethod(default_error_body)

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        """Wrap the handler so that exceptions answer in this protocol's error shape."""
        handler = super().get_route_handler()
        body = type(self).error_body

        async def shaped_handler(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                return answer_error(request, exc, body)

        return shaped_handler


def activate(row: Sequence[float]) -> list[float]:
    """vLLM's and TEI's default activation: sigmoid of a lone logit, softmax of several."""
    if len(row) == 1:
        x = row[0]
        # 1 / (1 + e^-x), written so that neither branch overflows.
        if x >= 0:
            return [1.0 / (1.0 + math.exp(-x))]
        e = math.exp(x)
        return [e / (1.0 + e)]
    top = max(row)  # softmax is shift-invariant: subtracting the max avoids overflow
    exps = [math.exp(v - top) for v in row]
    total = sum(exps)
    return [e / total for e in exps]


def model_aliases(name: str) -> set[str]:
    """The names a request may give for the served model: its name or its folder's name."""
    aliases = {name}
    tail = PurePath(name.rstrip("/")).name
    if tail:
        aliases.add(tail)
    return aliases


def check_model(requested: str | None, served: str) -> None:
    """ModelNotFoundError (404) unless ``requested`` is None or names the served model."""
    if requested is None or requested in model_aliases(served):
        return
    valid = ", ".join(sorted(model_aliases(served)))
    raise ModelNotFoundError(f"The model `{requested}` does not exist. Valid aliases: {valid}.")


def truncated_header(truncated: Sequence[bool]) -> dict[str, str]:
    """The truncation header of an answer (per item: truncated by any model)."""
    return {TRUNCATED_HEADER: ",".join("1" if t else "0" for t in truncated)}


def protocol_error_bodies(*routers: APIRouter) -> dict[str, ErrorBody]:
    """The error shape of each path of ``routers`` (for answers given before routing)."""
    return {
        route.path: type(route).error_body
        for router in routers
        for route in router.routes
        if isinstance(route, ProtocolRoute)
    }
