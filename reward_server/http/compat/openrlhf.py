"""OpenRLHF's remote reward model on this server: ``POST /get_reward``.

OpenRLHF (``--remote_rm_url``) sends the policy's complete texts as ``query``, rendered with
the policy's own chat template, and reads ``rewards`` (and ``scores``, ``extra_logs``). With
``--policy-tokenizer`` the server turns each text back into a conversation and renders it
with the reward model's template; without it the texts are scored as given.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from reward_server.http.auth import Authorized
from reward_server.http.errors import ERROR_DOCS
from reward_server.http.schemas import GetRewardRequest, GetRewardResponse
from reward_server.http.scoring import score
from reward_server.http.strict_json import StrictJSONRoute
from reward_server.scoring.items import PolicyTexts

__all__ = ["router"]

router = APIRouter(route_class=StrictJSONRoute)


@router.post("/get_reward", response_model=GetRewardResponse, responses=ERROR_DOCS)
async def get_reward(
    body: GetRewardRequest, request: Request, _auth: Authorized
) -> GetRewardResponse:
    """OpenRLHF remote reward: score complete texts given as ``query`` (with --policy-tokenizer,
    their conversations recovered from the policy's chat template); with several models, their
    combined score."""
    texts = body.query
    if not texts:
        # OpenRLHF before 0.11.2 sends empty shards to all but one of several servers.
        return GetRewardResponse(rewards=[], scores=[], extra_logs={})
    prompts = None if body.prompts is None else tuple(body.prompts)
    labels = None if body.labels is None else tuple(body.labels)
    items = PolicyTexts(tuple(texts), prompts, labels)
    scored = await score(request, "/get_reward", items)
    return GetRewardResponse(
        rewards=scored.scores,
        scores=scored.scores,
        extra_logs={
            "tokens": [float(n) for n in scored.tokens],
            "truncated": [1.0 if t else 0.0 for t in scored.truncated],
        },
    )
