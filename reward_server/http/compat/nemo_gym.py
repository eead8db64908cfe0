"""NeMo Gym's resources-server contract on this server: ``POST /verify`` (and the no-op
``POST /seed_session`` that NeMo Gym's ``simple_agent`` calls before every rollout).

NeMo Gym (NVIDIA-NeMo/Gym, ``nemo_gym/base_resources_server.py``) verifies a finished
rollout with one request: ``responses_create_params`` (the Responses-API request the policy
was given: ``input``, ``instructions``, ``tools``), ``response`` (the policy's Responses-API
response: its ``output`` items) and the dataset row's own columns as extra top-level fields
(``expected_answer``, ...). The answer is the request as it came, plus ``reward`` and the
newer contract's ``mask_sample``, ``failure_kind`` and ``failure_reason``. One item per
request, as NeMo Gym sends them.

The rollout becomes one OpenAI chat conversation (:func:`chat_of`), the way NeMo Gym's own
``nemo_gym/responses_converter.py`` turns Responses items into chat messages:

* ``instructions`` and the leading system (or developer) messages become one system
  message, joined by blank lines; a ``developer`` message is a ``system`` one;
* ``message`` items become messages, their text parts (``input_text``, ``output_text``,
  ``refusal``) joined; parts of other types (images, files, audio) are a 422: this server
  scores text;
* consecutive assistant items (``reasoning``, assistant ``message``, ``function_call``) form
  one assistant turn: ``function_call`` items its ``tool_calls`` (``call_id`` as ``id``,
  ``arguments`` as sent), ``reasoning`` items its ``reasoning_content`` (the ``reasoning_text``
  content when there is one, else the summary texts; several joined by blank lines), its
  messages' texts its ``content`` (None for a turn that only calls tools);
* ``function_call_output`` items become ``tool`` messages (``tool_call_id``, and ``name`` when
  the call is in the rollout);
* the Responses-API function ``tools`` become OpenAI function specs (``strict`` dropped).

Any other item or tool type (web search, computer use, MCP, ...) is a 422 naming it: it has
no chat-message form. The response is the assistant turn made of ``response.output`` (the
input's own assistant items end before it: the policy answered a finished prompt); when
the output does not end with one (it is empty, or an agent stopped after a tool result), an
empty assistant turn ends the conversation: the policy gave no final answer.

The label (:func:`label_of`) comes from the row's own fields, as NeMo Gym's datasets name
them: ``expected_answer`` when the row has it (their usual column for a reference answer,
which the ``math``, ``exact`` and ``regex`` verifiers read); else the row's only
``expected_*`` field (``expected_call``, ``expected_action``, ``expected_answers``: the
expected tool calls, as the ``tool_call`` verifier reads them); else all of the row's
fields as one object (for a python verifier or a grader), None when there are none. NeMo
Gym's bookkeeping (``agent_ref``, ``instance_config``, ``_ng_*`` keys) and the fields this
route answers are never part of it.

A masked item (no reward could be computed) answers ``reward`` 0.0 with ``mask_sample``
true, also as ``instance_config.mask_sample`` (where NeMo RL's GRPO reads the flag), and
:data:`FAILURE_KINDS` maps its reason to NeMo Gym's shared ``failure_kind`` vocabulary
(``failure_reason`` says it in words). An item a model failed on but scored with its
``on_error`` number stays unmasked and names the failure the same way. With several models,
``components`` holds each model's own score (not NeMo Gym's ``reward_components``: NeMo RL
requires those to sum to ``reward``, and a composite's weights and normalisation do not).
NeMo Gym sends no ``Authorization`` header: on a server with ``--api-key`` these routes
answer 401 like the others.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from reward_server.errors import field_path
from reward_server.http.auth import Authorized
from reward_server.http.compat import ANSWER_HEADERS, MASK_FILL, masked_header, truncated_header
from reward_server.http.compat.responses_schema import INPUT, ITEM, TOOL
from reward_server.http.errors import ERROR_DOCS
from reward_server.http.scoring import score
from reward_server.http.strict_json import StrictJSONRoute
from reward_server.scoring.items import Conversations
from reward_server.scoring.scored import Scored

__all__ = [
    "FAILURE_KINDS",
    "NemoGymVerifyRequest",
    "NemoGymVerifyResponse",
    "chat_of",
    "label_of",
    "router",
    "verify_answer",
]

router = APIRouter(route_class=StrictJSONRoute, tags=["NeMo Gym"])

#: Our reasons for a failed item, as NeMo Gym's ``failure_kind`` (its shared vocabulary,
#: ``nemo_gym/failure_kinds.py``; ``reward_server:<reason>`` where it has no name for one).
#: A masked item's reason not listed here (a remote reward server's own) is
#: ``verifier_error``.
FAILURE_KINDS: dict[str, str] = {
    "timeout": "verifier_error",
    "crash": "verifier_error",
    "error": "verifier_error",
    "non_finite": "verifier_error",
    "bad_result": "verifier_error",
    "sandbox_error": "verifier_error",
    "parse_failure": "judge_unparseable",
    "remote_error": "judge_failed",
    "deadline": "reward_server:deadline",
    "no_opponent": "reward_server:no_opponent",
    "unclosed_reasoning": "reward_server:unclosed_reasoning",
}

#: The keys this route answers: a request's own values of them are replaced (a row
#: verified again carries the last answer's). ``reward_components`` goes: it would
#: contradict the new reward.
_ANSWER_KEYS = frozenset(
    {
        "reward",
        "mask_sample",
        "failure_kind",
        "failure_reason",
        "components",
        "verifier_errors",
        "reward_components",
    }
)
#: What a request carries besides the row's own fields (never part of the label): the agent
#: that ran the rollout, an agent's per-rollout settings; keys beginning with ``_ng_`` are
#: NeMo Gym's indices and ids.
_BOOKKEEPING = frozenset({"agent_ref", "instance_config"})
#: The label column NeMo Gym's datasets use for a reference answer, and the prefix of the
#: columns they use for other expected outcomes (a tool call, an action, a list of calls).
_ANSWER_COLUMN = "expected_answer"
_EXPECTED_PREFIX = "expected_"
#: Text parts of a message's content, and the key holding each one's text.
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}


# --- the rollout as a chat conversation ------------------------------------------------


def _check_unicode(body: Any) -> None:
    """ValueError naming the first string of ``body`` (a value or a key) that is not valid
    Unicode: a JSON escape of a lone surrogate, which no tokenizer encodes and no answer
    could echo."""
    stack: list[tuple[Any, tuple[int | str, ...]]] = [(body, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, dict):
            for key, value in node.items():
                _encodable(str(key), f"{field_path(path) or 'the body'}: the key {key!r}")
                stack.append((value, (*path, str(key))))
        elif isinstance(node, list):
            stack.extend((v, (*path, i)) for i, v in enumerate(node))
        elif isinstance(node, str):
            _encodable(node, field_path(path))


def _encodable(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{where}: invalid Unicode: lone surrogate {text[exc.start]!r} at character {exc.start}"
        ) from None


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"{where}.content: expected a string or a list of content parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        key = _TEXT_PARTS.get(str(kind))
        if key is None or not isinstance(part.get(key), str):
            raise ValueError(
                f"{where}.content[{j}]: {kind!r} parts are not text; this server scores text "
                f"({', '.join(sorted(_TEXT_PARTS))} parts)"
            )
        texts.append(part[key])
    return "".join(texts)


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """A reasoning item's thinking: its reasoning_text content, else its summary texts."""
    found = []
    for key in ("content", "summary"):
        parts = item.get(key)
        if parts is not None and not isinstance(parts, list):
            raise ValueError(f"{where}.{key}: expected a list of parts")
        for j, part in enumerate(parts or []):
            text = part.get("text") if isinstance(part, dict) else None
            if not isinstance(part, dict) or not isinstance(text, str | None):
                raise ValueError(f"{where}.{key}[{j}]: expected a part {{text: a string}}")
            if text:
                found.append(text)
        if found:
            return "\n\n".join(found)
    return ""


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}.{key}: expected a non-empty string")
    return value


def _arguments(item: dict[str, Any], where: str) -> str | dict[str, Any]:
    """A call's arguments as sent: a JSON string (the Responses API's), or an object."""
    value = item.get("arguments")
    if not isinstance(value, str | dict):
        raise ValueError(f"{where}.arguments: expected a JSON string")
    return value


@dataclass
class _Turns:
    """The conversation as it is built: messages, and the assistant turn being gathered."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # call_id -> the function's name
    started: bool = False
    texts: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    thoughts: list[str] = field(default_factory=list)

    def flush(self) -> None:
        """End the assistant turn being gathered (if any) as one message."""
        if not self.started:
            return
        content = "".join(self.texts) if self.texts else (None if self.calls else "")
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if self.calls:
            message["tool_calls"] = self.calls
        if self.thoughts:
            message["reasoning_content"] = "\n\n".join(self.thoughts)
        self.messages.append(message)
        self.started, self.texts, self.calls, self.thoughts = False, [], [], []

    def add(self, message: dict[str, Any]) -> None:
        """A message that is not the assistant's: it ends the assistant turn."""
        self.flush()
        self.messages.append(message)

    def call(self, call_id: str, name: str, arguments: Any) -> None:
        """A tool call of the assistant turn."""
        self.started = True
        self.names[call_id] = name
        function = {"name": name, "arguments": arguments}
        self.calls.append({"id": call_id, "type": "function", "function": function})

    def result(self, call_id: str, content: str) -> None:
        """A tool's result, answering ``call_id``."""
        message: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "content": content}
        if call_id in self.names:
            message["name"] = self.names[call_id]
        self.add(message)


def _message(turns: _Turns, item: dict[str, Any], where: str) -> None:
    """A ``message`` item (or a chat-shaped message: role ``tool``, inline ``tool_calls``)."""
    role = item.get("role")
    if role == "tool":
        turns.result(_string(item, "tool_call_id", where), _text(item.get("content"), where))
        return
    if role not in _ROLES:
        raise ValueError(f"{where}.role: {role!r} is not user, system, developer or assistant")
    if role != "assistant":
        turns.add({"role": _ROLES[role], "content": _text(item.get("content"), where)})
        return
    turns.started = True
    if item.get("content") is not None:
        turns.texts.append(_text(item["content"], where))
    calls = item.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise ValueError(f"{where}.tool_calls: expected a list of calls")
    for j, call in enumerate(calls or []):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise ValueError(f"{where}.tool_calls[{j}]: expected {{id, function: {{name, ...}}}}")
        at = f"{where}.tool_calls[{j}]"
        turns.call(_string(call, "id", at), _string(function, "name", at), _arguments(function, at))


def _function_call_output(turns: _Turns, item: dict[str, Any], where: str) -> None:
    """A tool's result: its output, a string or a list of text parts."""
    output = item.get("output")
    text = output if isinstance(output, str) else _text(output, f"{where}.output")
    turns.result(_string(item, "call_id", where), text)


def _item(turns: _Turns, item: Any, where: str) -> None:
    """Add one Responses-API item to the conversation."""
    if not isinstance(item, dict):
        raise ValueError(f"{where}: expected an object (a Responses-API item)")
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        _message(turns, item, where)
    elif kind == "function_call":
        name = _string(item, "name", where)
        turns.call(_string(item, "call_id", where), name, _arguments(item, where))
    elif kind == "function_call_output":
        _function_call_output(turns, item, where)
    elif kind == "reasoning":
        turns.started = True
        thought = _reasoning_text(item, where)
        if thought:
            turns.thoughts.append(thought)
    else:
        raise ValueError(
            f"{where}: {kind!r} items have no chat-message form (this route reads message, "
            "function_call, function_call_output and reasoning items)"
        )


def _with_instructions(messages: list[dict[str, Any]], instructions: str) -> None:
    """``instructions`` and the leading system messages folded into one system message."""
    parts = [instructions]
    while messages and messages[0]["role"] == "system":
        parts.append(messages.pop(0)["content"])
    messages.insert(0, {"role": "system", "content": "\n\n".join(parts)})


def _tools(tools: list[Any]) -> list[dict[str, Any]] | None:
    """Responses-API function tools as OpenAI function specs (None for none)."""
    specs = []
    for i, tool in enumerate(tools):
        where = f"responses_create_params.tools[{i}]"
        kind = tool.get("type", "function") if isinstance(tool, dict) else None
        if kind != "function":
            raise ValueError(
                f"{where}: {kind!r} tools have no chat-template form (this route reads "
                "function tools)"
            )
        given = tool["function"] if isinstance(tool.get("function"), dict) else tool  # chat's
        function = {"name": _string(given, "name", where)}
        function.update({k: given[k] for k in ("description", "parameters") if given.get(k)})
        specs.append({"type": "function", "function": function})
    return specs or None


def chat_of(
    params: dict[str, Any], response: dict[str, Any]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The rollout (``responses_create_params`` and ``response`` as plain data) as one chat
    conversation ending with the response's assistant turn, and its tools (see the module's
    docstring); ValueError naming the item that has no chat form."""
    turns = _Turns()
    given = params.get("input")
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given
    for i, item in enumerate(items or []):
        _item(turns, item, f"responses_create_params.input[{i}]")
    turns.flush()  # the prompt's last turn never merges with the response's first
    prompt = len(turns.messages)
    for i, item in enumerate(response.get("output") or []):
        _item(turns, item, f"response.output[{i}]")
    turns.flush()
    messages = turns.messages
    if len(messages) == prompt or messages[-1]["role"] != "assistant":
        messages.append({"role": "assistant", "content": ""})
    if params.get("instructions"):
        _with_instructions(messages, str(params["instructions"]))
    return messages, _tools(params.get("tools") or [])


def label_of(row: dict[str, Any]) -> Any:
    """The label a rollout is verified against, from its row's fields (the request's fields
    other than ``responses_create_params`` and ``response``, NeMo Gym's bookkeeping and this
    route's answer fields left out): ``expected_answer`` when the row has it, else its only
    ``expected_*`` field (``expected_call``, ``expected_action``, ``expected_answers``), else
    the row's fields as one object (None when there are none)."""
    if _ANSWER_COLUMN in row:
        return row[_ANSWER_COLUMN]
    own = {
        key: value
        for key, value in row.items()
        if key not in _BOOKKEEPING and key not in _ANSWER_KEYS and not key.startswith("_ng_")
    }
    expected = [key for key in own if key.startswith(_EXPECTED_PREFIX)]
    if len(expected) == 1:
        return own[expected[0]]
    return own or None


# --- bodies ----------------------------------------------------------------------------


class ResponsesCreateParams(BaseModel):
    """The Responses-API request the policy was given (keys other than these are kept in
    the answer and otherwise ignored)."""

    model_config = ConfigDict(extra="allow")

    input: str | list[dict[str, Any]] = Field(
        description="The prompt: a text (one user message), or Responses-API input items "
        "(message, function_call, function_call_output, reasoning).",
        json_schema_extra=INPUT,
    )
    instructions: str | None = Field(
        default=None, description="A system message in front of the input."
    )
    tools: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Responses-API function tools ({type: function, name, description, "
        "parameters}), given to the chat template as OpenAI function specs.",
        json_schema_extra={"items": TOOL},
    )


class ResponsesResponse(BaseModel):
    """The policy's Responses-API response (keys other than ``output`` are kept in the
    answer and otherwise ignored)."""

    model_config = ConfigDict(extra="allow")

    output: list[dict[str, Any]] = Field(
        description="The response's items in order: message, function_call, "
        "function_call_output, reasoning.",
        json_schema_extra={"items": ITEM},
    )


_EXAMPLE = {
    "responses_create_params": {
        "input": [{"role": "user", "content": "What is 3 + 4? Put the answer in \\boxed{}."}]
    },
    "response": {
        "output": [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "\\boxed{7}", "annotations": []}],
            }
        ]
    },
    "expected_answer": "7",
}


class NemoGymVerifyRequest(BaseModel):
    """NeMo Gym's ``BaseVerifyRequest``: one finished rollout, and its dataset row's own
    fields as extra keys (the label: ``expected_answer``, else the only ``expected_*``
    field, else those fields as an object)."""

    model_config = ConfigDict(extra="allow", json_schema_extra={"examples": [_EXAMPLE]})

    responses_create_params: ResponsesCreateParams
    response: ResponsesResponse
    _chat: tuple[list[dict[str, Any]], list[dict[str, Any]] | None] = PrivateAttr()

    @model_validator(mode="before")
    @classmethod
    def _valid_unicode(cls, data: Any) -> Any:
        _check_unicode(data)
        return data

    @model_validator(mode="after")
    def _has_a_chat_form(self) -> NemoGymVerifyRequest:
        params = self.responses_create_params.model_dump(exclude_unset=True)
        self._chat = chat_of(params, self.response.model_dump(exclude_unset=True))
        return self

    def items(self) -> Conversations:
        """The rollout as one conversation item, with its tools and label."""
        messages, tools = self._chat
        label = label_of(dict(self.model_extra or {}))
        return Conversations((messages,), (label,), tools=None if tools is None else (tools,))


class NemoGymVerifyResponse(BaseModel):
    """NeMo Gym's ``BaseVerifyResponse``: the request as it came (every key), with the
    reward and how far it can be trusted."""

    model_config = ConfigDict(extra="allow")

    responses_create_params: dict[str, Any] = Field(description="As sent.")
    response: dict[str, Any] = Field(description="As sent.")
    reward: float = Field(
        description="The item's score (with several models, their combined score); 0.0 when "
        "the item is masked."
    )
    mask_sample: bool = Field(
        description="True when no reward could be computed: a trainer leaves the sample out."
    )
    failure_kind: str | None = Field(
        description="Why the reward may not reflect the policy, in NeMo Gym's shared "
        "vocabulary (verifier_error, judge_failed, judge_unparseable, or "
        "reward_server:deadline / no_opponent / unclosed_reasoning); null when nothing failed."
    )
    failure_reason: str | None = Field(
        description="The same in words (this server's reason and the model); null when "
        "nothing failed."
    )
    instance_config: dict[str, Any] = Field(
        description="The request's instance_config (if any) with mask_sample, where NeMo RL "
        "reads the flag."
    )
    components: dict[str, float | None] | None = Field(
        default=None,
        description="Several models: each one's own score (null where it masked the item).",
    )
    verifier_errors: dict[str, str] | None = Field(
        default=None,
        description="Each model that gave a reason for its score (a failure, or a verifier's "
        "reason for a score below its best), by name; absent when none did.",
    )


# --- the answer ------------------------------------------------------------------------


def _failure(scored: Scored) -> tuple[str, str] | None:
    """The item's failure as (failure_kind, failure_reason), None when nothing failed."""
    results = {name: rs[0] for name, rs in scored.results.items()}
    reason = scored.reasons[0] if scored.reasons else None
    if reason is not None:
        masking = [n for n, r in results.items() if r.masked]
        model = next((n for n in masking if results[n].error == reason), None) or next(
            iter(masking), None
        )
        by = f" (model {model!r})" if model else ""
        return (
            FAILURE_KINDS.get(reason, "verifier_error"),
            f"{reason}{by}: the reward could not be computed; the sample is masked",
        )
    for name, result in results.items():
        if result.error in FAILURE_KINDS:
            return (
                FAILURE_KINDS[result.error],
                f"{result.error} (model {name!r}): scored its on_error value {result.score}",
            )
    return None


def verify_answer(request: dict[str, Any], scored: Scored) -> dict[str, Any]:
    """NeMo Gym's answer to ``request`` (its JSON body) from the item's results."""
    (reward,) = scored.scores
    masked = reward is None
    kind, reason = _failure(scored) or (None, None)
    echoed = request.get("instance_config")
    answer = {key: value for key, value in request.items() if key not in _ANSWER_KEYS}
    answer.update(
        reward=MASK_FILL if reward is None else reward,
        mask_sample=masked,
        failure_kind=kind,
        failure_reason=reason,
        instance_config={**(echoed if isinstance(echoed, dict) else {}), "mask_sample": masked},
    )
    if len(scored.results) > 1:
        answer["components"] = {name: scores[0] for name, scores in scored.components().items()}
    errors = {
        name: reason for name, rs in scored.results.items() if (reason := rs[0].error or rs[0].note)
    }
    if errors:
        answer["verifier_errors"] = errors
    return answer


# --- routes ----------------------------------------------------------------------------


@router.post(
    "/verify",
    response_model=NemoGymVerifyResponse,
    responses={200: {"headers": ANSWER_HEADERS}, **ERROR_DOCS},
)
async def verify(body: NemoGymVerifyRequest, request: Request, _auth: Authorized) -> JSONResponse:
    """NeMo Gym's /verify: the rollout's reward (with several models, their combined score)
    and, for a masked item, mask_sample with its failure_kind and failure_reason."""
    scored = await score(request, "/verify", body.items())
    answer = verify_answer(body.model_dump(exclude_unset=True), scored)
    headers = {**truncated_header(scored.truncated), **masked_header(scored)}
    return JSONResponse(answer, headers=headers)


@router.post(
    "/seed_session",
    response_model=dict[str, Any],
    responses={
        401: ERROR_DOCS[401],
        413: {**ERROR_DOCS[413], "description": "A body over --max-body-bytes (body_too_large)"},
        422: {**ERROR_DOCS[422], "description": "The body is not a JSON object (invalid_request)"},
    },
)
async def seed_session(body: dict[str, Any], _auth: Authorized) -> dict[str, Any]:
    """NeMo Gym's /seed_session, which its simple_agent calls before each rollout: this
    server keeps no state between a rollout's requests, so there is nothing to seed (``{}``,
    as NeMo Gym's own stateless servers answer)."""
    return {}
