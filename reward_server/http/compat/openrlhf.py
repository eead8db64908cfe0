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

from fastapi import APIRouter, Request, Response

from reward_server.http.auth import Authorized
from reward_server.http.compat import MASK_FILL, masked_header
from reward_server.http.errors import ERROR_DOCS
from reward_server.http.schemas import GetRewardRequest, GetRewardResponse
from reward_server.http.scoring import score
from reward_server.http.strict_json import StrictJSONRoute
from reward_server.scoring.items import PolicyTexts

__all__ = ["router"]

router = APIRouter(route_class=StrictJSONRoute)


@router.post("/get_reward", response_model=GetRewardResponse, responses=ERROR_DOCS)
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
