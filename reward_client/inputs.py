"""The caller's inputs checked and turned into request columns (no I/O).

A call names one input form; :func:`columns` (keyword form, :class:`ScoreInputs`) and
:func:`pair_columns` (the reward-callable form, prompts and responses) check it and give
plain JSON-ready lists keyed by the ``/score`` field they fill: ``texts``, ``queries`` and
``responses``, or ``conversations``; then ``labels`` (one per item) when given. How those
columns become requests is the wire format's business (:mod:`reward_client.wire`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias, TypedDict

__all__ = [
    "Conversation",
    "Message",
    "Prompt",
    "ScoreInputs",
    "columns",
    "item_count",
    "pair_columns",
    "plain_value",
    "request_fields",
]

Message: TypeAlias = Mapping[str, Any]
Conversation: TypeAlias = Sequence[Message]
Prompt: TypeAlias = str | Conversation


class ScoreInputs(TypedDict, total=False):
    """The keyword arguments of ``score`` and ``score_detailed``.

    Exactly one input form: ``texts`` (scored as given), ``queries`` with ``responses``
    (joined by the server as the reward model expects) or ``conversations`` (lists of
    ``{"role", "content"}`` messages, rendered with the reward model's chat template).
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

    texts: Sequence[str] | None
    queries: Sequence[str] | None
    responses: Sequence[str] | None
    conversations: Sequence[Conversation] | None
    truncate: bool | None
    model: str | None
    components: bool | None
    labels: Sequence[Any] | None
    cache: bool | None
    deadline: float | None
    groups: Sequence[Sequence[int]] | None


def _to_str_list(name: str, values: Sequence[str]) -> list[str]:
    """A list copy of ``values``, each a str."""
    if isinstance(values, str):
        raise TypeError(f"{name} must be a sequence of strings, not a single string")
    out = list(values)
    for i, value in enumerate(out):
        if not isinstance(value, str):
            raise TypeError(f"{name}[{i}] must be a str, got {type(value).__name__}")
    return out


def _to_conversations(conversations: Sequence[Conversation]) -> list[list[dict[str, Any]]]:
    """Plain JSON-ready copies of the conversations."""
    out: list[list[dict[str, Any]]] = []
    for i, conversation in enumerate(conversations):
        if isinstance(conversation, (str, Mapping)):
            raise TypeError(f"conversations[{i}] must be a list of messages")
        messages = []
        for message in conversation:
            if not isinstance(message, Mapping):
                raise TypeError(
                    f"conversations[{i}] holds a {type(message).__name__}, not a message"
                )
            messages.append(dict(message))
        out.append(messages)
    return out


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
    unknown = sorted(set(inputs) - set(ScoreInputs.__annotations__))
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
