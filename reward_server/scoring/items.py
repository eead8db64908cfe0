"""A request's items as plain data, and how a served model reads them.

The HTTP layer turns each route's body into one of the shapes below: values, never
callables. The served models read them on the registry's tokenizer thread, each kind through
one reader here: as texts in their own chat template (:func:`render`), as conversations
whose last message is the response (:func:`conversations`: process reward models score the
response's steps), as a verifier's tasks (:func:`tasks`: prompt, response and label; remote
components read them too), or as what a judge's template reads (:func:`judge_prompts`).
Pairs stay pairs as long as possible, because a model without a chat template joins them,
and a process model finds the response in a pair without a template.

No torch and no HTTP here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from reward_server.errors import ResponseNotFoundError
from reward_server.text.judge_prompt import JudgePrompt
from reward_server.text.policy_template import recover_conversations
from reward_server.verifiers.items import Task

if TYPE_CHECKING:
    from reward_server.engines import Scorer
    from reward_server.text.policy_template import PolicyTemplate

__all__ = [
    "Conversation",
    "Conversations",
    "Items",
    "Labels",
    "Message",
    "Pairs",
    "PolicyTexts",
    "Sequences",
    "Texts",
    "conversations",
    "judge_prompts",
    "render",
    "response_chars",
    "tasks",
]

#: One chat message: ``role`` and ``content``.
Message: TypeAlias = dict[str, str]
#: One chat: messages in order.
Conversation: TypeAlias = list[Message]
#: Per item, the reference it is judged against (a reference answer, test cases, a rubric
#: variable: any JSON value), or None when the request sent none. Reward models ignore
#: them; verifiers and judges read them.
Labels: TypeAlias = tuple[Any, ...] | None


class _Shape:
    """What every shape has: its number of items, the length of its first field."""

    __slots__ = ()

    @property
    def count(self) -> int:
        """How many items."""
        return len(getattr(self, dataclasses.fields(self)[0].name))  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Texts(_Shape):
    """Complete texts, scored as given (no template applied)."""

    texts: tuple[str, ...]
    labels: Labels = None


@dataclass(frozen=True, slots=True)
class Pairs(_Shape):
    """Query/response pairs: rendered as a user and an assistant turn with the model's chat
    template, or joined without one."""

    queries: tuple[str, ...]
    responses: tuple[str, ...]
    labels: Labels = None

    def __post_init__(self) -> None:
        if len(self.queries) != len(self.responses):
            raise ValueError(f"{len(self.queries)} queries for {len(self.responses)} responses")


@dataclass(frozen=True, slots=True)
class Conversations(_Shape):
    """Conversations, rendered with the model's chat template; the last message is the
    response."""

    conversations: tuple[Conversation, ...]
    labels: Labels = None


@dataclass(frozen=True, slots=True)
class PolicyTexts(_Shape):
    """Complete texts the policy rendered with its own chat template (OpenRLHF's
    ``/get_reward``). With the policy's template known (``--policy-tokenizer``) they are
    turned back into conversations, split at ``prompts[i]`` when given; else scored as
    given."""

    texts: tuple[str, ...]
    prompts: tuple[str, ...] | None = None
    labels: Labels = None


@dataclass(frozen=True, slots=True)
class Sequences(_Shape):
    """Texts and pairs mixed, in order (TEI's ``inputs``): ``(text,)`` or ``(query,
    response)`` each."""

    sequences: tuple[tuple[str] | tuple[str, str], ...]


#: One request's items, in one of their shapes.
Items: TypeAlias = Texts | Pairs | Conversations | PolicyTexts | Sequences


def _recovered(items: PolicyTexts, template: PolicyTemplate) -> list[Conversation]:
    prompts = list(items.prompts) if items.prompts is not None else None
    return recover_conversations(template, items.texts, prompts)


def render(items: Items, scorer: Scorer, template: PolicyTemplate | None) -> list[str]:
    """The items as texts for ``scorer``: its chat template applied where items have turns
    (``template``: the policy's, to undo on :class:`PolicyTexts`)."""
    if isinstance(items, Texts):
        return list(items.texts)
    if isinstance(items, Pairs):
        return scorer.render_pairs(items.queries, items.responses)
    if isinstance(items, Conversations):
        return scorer.render_conversations(items.conversations)
    if isinstance(items, PolicyTexts):
        if template is None:
            return list(items.texts)
        return scorer.render_conversations(_recovered(items, template))
    texts = [sequence[0] for sequence in items.sequences]
    at = [i for i, sequence in enumerate(items.sequences) if len(sequence) == 2]
    joined = scorer.render_pairs(
        [items.sequences[i][0] for i in at], [items.sequences[i][-1] for i in at]
    )
    for i, text in zip(at, joined, strict=True):
        texts[i] = text
    return texts


def conversations(
    items: Items, template: PolicyTemplate | None, model: str
) -> Pairs | list[Conversation]:
    """The items with their responses told apart, for a process reward model (``model``,
    named in the error): pairs as they are, else conversations; ResponseNotFoundError for
    texts, whose response cannot be found."""
    if isinstance(items, Pairs):
        return items
    if isinstance(items, Conversations):
        return list(items.conversations)
    if isinstance(items, PolicyTexts) and template is not None:
        return _recovered(items, template)
    if isinstance(items, Sequences) and all(len(s) == 2 for s in items.sequences):
        return Pairs(tuple(s[0] for s in items.sequences), tuple(s[-1] for s in items.sequences))
    raise ResponseNotFoundError(
        f"model {model!r} is a process reward model: it scores each step of a response, "
        "and texts cannot be split into prompt and response; send queries and responses, "
        "or conversations"
    )


def _label(labels: Labels, i: int) -> Any:
    return None if labels is None else labels[i]


def _from_conversations(conversations: Any, labels: Labels) -> list[Task]:
    """The last message is the response, the messages before it the prompt."""
    return [
        Task(prompt=list(conv[:-1]), response=conv[-1]["content"], label=_label(labels, i))
        for i, conv in enumerate(conversations)
    ]


def tasks(items: Items, template: PolicyTemplate | None) -> list[Task]:
    """The items as a verifier reads them: prompt (the query, the messages before the
    response, or None for a bare text), response and label (``template``: the policy's, to
    undo on :class:`PolicyTexts`)."""
    if isinstance(items, Pairs):
        return [
            Task(prompt=q, response=r, label=_label(items.labels, i))
            for i, (q, r) in enumerate(zip(items.queries, items.responses, strict=True))
        ]
    if isinstance(items, Conversations):
        return _from_conversations(items.conversations, items.labels)
    if isinstance(items, PolicyTexts) and template is not None:
        return _from_conversations(_recovered(items, template), items.labels)
    if isinstance(items, Texts | PolicyTexts):
        return [
            Task(prompt=None, response=text, label=_label(items.labels, i))
            for i, text in enumerate(items.texts)
        ]
    return [
        Task(prompt=s[0] if len(s) == 2 else None, response=s[-1], label=None)
        for s in items.sequences
    ]


def response_chars(items: Items) -> list[int]:
    """Per item, its response's length in characters (the reward signals' length): the
    response of a pair or a sequence pair, a conversation's last message, a policy text past
    its prompt; a bare text's whole length."""
    if isinstance(items, Pairs):
        return [len(response) for response in items.responses]
    if isinstance(items, Conversations):
        return [
            len(str(conv[-1].get("content", ""))) if conv else 0 for conv in items.conversations
        ]
    if isinstance(items, PolicyTexts):
        if items.prompts is None:
            return [len(text) for text in items.texts]
        return [
            len(text) - len(prompt) if text.startswith(prompt) else len(text)
            for text, prompt in zip(items.texts, items.prompts, strict=True)
        ]
    if isinstance(items, Texts):
        return [len(text) for text in items.texts]
    return [len(sequence[-1]) for sequence in items.sequences]


def _judge_prompt(task: Task) -> JudgePrompt:
    """A verifier's reading of an item (prompt: text, messages or None) as a judge's."""
    prompt = task.prompt
    if prompt is None:
        return JudgePrompt(prompt="", response=task.response, label=task.label)
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
        return JudgePrompt(prompt, task.response, task.label, messages)
    messages = [dict(m) for m in prompt]
    joined = "\n\n".join(str(m.get("content", "")) for m in messages)
    return JudgePrompt(joined, task.response, task.label, messages)


def judge_prompts(items: Items, policy_template: PolicyTemplate | None = None) -> list[JudgePrompt]:
    """What a judge's template reads of each item (see :mod:`reward_server.text.judge_prompt`);
    ``policy_template``: the policy's, undone on policy-templated texts."""
    return [_judge_prompt(task) for task in tasks(items, policy_template)]
