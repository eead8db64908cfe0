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
from reward_server.text.judge_prompt import JudgePrompt, joined_prompt
from reward_server.text.messages import content_text, tool_call_list
from reward_server.text.policy_template import recover_conversations
from reward_server.text.reasoning import answer
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
    "without_reasoning",
]

#: One chat message, OpenAI's shape as plain data (:mod:`reward_server.text.messages`):
#: ``role``, ``content`` (a string, or None for an assistant turn that only calls tools),
#: ``tool_calls``, ``tool_call_id``, ``name``, ``reasoning_content`` and any other key.
Message: TypeAlias = dict[str, Any]
#: The tools a conversation offers: OpenAI function specs.
ToolSpecs: TypeAlias = list[dict[str, Any]]
#: Per item, its tools (None: it offers none); None when no item offers any.
ItemTools: TypeAlias = tuple[ToolSpecs | None, ...] | None
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
    tools: ItemTools = None

    def __post_init__(self) -> None:
        if len(self.queries) != len(self.responses):
            raise ValueError(f"{len(self.queries)} queries for {len(self.responses)} responses")


@dataclass(frozen=True, slots=True)
class Conversations(_Shape):
    """Conversations, rendered with the model's chat template; the last message is the
    response."""

    conversations: tuple[Conversation, ...]
    labels: Labels = None
    tools: ItemTools = None


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
    # (tools only where some item has them: a scorer need not know of tools otherwise)
    if isinstance(items, Pairs):
        if items.tools is None:
            return scorer.render_pairs(items.queries, items.responses)
        return scorer.render_pairs(items.queries, items.responses, items.tools)
    if isinstance(items, Conversations):
        if items.tools is None:
            return scorer.render_conversations(items.conversations)
        return scorer.render_conversations(items.conversations, items.tools)
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


def _from_conversations(conversations: Any, labels: Labels, tools: ItemTools) -> list[Task]:
    """The last message is the response, the messages before it the prompt."""
    return [
        Task(
            prompt=list(conv[:-1]),
            response=content_text(conv[-1].get("content")),
            label=_label(labels, i),
            tools=_label(tools, i),
            tool_calls=tool_call_list(conv[-1]) or None,
            reasoning=conv[-1].get("reasoning_content") or None,
        )
        for i, conv in enumerate(conversations)
    ]


def tasks(items: Items, template: PolicyTemplate | None) -> list[Task]:
    """The items as a verifier reads them: prompt (the query, the messages before the
    response, or None for a bare text), response and label (``template``: the policy's, to
    undo on :class:`PolicyTexts`)."""
    if isinstance(items, Pairs):
        return [
            Task(prompt=q, response=r, label=_label(items.labels, i), tools=_label(items.tools, i))
            for i, (q, r) in enumerate(zip(items.queries, items.responses, strict=True))
        ]
    if isinstance(items, Conversations):
        return _from_conversations(items.conversations, items.labels, items.tools)
    if isinstance(items, PolicyTexts) and template is not None:
        return _from_conversations(_recovered(items, template), items.labels, None)
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
            len(content_text(conv[-1].get("content"))) if conv else 0
            for conv in items.conversations
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
    calls, tools = list(task.tool_calls or []), list(task.tools or [])
    if prompt is None:
        return JudgePrompt("", task.response, task.label, tool_calls=calls, tools=tools)
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
        return JudgePrompt(prompt, task.response, task.label, messages, calls, tools)
    messages = [dict(m) for m in prompt]
    return JudgePrompt(joined_prompt(messages), task.response, task.label, messages, calls, tools)


def judge_prompts(items: Items, policy_template: PolicyTemplate | None = None) -> list[JudgePrompt]:
    """What a judge's template reads of each item (see :mod:`reward_server.text.judge_prompt`);
    ``policy_template``: the policy's, undone on policy-templated texts."""
    return [_judge_prompt(task) for task in tasks(items, policy_template)]


# ------------------------------------------------------------------ reasoning


def _assistant(message: Message, tags: tuple[str, str]) -> tuple[Message, bool]:
    """An assistant message without its thinking (its content's blocks and its
    ``reasoning_content``), and whether a block in it never closed."""
    out = {k: v for k, v in message.items() if k != "reasoning_content"}
    content = message.get("content")
    if not isinstance(content, str):
        return out, False
    found = answer(content, tags)
    out["content"] = found.text
    return out, found.unclosed


def _conversation(conversation: Conversation, tags: tuple[str, str]) -> tuple[Conversation, bool]:
    """A conversation without the thinking of its assistant turns; unclosed when its last
    message (the response) opens a block it never closes."""
    out: Conversation = []
    unclosed = False
    for i, message in enumerate(conversation):
        if message.get("role") != "assistant":
            out.append(message)
            continue
        stripped, cut = _assistant(message, tags)
        out.append(stripped)
        unclosed = cut and i == len(conversation) - 1
    return out, unclosed


def _policy_text(text: str, prompt: str | None, tags: tuple[str, str]) -> tuple[str, bool]:
    """A policy-templated text without the thinking of its response (the part after
    ``prompt``; without one the whole text, where only closed blocks count)."""
    if prompt is None or not text.startswith(prompt):
        found = answer(text, tags, response=False)
        return found.text, found.unclosed
    found = answer(text[len(prompt) :], tags)
    head = prompt.rstrip()
    # A generation prompt that opens the thinking (DeepSeek-R1's) loses its opening tag too.
    if head.endswith(tags[0]):
        prompt = head[: -len(tags[0])]
    return prompt + found.text, found.unclosed


def without_reasoning(items: Items, tags: tuple[str, str]) -> tuple[Items, list[bool]]:
    """The items with a reasoning policy's thinking removed (:mod:`reward_server.text.reasoning`):
    from responses (a pair's, a conversation's assistant turns, a policy text's part after its
    prompt) and, for a bare text, its closed blocks; and per item whether its response opened
    a block it never closed."""
    if isinstance(items, Texts):
        found = [answer(text, tags, response=False) for text in items.texts]
        return Texts(tuple(f.text for f in found), items.labels), [f.unclosed for f in found]
    if isinstance(items, Pairs):
        found = [answer(response, tags) for response in items.responses]
        stripped = tuple(f.text for f in found)
        return dataclasses.replace(items, responses=stripped), [f.unclosed for f in found]
    if isinstance(items, Conversations):
        done = [_conversation(conv, tags) for conv in items.conversations]
        stripped_convs = tuple(conv for conv, _ in done)
        return dataclasses.replace(items, conversations=stripped_convs), [u for _, u in done]
    if isinstance(items, PolicyTexts):
        if items.prompts is not None and len(items.prompts) != items.count:
            return items, [False] * items.count  # refused where the prompts are read
        prompts = items.prompts or (None,) * items.count
        done_texts = [_policy_text(t, p, tags) for t, p in zip(items.texts, prompts, strict=True)]
        texts = tuple(text for text, _ in done_texts)
        return dataclasses.replace(items, texts=texts), [u for _, u in done_texts]
    sequences: list[tuple[str] | tuple[str, str]] = []
    unclosed: list[bool] = []
    for sequence in items.sequences:
        if len(sequence) == 2:
            found_one = answer(sequence[1], tags)
            sequences.append((sequence[0], found_one.text))
        else:
            found_one = answer(sequence[0], tags, response=False)
            sequences.append((found_one.text,))
        unclosed.append(found_one.unclosed)
    return Sequences(tuple(sequences)), unclosed
