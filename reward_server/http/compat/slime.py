"""slime's remote reward model on this server: ``POST /slime/reward``.

slime (``--rm-type remote_rm --rm-url http://HOST:PORT/slime/reward``) posts one sample at a
time as ``{"prompt": ..., "response": ..., "label": ...}`` and takes the JSON answer as the
sample's reward: here a number, the item's score (with several models, their combined
score). A string prompt is scored with the response as a query/response pair; a list of
chat messages as a conversation ending with the response as the assistant's turn. The
label travels with the item (verifiers and judges read it; reward models ignore it).
Which item was truncated comes in the ``X-Reward-Truncated`` header. slime sends no
``Authorization`` header: on a server with ``--api-key`` this route answers 401 like the
others.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from reward_server.http.auth import Authorized
from reward_server.http.compat import ANSWER_HEADERS, MASK_FILL, masked_header, truncated_header
from reward_server.http.errors import ERROR_DOCS
from reward_server.http.json_types import Text, one_of
from reward_server.http.schemas import Conversation, plain_conversation
from reward_server.http.scoring import score
from reward_server.http.strict_json import StrictJSONRoute
from reward_server.scoring.items import Conversations, Items, Pairs

__all__ = ["SlimeRewardRequest", "router"]

router = APIRouter(route_class=StrictJSONRoute, tags=["slime"])


class SlimeRewardRequest(BaseModel):
    """slime's ``remote_rm`` body: one sample (keys other than these three are ignored)."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {"prompt": "What is 3 + 4?", "response": "7", "label": "7"},
                {
                    "prompt": [{"role": "user", "content": "What is 3 + 4?"}],
                    "response": "7",
                    "label": "7",
                },
            ]
        },
    )

    prompt: one_of("a text or a list of messages", string=Text, list=Conversation) = Field(
        description="The prompt: a text, or the chat messages before the response."
    )
    response: Text = Field(description="The policy's response.")
    label: Any = Field(
        default=None,
        description="The sample's reference (any JSON value): read by verifiers and judges, "
        "ignored by reward models.",
    )

    def items(self) -> Items:
        """The sample as one item: a pair, or a conversation ending with the response."""
        labels = (self.label,) if "label" in self.model_fields_set else None
        if isinstance(self.prompt, str):
            return Pairs((self.prompt,), (self.response,), labels)
        conversation = plain_conversation(self.prompt)
        conversation.append({"role": "assistant", "content": self.response})
        return Conversations((conversation,), labels)


@router.post(
    "/slime/reward",
    response_model=float,
    responses={200: {"headers": ANSWER_HEADERS}, **ERROR_DOCS},
)
async def slime_reward(
    body: SlimeRewardRequest,
    request: Request,
    response: Response,
    _auth: Authorized,
) -> float:
    """slime's remote reward: the sample's score as a bare JSON number (with several models,
    their combined score)."""
    scored = await score(request, "/slime/reward", body.items())
    response.headers.update(truncated_header(scored.truncated))
    response.headers.update(masked_header(scored))
    (only,) = scored.scores
    return MASK_FILL if only is None else only
