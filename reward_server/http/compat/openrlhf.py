"""OpenRLHF's remote reward model on this server: ``POST /get_reward``.

OpenRLHF (``--remote_rm_url``) sends the policy's complete texts as ``query``, rendered with
the policy's own chat template, and reads ``rewards`` (and ``scores``, ``extra_logs``). With
``--policy-tokenizer`` the server turns each text back into a conversation and renders it
with the reward model's template; without it the texts are scored as given.

OpenRLHF has no notion of a sample without a reward (its rewards become one tensor): a masked
item answers :data:`~reward_server.http.compat.MASK_FILL` (0.0) in ``rewards`` and
``scores``, 1.0 in ``extra_logs["masked"]`` (OpenRLHF logs the batch mean of every
``extra_logs`` key, so the share of masked samples shows in its logs), and the
``X-Reward-Masked`` header lists them.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from reward_server.http.auth import Authorized
from reward_server.http.compat import ANSWER_HEADERS, MASK_FILL, MASKED_HEADER, masked_header
from reward_server.http.errors import ERROR_DOCS
from reward_server.http.schemas import GetRewardRequest, GetRewardResponse
from reward_server.http.scoring import score
from reward_server.http.strict_json import StrictJSONRoute
from reward_server.scoring.items import PolicyTexts

__all__ = ["router"]

router = APIRouter(route_class=StrictJSONRoute)

#: /get_reward's answers: a success's header, the shared errors and its own 422 checks.
_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {"headers": {MASKED_HEADER: ANSWER_HEADERS[MASKED_HEADER]}},
    **ERROR_DOCS,
    422: {
        **ERROR_DOCS[422],
        "description": ERROR_DOCS[422]["description"] + "; and here: labels, or prompts, "
        "not one per query (invalid_request), with --policy-tokenizer a query not in the "
        "policy's chat template (policy_template)",
    },
}


@router.post("/get_reward", response_model=GetRewardResponse, responses=_ANSWERS)
async def get_reward(
    body: GetRewardRequest, request: Request, response: Response, _auth: Authorized
) -> GetRewardResponse:
    """OpenRLHF remote reward: score complete texts given as ``query`` (with --policy-tokenizer,
    their conversations recovered from the policy's chat template); with several models, their
    combined score."""
    texts = body.query
    if not texts:
        # OpenRLHF before 0.11.2 sends empty shards to all but one of several servers.
        return GetRewardResponse(rewards=[], scores=[], extra_logs={})
    prompts = tuple(body.prompts) if body.prompts else None  # an empty list: none
    labels = None if body.labels is None else tuple(body.labels)
    items = PolicyTexts(tuple(texts), prompts, labels)
    scored = await score(request, "/get_reward", items)
    response.headers.update(masked_header(scored))
    rewards = [MASK_FILL if s is None else s for s in scored.scores]
    return GetRewardResponse(
        rewards=rewards,
        scores=rewards,
        extra_logs={
            "tokens": [float(n) for n in scored.tokens],
            "truncated": [1.0 if t else 0.0 for t in scored.truncated],
            "masked": [0.0 if s is not None else 1.0 for s in scored.scores],
        },
    )
