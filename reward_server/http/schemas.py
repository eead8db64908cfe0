"""Request and response bodies of the HTTP API (validation lives here, in pydantic)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, model_validator

from reward_server.http.json_types import Integer, Number, StrList, Text, one_of
from reward_server.scoring.groups import check_groups


class TextPart(BaseModel):
    """One text part of a message's content (parts of other types are refused: this server
    scores text)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text"]
    text: Text


class FunctionCall(BaseModel):
    """The function a tool call names and its arguments."""

    model_config = ConfigDict(extra="allow")

    name: Text = Field(min_length=1, examples=["get_weather"])
    arguments: one_of("a JSON string or an object", string=Text, object=dict[str, Any]) = Field(
        default="{}",
        description="The arguments: a JSON string (as OpenAI sends them) or an object.",
        examples=['{"city": "Paris"}'],
    )


class ToolCall(BaseModel):
    """One tool call of an assistant message (OpenAI's shape)."""

    model_config = ConfigDict(extra="allow")

    id: Text | None = Field(default=None, examples=["call_1"])
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionSpec(BaseModel):
    """A function the model may call: its name, description and JSON-schema parameters."""

    model_config = ConfigDict(extra="allow")

    name: Text = Field(min_length=1, examples=["get_weather"])
    description: Text | None = None
    parameters: dict[str, Any] | None = Field(
        default=None, description="The arguments' JSON schema (an object schema)."
    )


class Tool(BaseModel):
    """A tool the conversation offered: OpenAI's chat function spec, or the flat form
    (``{"name", "description", "parameters"}``: the Responses API's, many datasets'), which is
    given to the chat template in the chat form."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: FunctionSpec

    @model_validator(mode="before")
    @classmethod
    def _chat_form(cls, value: Any) -> Any:
        if isinstance(value, dict) and "function" not in value and "name" in value:
            spec = {k: v for k, v in value.items() if k != "type"}
            return {"type": "function", "function": spec}
        return value


class Message(BaseModel):
    """One chat message in OpenAI's shape. Every key reaches the reward model's chat template
    (keys not listed here as they are); a template that cannot render tool calls, tool
    results or tools is a 422 naming the model (see the agents guide)."""

    model_config = ConfigDict(
        extra="allow",
        # _fits_role's rules: content only an assistant may leave out, tool_calls only an
        # assistant may make.
        json_schema_extra={
            "if": {"required": ["role"], "properties": {"role": {"const": "assistant"}}},
            "else": {
                "required": ["content"],
                "properties": {
                    "content": {"not": {"type": "null"}},
                    "tool_calls": {"type": "null"},
                },
            },
        },
    )

    role: Text = Field(min_length=1, examples=["user"])
    content: (
        one_of("a string, null or a list of text parts", string=Text, list=list[TextPart]) | None
    ) = Field(
        default=None,
        description="The text, or a list of text parts (joined); null or absent only for an "
        "assistant message (one that only calls tools).",
        examples=["hello"],
    )
    name: Text | None = Field(default=None, description="A tool result: the tool's name.")
    tool_calls: list[ToolCall] | None = Field(
        default=None, description="An assistant message: the tools it calls."
    )
    tool_call_id: Text | None = Field(
        default=None, description="A tool result (role tool): the call it answers."
    )
    reasoning_content: Text | None = Field(
        default=None,
        description="An assistant message: its thinking (removed before scoring unless the "
        "model's entry says reasoning: keep).",
    )

    @model_validator(mode="after")
    def _fits_role(self) -> Message:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"content is required for a {self.role} message")
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("tool_calls: only an assistant message calls tools")
        return self

    def plain(self) -> dict[str, Any]:
        """The message as plain data for the scoring core: text parts joined, unset keys
        left out, other keys as sent."""
        out = self.model_dump(exclude_none=True)
        out["role"] = self.role
        if isinstance(self.content, list):
            out["content"] = "".join(part.text for part in self.content)
        else:
            out["content"] = self.content
        return out


Conversation = Annotated[list[Message], Field(min_length=1)]
Tools = Annotated[
    list[Tool],
    Field(description="The tools offered (OpenAI function specs), given to the chat template."),
]


class ConversationItem(BaseModel):
    """A conversation with its own tools (the shape of an OpenAI chat request)."""

    model_config = ConfigDict(extra="forbid")

    messages: Conversation
    tools: Tools | None = None


def trajectory_prompt(messages: list[Message]) -> list[Message]:
    """The prompt a conversation's response answers: its messages up to the last user or
    system message before the response (an agent's own calls and their results after it are
    part of its trajectory, not of the prompt a GRPO group shares)."""
    before = messages[:-1]
    last = max((i for i, m in enumerate(before) if m.role in ("user", "system")), default=-1)
    return before[: last + 1]


def plain_conversation(conversation: list[Message]) -> list[dict[str, Any]]:
    """A conversation as plain data (:meth:`Message.plain` of each message)."""
    return [message.plain() for message in conversation]


def plain_tools(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    """Tools as plain data (None for none)."""
    return None if not tools else [tool.model_dump(exclude_none=True) for tool in tools]


def labels_field(per: str) -> Any:
    """The optional ``labels`` field: one reference per ``per``."""
    return Field(
        default=None,
        description=f"One reference per {per}, any JSON value (a reference answer, test "
        "cases, a rubric variable): read by verifiers and judges, ignored by reward models.",
    )


def check_labels(labels: list[Any] | None, count: int, what: str) -> None:
    """ValueError (422) unless ``labels`` is absent or holds one label per item."""
    if labels is not None and len(labels) != count:
        raise ValueError(
            f"labels must hold one label per item: {len(labels)} labels for {count} {what}"
        )


_NULL = {"type": "null"}
_INPUT_FIELDS = ("texts", "queries", "responses", "conversations")


def _only(*given: str, **more: Any) -> dict[str, Any]:
    """JSON Schema of a request giving the input fields ``given`` and no other (null is not
    given), its other properties constrained by ``more``."""
    fields = {name: {"type": "array"} if name in given else _NULL for name in _INPUT_FIELDS}
    return {"required": list(given), "properties": {**fields, **more}}


class ScoreRequest(BaseModel):
    """Exactly one input form: texts, queries + responses, or conversations; tools and
    groups need turns (not texts).

    Checked beyond this schema (a 422 invalid_request each): queries and responses of
    equal length; labels, when given, one per item; groups a partition of some items (each
    index below the item count, in one group at most) whose prompts are equal."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            # _exactly_one_form's rules that JSON Schema states.
            "oneOf": [
                _only("texts", tools={"anyOf": [_NULL, {"maxItems": 0}]}, groups=_NULL),
                _only("queries", "responses"),
                _only("conversations"),
            ],
            "examples": [
                {"texts": ["a complete text scored as given"]},
                {"queries": ["Say hi."], "responses": ["Hello!"]},
                {
                    "conversations": [
                        [
                            {"role": "user", "content": "Say hi."},
                            {"role": "assistant", "content": "Hello!"},
                        ]
                    ]
                },
            ],
        },
    )

    texts: StrList | None = Field(default=None, description="Complete texts, scored as given.")
    queries: StrList | None = Field(
        default=None, description="Prompts; rendered with the matching responses."
    )
    responses: StrList | None = Field(default=None, description="Completions, one per query.")
    conversations: (
        Annotated[
            list[
                one_of(
                    "a list of messages or a {messages, tools} object",
                    list=Conversation,
                    object=ConversationItem,
                )
            ],
            Field(min_length=1),
        ]
        | None
    ) = Field(
        default=None,
        description="Chat conversations rendered with the reward chat template: lists of "
        "OpenAI chat messages, or {messages, tools} objects (a conversation with its own "
        "tools). The last message is the response.",
    )
    tools: Tools | None = Field(
        default=None,
        description="Tools (OpenAI function specs) offered in every conversation or pair that "
        "has none of its own; given to the chat template.",
    )
    truncate: StrictBool | None = Field(
        default=None,
        description="Truncate over-long texts (true) or reject them with 413 (false); "
        "default: the server's setting.",
    )
    model: StrictStr | None = Field(
        default=None,
        description="Score with this one of the server's models alone (its name in /info's "
        "models); default: every model, combined.",
    )
    components: StrictBool = Field(
        default=False,
        description="Return each model's own score (always returned when several score).",
    )
    labels: list[Any] | None = labels_field("item")
    groups: list[list[Integer]] | None = Field(
        default=None,
        description="Which items form a group (GRPO's responses to one prompt): lists of "
        "item indices. An item is in at most one group; a group's items share their prompt "
        "(queries+responses or conversations only; a conversation's prompt is its messages up "
        "to the last user or system message, so agent trajectories group by the task they "
        "answer); items in none are groups of one. Read by "
        "pairwise judges and by models with normalize: group or group_rank.",
        examples=[[[0, 1, 2, 3], [4, 5, 6, 7]]],
        # check_groups' rules that JSON Schema states (its messages stay the server's).
        json_schema_extra={"items": {"minItems": 1, "uniqueItems": True, "items": {"minimum": 0}}},
    )
    timeout_ms: Annotated[Number, Field(gt=0, allow_inf_nan=False)] | None = Field(
        default=None,
        description="The request's deadline: milliseconds the client still waits (as the "
        "X-Request-Timeout-Ms header, for clients that cannot set headers; this wins over "
        "it). At the deadline the answer is sent with every unfinished item masked (null "
        "in scores, reason deadline); default: the server's --request-timeout-s, at most "
        "its --max-request-timeout-s.",
    )
    cache: StrictBool = Field(
        default=True,
        description="Use the score cache: an item whose exact token ids the same model "
        "scored before is answered with that score (equal to a fresh one), and identical "
        "items are scored once. false scores every item afresh and leaves the cache as it "
        "is. No effect on verifiers, remote models, sampling judges, or with "
        "--score-cache-size 0.",
    )

    @model_validator(mode="after")
    def _exactly_one_form(self) -> ScoreRequest:
        if (self.queries is None) != (self.responses is None):
            raise ValueError("queries and responses must be given together")
        forms = [
            name
            for name, value in (
                ("texts", self.texts),
                ("queries+responses", self.queries),
                ("conversations", self.conversations),
            )
            if value is not None
        ]
        if len(forms) != 1:
            got = " and ".join(forms) if forms else "none"
            raise ValueError(
                f"give exactly one of texts, queries+responses or conversations (got {got})"
            )
        if (
            self.queries is not None
            and self.responses is not None
            and len(self.queries) != len(self.responses)
        ):
            raise ValueError(
                f"queries and responses differ in length "
                f"({len(self.queries)} != {len(self.responses)})"
            )
        check_labels(self.labels, self.num_items, "items")
        if self.tools and self.texts is not None:
            raise ValueError("tools need turns: send queries+responses or conversations")
        if self.groups is not None:
            self._groups_fit()
        return self

    def _groups_fit(self) -> None:
        """ValueError (422) unless the groups are a partition of some items sharing prompts."""
        assert self.groups is not None
        check_groups(self.groups, self.num_items)
        if self.texts is not None:
            raise ValueError(
                "groups need prompts: send queries+responses or conversations (a text has no "
                "prompt to group by)"
            )
        prompts: list[Any] = list(self.queries or [])
        if self.conversations is not None:
            prompts = [
                [m.model_dump() for m in trajectory_prompt(messages)]
                for messages in self.conversation_messages()
            ]
        for g, group in enumerate(self.groups):
            first = prompts[group[0]]
            for index in group[1:]:
                if prompts[index] != first:
                    raise ValueError(
                        f"groups[{g}]: item {index}'s prompt differs from item {group[0]}'s "
                        "(a group's items share their prompt)"
                    )

    def conversation_messages(self) -> list[list[Message]]:
        """Each conversation's messages (of a bare list or a {messages, tools} object)."""
        return [
            item.messages if isinstance(item, ConversationItem) else item
            for item in self.conversations or []
        ]

    def item_tools(self) -> list[list[dict[str, Any]] | None]:
        """Each item's tools as plain data: its own, else the request's (None: no tools)."""
        shared = plain_tools(self.tools)
        own = [
            item.tools if isinstance(item, ConversationItem) else None
            for item in self.conversations or []
        ]
        if not own:
            own = [None] * self.num_items
        return [shared if tools is None else plain_tools(tools) for tools in own]

    @property
    def num_items(self) -> int:
        """How many items the request scores."""
        for value in (self.texts, self.queries, self.conversations):
            if value is not None:
                return len(value)
        return 0


class CriterionVerdict(BaseModel):
    """A rubric judge's verdict on one criterion of one item."""

    verdict: bool = Field(
        description="Whether the judge said yes (probability at least the entry's "
        "verdict_threshold); for a pitfall (negative weight), yes means it was committed."
    )
    probability: float = Field(description="The judge's probability of yes (1 or 0 generated).")
    weight: float = Field(description="The criterion's weight (its own, or its category's).")
    category: str | None = Field(description="Its category, null when given by weight alone.")
    required: bool = Field(description="Whether failing it gives the rubric's minimum score.")


#: ScoreResponse.criteria's description.
_CRITERIA = (
    "Per rubric judge (mode: rubric, aggregation: explicit): each item's criteria in its "
    "rubric's order, each with the judge's verdict and probability of yes, its weight, "
    "category and whether it is required (null for an item that failed: its reason is in "
    "verifier_errors)."
)


class ScoreResponse(BaseModel):
    """Scores in request order, with the tokens scored and truncation per item; the
    breakdown fields are left out when they do not apply."""

    scores: list[float | None] = Field(
        description="Raw logit of the configured label, per item; with several models their "
        "combined score (the models file's aggregate). null: the item is masked, its reward "
        "could not be computed (the reason is in masked); a trainer leaves it out."
    )
    tokens: list[int] = Field(
        description="Tokens actually scored, per item (the most of any model)."
    )
    truncated: list[bool] = Field(description="Whether any model truncated the item.")
    model: str = Field(
        description="Name of the reward model (and adapter) that scored; several: 'a+b'."
    )
    components: dict[str, list[float | None]] | None = Field(
        default=None,
        description="Each model's own score per item, by name (several models, or asked "
        "for); null where that model masked the item.",
    )
    objectives: dict[str, list[float | None]] | None = Field(
        default=None,
        description="Every label's raw logit of each model with several labels, by label name "
        "('model/label' when several models score).",
    )
    step_scores: list[list[float]] | None = Field(
        default=None, description="Process reward model: the score of each step, per item."
    )
    step_ends: list[list[int]] | None = Field(
        default=None,
        description="Process reward model: where each step ends in the response (character "
        "offsets, exclusive), per item.",
    )
    steps_dropped: list[int] | None = Field(
        default=None, description="Process reward model: steps cut off by truncation, per item."
    )
    outcome_scores: list[float | None] | None = Field(
        default=None,
        description="The sequence models' combined score, when a process model scored too.",
    )
    masked: list[str | None] | None = Field(
        default=None,
        description="Present when some item is masked (null in scores): per item why "
        "(timeout, crash, error, non_finite, bad_result, sandbox_error, parse_failure, "
        "remote_error, deadline, no_opponent (a pairwise judge's item alone in its group), "
        "or a remote reward server's own reason), null where it is not. With several models: the reason of the first model with a non-zero weight "
        "that masked it.",
    )
    verifier_errors: dict[str, list[str | None]] | None = Field(
        default=None,
        description="Per verifier, judge or remote that failed on any item: each item's "
        "reason (as in masked; null where it did not fail). Such an item is masked, or "
        "scores the entry's on_error when that is a number.",
    )
    tests: dict[str, list[list[str] | None]] | None = Field(
        default=None,
        description="Per code verifier (verifier: code): each item's test verdicts in its "
        "label's order: passed, wrong_answer, timeout, runtime_error, compile_error, "
        "memory_exceeded, output_exceeded, sandbox_error or skipped (null for an item "
        "whose label held no usable tests). The tests passed and their number are in "
        "objectives as passed and total ('model/passed' when several models score).",
    )
    criteria: dict[str, list[list[CriterionVerdict] | None]] | None = Field(
        default=None, description=_CRITERIA
    )


class GetRewardRequest(BaseModel):
    """OpenRLHF remote reward request: ``query`` holds complete texts.

    Checked beyond this schema (a 422 invalid_request each): labels, when given, one per
    query; prompts one per query, or none."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={"examples": [{"query": ["prompt and response as one text"]}]},
    )

    query: list[Text] = Field(
        description="Complete texts (prompt + response), scored as given; an empty list "
        "gets empty answers (OpenRLHF sends those to all but one of several servers)."
    )
    prompts: list[StrictStr] | None = Field(
        default=None,
        description="The policy-templated prompt of each query (one per query, or none: an "
        "empty list): with --policy-tokenizer it marks where the response begins; ignored "
        "otherwise.",
    )
    labels: list[Any] | None = labels_field("query (OpenRLHF's labels)")

    @model_validator(mode="after")
    def _labels_fit(self) -> GetRewardRequest:
        check_labels(self.labels, len(self.query), "queries")
        if self.prompts and len(self.prompts) != len(self.query):
            raise ValueError(
                f"{len(self.prompts)} prompts for {len(self.query)} queries: send one prompt "
                "per query or none"
            )
        return self


class GetRewardResponse(BaseModel):
    """OpenRLHF remote reward answer; ``rewards`` equals ``scores``."""

    rewards: list[float]
    scores: list[float]
    extra_logs: dict[str, list[float]] = Field(
        description="Per-item values OpenRLHF logs: tokens, truncated (0/1) and masked (1: no "
        "reward could be computed; its rewards entry is then 0.0)."
    )


class ModelInfo(BaseModel):
    """One served model: its entry of the models file and what its engine says of it."""

    model_config = ConfigDict(extra="allow")

    name: str
    kind: str = Field(description="sequence, process, verifier or judge.")
    weight: float
    model: str | None = Field(default=None, description="The model loaded; none for a verifier.")
    labels: list[str] = Field(description="Names of the head's labels that are read.")
    objectives: dict[str, float] | None = None
    normalize: dict[str, float] | str | None = None


class InfoResponse(BaseModel):
    """What is served and with which limits. The top-level model fields describe the first
    reward model (null when only verifiers are served)."""

    model: str | None = None
    adapter: str | None = None
    architecture: str | None = None
    num_labels: int | None = None
    label_index: int | None = None
    max_length: int | None = None
    truncation_side: str | None = None
    dtype: str | None = None
    device: str | None = None
    chat_template: bool | None = None
    truncate: bool = Field(description="Default truncation of over-long texts.")
    max_batch_tokens: int | None = None
    max_batch_size: int
    max_wait_ms: float
    max_client_batch: int
    max_queue: int
    max_body_bytes: int
    auth: bool = Field(description="Whether /score, /get_reward and /info need a bearer key.")
    policy_tokenizer: str | None = Field(
        default=None,
        description="The policy tokenizer whose chat template /get_reward undoes, if any.",
    )
    engine: str = Field(default="transformers", description="What runs the model (--engine).")
    engine_settings: dict[str, Any] | None = Field(
        default=None,
        description="The engine's own settings (vLLM: tensor parallel size, memory share, "
        "prefix cache, extra engine arguments); none for the transformers engine.",
    )
    models: list[ModelInfo] = Field(
        default_factory=list, description="Every served model (one for a plain --model)."
    )
    aggregate: str = Field(
        default="weighted_sum", description="How the models' scores combine (models file)."
    )
    version: str


class HealthResponse(BaseModel):
    """Readiness of the server."""

    status: str = Field(examples=["ok"])


class ErrorResponse(BaseModel):
    """Every error answer: a readable message and a machine-readable kind."""

    error: str
    type: str
