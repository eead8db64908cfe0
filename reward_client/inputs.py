"""The caller's inputs checked and turned into request columns (no I/O).

A call names one input form; :func:`columns` (keyword form, :class:`ScoreInputs`) and
:func:`pair_columns` (the reward-callable form, prompts and responses) check it and give
plain JSON-ready lists keyed by the ``/score`` field they fill: ``texts``, ``queries`` and
``responses``, or ``conversations``; then ``labels`` (one per item) when given. How those
columns become requests is the wire format's business (:mod:`reward_client.wire`).

Messages are OpenAI chat messages, carried as given (numpy values made plain): ``role``,
``content`` (a string, null, or a list of content parts), an assistant's ``tool_calls``
(``{"id", "type": "function", "function": {"name", "arguments"}}``, the arguments a JSON
string or an object), a tool result's ``tool_call_id`` and ``name``, ``reasoning_content``
and any other key, which the server hands to the reward model's chat template. A
conversation is a list of messages or an object ``{"messages": [...], "tools": [...]}``
whose ``tools`` (OpenAI function specs) are that item's own; a call's ``tools``
(:func:`tools_field`) apply to every item without its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias, TypedDict

__all__ = [
    "CallOptions",
    "Conversation",
    "Message",
    "Prompt",
    "ScoreInputs",
    "Tool",
    "columns",
    "item_count",
    "pair_columns",
    "plain_value",
    "request_fields",
    "tools_field",
]

Message: TypeAlias = Mapping[str, Any]
#: An OpenAI function spec: ``{"type": "function", "function": {"name", "description",
#: "parameters"}}``.
Tool: TypeAlias = Mapping[str, Any]
#: A list of messages, or ``{"messages": [...], "tools": [...]}`` (the item's own tools).
Conversation: TypeAlias = Sequence[Message] | Mapping[str, Any]
Prompt: TypeAlias = str | Sequence[Message]

#: The keys of a conversation given as an object.
CONVERSATION_KEYS = ("messages", "tools")


class CallOptions(TypedDict, total=False):
    """The keyword arguments of a scoring call besides its inputs (those of
    ``score_conversations``); :class:`ScoreInputs` has them too.

    ``truncate``: whether the server may cut texts over its limit (None: its default).
    ``model``: score with this one model of a composite server; ``components``: ask for
    the per-model breakdown even from a one-model server (remote-reward protocol only).
    ``labels``: one reference per item (any JSON value: a reference answer, test cases),
    read by the server's verifiers and judges (remote-reward and openrlhf protocols only).
    ``cache``: False has the server score every item afresh, bypassing its score cache
    (None: the server's default, cached; remote-reward protocol only).
    ``deadline``: seconds this call may take in all, retries included (None: the client's
    ``deadline`` option); see :class:`~reward_client.options.ClientOptions`.
    ``groups``: which items form a group (GRPO's responses to one prompt), as lists of item
    indices (``[[0, 1, 2, 3], [4, 5, 6, 7]]``); a group's items share their prompt
    (pairs or conversations), an item is in at most one group and one in none is a group of
    one; read by the server's pairwise judges and ``normalize: group`` models. A group is
    never split across requests (remote-reward protocol only; :mod:`reward_client.groups`).
    """

    truncate: bool | None
    model: str | None
    components: bool | None
    labels: Sequence[Any] | None
    cache: bool | None
    deadline: float | None
    groups: Sequence[Sequence[int]] | None


class ScoreInputs(CallOptions, total=False):
    """The keyword arguments of ``score`` and ``score_detailed``: one input form and the
    options of :class:`CallOptions`.

    Exactly one input form: ``texts`` (scored as given), ``queries`` with ``responses``
    (joined by the server as the reward model expects) or ``conversations`` (lists of chat
    messages, or ``{"messages", "tools"}`` objects, rendered with the reward model's chat
    template; module docstring). ``tools``: OpenAI function specs for every pair or
    conversation without tools of its own (remote-reward protocol only).
    """

    texts: Sequence[str] | None
    queries: Sequence[str] | None
    responses: Sequence[str] | None
    conversations: Sequence[Conversation] | None
    tools: Sequence[Tool] | None


#: Every keyword :class:`ScoreInputs` takes.
_KEYS = ScoreInputs.__required_keys__ | ScoreInputs.__optional_keys__


def _to_str_list(name: str, values: Sequence[str]) -> list[str]:
    """A list copy of ``values``, each a str."""
    if isinstance(values, str):
        raise TypeError(f"{name} must be a sequence of strings, not a single string")
    out = list(values)
    for i, value in enumerate(out):
        if not isinstance(value, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(value).__name__}")
    return out


def _is_list(value: object) -> bool:
    """A sequence that is not a string or a mapping (numpy arrays count: verl's columns)."""
    if isinstance(value, (str, bytes, Mapping)):
        return False
    return isinstance(value, Sequence) or hasattr(value, "tolist")


def _to_dicts(where: str, values: object, what: str) -> list[dict[str, Any]]:
    """Plain JSON-ready copies of a list of objects (``what`` each is, for the errors)."""
    if not _is_list(values):
        raise TypeError(f"{where} must be a list of {what}s, not {type(values).__name__}")
    out = plain_value(values)  # numpy values made plain, mappings copied as dicts
    for j, value in enumerate(out):
        if not isinstance(value, dict):
            raise TypeError(f"{where}[{j}] is a {type(value).__name__}, not a {what}")
    return out


def _to_messages(where: str, messages: object) -> list[dict[str, Any]]:
    """Plain JSON-ready copies of a conversation's messages, every key kept."""
    out = _to_dicts(where, messages, "message")
    for j, message in enumerate(out):
        if not isinstance(message.get("role"), str):
            raise TypeError(f"{where}[{j}] has no 'role' (a str)")
    return out


def _to_tools(where: str, tools: object) -> list[dict[str, Any]]:
    """A plain copy of a list of tool specs (OpenAI function specs:
    ``{"type": "function", "function": {"name", "parameters", ...}}``)."""
    return _to_dicts(where, tools, "tool spec")


def _to_conversation(where: str, conversation: object) -> list[dict[str, Any]] | dict[str, Any]:
    """A plain copy of one conversation: a list of messages, or an object with its messages
    and (when not None) its tools."""
    if not isinstance(conversation, Mapping):
        return _to_messages(where, conversation)
    unknown = sorted(set(conversation) - set(CONVERSATION_KEYS))
    if unknown or "messages" not in conversation:
        raise TypeError(
            f"{where} must be a list of messages or an object with 'messages' and optional "
            f"'tools' (got keys {sorted(conversation)})"
        )
    out: dict[str, Any] = {"messages": _to_messages(f"{where}.messages", conversation["messages"])}
    if conversation.get("tools") is not None:
        out["tools"] = _to_tools(f"{where}.tools", conversation["tools"])
    return out


def _to_conversations(conversations: Sequence[Conversation]) -> list[Any]:
    """Plain JSON-ready copies of the conversations."""
    if not _is_list(conversations):
        raise TypeError("conversations must be a list of conversations")
    return [_to_conversation(f"conversations[{i}]", c) for i, c in enumerate(conversations)]


def tools_field(tools: object, cols: Mapping[str, list[Any]]) -> dict[str, Any]:
    """The request-level ``tools`` field (``{}`` when None), checked: a list of tool specs,
    for pairs or conversations (a text is scored as given: no tools reach it)."""
    if tools is None:
        return {}
    if "texts" in cols:
        raise ValueError(
            "tools= needs conversations or queries/responses (a text is scored as given)"
        )
    return {"tools": _to_tools("tools", tools)}


def plain_value(value: Any) -> Any:
    """``value`` with arrays and array scalars (numpy's, which JSON cannot hold, as verl's
    parquet columns give them) turned into lists and numbers, at any depth."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {k: plain_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    return value


def _to_labels(labels: Sequence[Any], count: int) -> list[Any]:
    """A plain copy of ``labels``, one per item."""
    if isinstance(labels, (str, bytes, Mapping)) or not hasattr(labels, "__len__"):
        raise TypeError(f"labels must be a sequence (one label per item), not {type(labels)}")
    if len(labels) != count:
        raise ValueError(f"{len(labels)} labels for {count} items (one label per item)")
    return [plain_value(label) for label in labels]


def _with_labels(
    columns: dict[str, list[Any]], labels: Sequence[Any] | None
) -> dict[str, list[Any]]:
    """``columns`` and, when given, a ``labels`` column checked against their item count."""
    if labels is not None:
        columns["labels"] = _to_labels(labels, item_count(columns))
    return columns


def columns(inputs: ScoreInputs) -> dict[str, list[Any]]:
    """Check that exactly one input form is given and return its columns as lists (and the
    labels, when given)."""
    return _with_labels(_form_columns(inputs), inputs.get("labels"))


def _form_columns(inputs: ScoreInputs) -> dict[str, list[Any]]:
    """The columns of the one input form given."""
    unknown = sorted(set(inputs) - _KEYS)
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}")
    texts, conversations = inputs.get("texts"), inputs.get("conversations")
    queries, responses = inputs.get("queries"), inputs.get("responses")
    forms = [texts is not None, queries is not None or responses is not None]
    forms.append(conversations is not None)
    if sum(forms) != 1:
        raise ValueError("give exactly one of texts=, queries=/responses= or conversations=")
    if texts is not None:
        return {"texts": _to_str_list("texts", texts)}
    if conversations is not None:
        return {"conversations": _to_conversations(conversations)}
    if queries is None or responses is None:
        raise ValueError("queries= and responses= go together")
    q, r = _to_str_list("queries", queries), _to_str_list("responses", responses)
    if len(q) != len(r):
        raise ValueError(f"{len(q)} queries but {len(r)} responses")
    return {"queries": q, "responses": r}


def pair_columns(
    prompts: Sequence[Prompt], responses: Sequence[str], labels: Sequence[Any] | None = None
) -> dict[str, list[Any]]:
    """Columns for a reward call: text prompts as pairs, message-list prompts as
    conversations; ``labels`` (one per prompt) when given."""
    return _with_labels(_pair_form(prompts, responses), labels)


def _pair_form(prompts: Sequence[Prompt], responses: Sequence[str]) -> dict[str, list[Any]]:
    """Text prompts as pairs, message-list prompts as conversations."""
    prompts, responses = list(prompts), _to_str_list("responses", responses)
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    if all(isinstance(p, str) for p in prompts):
        return {"queries": prompts, "responses": responses}
    if any(isinstance(p, (str, Mapping)) for p in prompts):
        raise TypeError("prompts must be all strings or all lists of chat messages")
    conversations = [
        [*prompt, {"role": "assistant", "content": response}]
        for prompt, response in zip(prompts, responses, strict=True)
    ]
    return {"conversations": _to_conversations(conversations)}


def request_fields(model: object, components: object, cache: object = None) -> dict[str, Any]:
    """The ``model``/``components``/``cache`` request fields that are set, checked."""
    fields: dict[str, Any] = {}
    if model is not None:
        if not isinstance(model, str) or not model:
            raise TypeError(f"model must be a model name (a non-empty str), got {model!r}")
        fields["model"] = model
    if components is not None:
        if not isinstance(components, bool):
            raise TypeError(f"components must be a bool, got {components!r}")
        fields["components"] = components
    if cache is not None:
        if not isinstance(cache, bool):
            raise TypeError(f"cache must be a bool, got {cache!r}")
        fields["cache"] = cache
    return fields


def item_count(body: Mapping[str, list[Any]]) -> int:
    """How many items the columns hold."""
    return len(body.get("texts") or body.get("queries") or body.get("conversations") or [])
