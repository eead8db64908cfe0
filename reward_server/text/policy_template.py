"""Turn text rendered with a *policy's* chat template back into the conversation.

OpenRLHF's remote reward call sends, as ``query``, the policy's chat-templated prompt plus
the generated response, decoded with ``skip_special_tokens=False``, and as ``prompts`` the
templated prompt alone. To score that with the reward model's own template the server needs
the conversation back: this module learns the shape of the policy's template from its
tokenizer (no weights, no torch) and parses such text.

How the shape is learned: a few probe conversations whose contents are unique sentinels are
rendered with ``apply_chat_template``; the text around the sentinels gives the *opening*
(everything before the first user message, including a BOS and any default system message
the template injects, e.g. Qwen2.5's), the opening before an explicit system message, the
*separators* between consecutive messages (system->user, user->assistant, assistant->user),
the separator between the last user message and the response (the user's end-of-turn plus
the generation prompt) and the *end* that follows a finished assistant message. No table of
known formats is consulted. The learned shape is then checked: fresh probe conversations
(single- and multi-turn, with and without a system message, with and without ``prompts``)
must parse back to themselves, or the template is rejected at load.

Templates that cannot be parsed back unambiguously are rejected with
:class:`PolicyTemplateLoadError`: a system message folded into a user message (Mistral v0.3
puts it into the last user message; Gemma-3 joins it to the first one with a blank line), a
separator made of whitespace only, messages rendered out of order or not at all. A template
that raises on a system message is accepted; its text never contains one.

Whitespace is significant: markers are matched literally, byte for byte, because decoding
the policy's token ids with ``skip_special_tokens=False`` gives back the rendered text exactly
for byte-level BPE tokenizers (Qwen, Llama-3, GPT-2 style). So Llama-3's ``"\\n\\n"`` after a
header belongs to the header, and a response's own leading space or newline stays part of
the response. Contents come back as the template rendered them (Llama-3 trims them).
Text is never normalised; whatever does not match (a SentencePiece decode that dropped a
space next to a special token, a prompt cut from the left, a date-stamped default system
message rendered on another day) is a :class:`PolicyTemplateError`, never a guess. The
liberties taken: leading BOS and pad tokens are ignored (a tokenizer may add a second BOS);
trailing end-of-turn, EOS and pad tokens are removed from the response (a response may end
with or without them); where both the generation prompt and the longer header of an
assistant turn in the history match (Llama-2: ``" [/INST]"`` and ``" [/INST] "``), the
longer one is taken, so the space belongs to the template; an empty ``prompt`` counts as
no prompt.

Roles alternate as chat templates require: an optional system message, then user, assistant,
user, ..., and the text ends with the assistant's response. Without ``prompt``, a response
that itself contains the template's assistant->user separator reads as further turns; with
``prompt``, the response is everything after the prompt (less a longer header, as above).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reward_server.errors import PolicyTemplateError, PolicyTemplateLoadError

logger = logging.getLogger(__name__)

__all__ = [
    "PolicyTemplate",
    "PolicyTemplateError",
    "PolicyTemplateLoadError",
    "load_policy_template",
    "recover_conversations",
]

Message = dict[str, str]


@dataclass(frozen=True)
class TemplateShape:
    """The literal text the template puts around message contents (leading BOS removed)."""

    open_user: str
    """Before the first user message when there is no system message (with any default
    system message the template injects)."""
    open_system: str | None
    """Before an explicit system message; ``None`` when the template refuses one."""
    system_user: str | None
    """Between the system message and the first user message."""
    user_assistant: str
    """Between a user message and the assistant's reply in the conversation history."""
    assistant_user: str
    """Between an assistant message and the next user message."""
    generation: str
    """Between the last user message and the response: the user's end of turn and the
    generation prompt."""
    end: str
    """What follows the final assistant message of a finished conversation."""


def _show(text: str, limit: int = 60) -> str:
    """``repr`` of ``text``, cut to about ``limit`` characters."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _one_line(exc: BaseException) -> str:
    """An exception as one line of at most 300 characters."""
    full = " ".join(str(exc).split()) or type(exc).__name__
    return full if len(full) <= 300 else full[:297] + "..."


def _strip_runs(text: str, tokens: Sequence[str], *, at_end: bool = False) -> str:
    """``text`` without any run of ``tokens`` at its start (at its end with ``at_end``)."""
    stripped = True
    while stripped:
        stripped = False
        for token in tokens:
            if at_end and text.endswith(token):
                text, stripped = text[: -len(token)], True
            elif not at_end and text.startswith(token):
                text, stripped = text[len(token) :], True
    return text


def _find_first(text: str, start: int, markers: Sequence[str]) -> tuple[int, str]:
    """The earliest occurrence at or after ``start`` of any marker (the longest at a tie),
    as ``(index, marker)``; ``(-1, "")`` when none occurs."""
    best, found = -1, ""
    for marker in markers:
        i = text.find(marker, start)
        if i >= 0 and (best < 0 or i < best or (i == best and len(marker) > len(found))):
            best, found = i, marker
    return best, found


class PolicyTemplate:
    """A policy's chat template, learned from its tokenizer, that parses rendered text."""

    def __init__(
        self,
        shape: TemplateShape,
        *,
        leading: Sequence[str] = (),
        trailing: Sequence[str] = (),
    ) -> None:
        """``leading``: tokens ignored at the start of a text (BOS, pad); ``trailing``:
        tokens removed from the end of a response (end of turn, EOS, pad)."""
        self.shape = shape
        self._leading = tuple(t for t in dict.fromkeys(leading) if t)
        # Longest first, so that "<|im_end|>\n" goes before its own prefix "<|im_end|>".
        ends = [t for t in dict.fromkeys(trailing) if t.strip()]
        self._trailing = tuple(sorted(ends, key=len, reverse=True))

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> PolicyTemplate:
        """Learn the template of ``tokenizer`` (a transformers tokenizer with a chat
        template) from probe renderings; raise PolicyTemplateLoadError if it cannot be."""
        if not getattr(tokenizer, "chat_template", None):
            raise PolicyTemplateLoadError(
                "it has no chat template, so its text cannot be parsed back into a conversation"
            )
        specials = {
            name: getattr(tokenizer, f"{name}_token", None) or "" for name in ("bos", "eos", "pad")
        }
        leading = (specials["bos"], specials["pad"])
        shape = _learn_shape(_Renderer(tokenizer, leading))
        end_of_turn = (shape.end, shape.end.rstrip())
        template = cls(
            shape, leading=leading, trailing=(*end_of_turn, specials["eos"], specials["pad"])
        )
        _self_check(template, _Renderer(tokenizer, leading))
        logger.info("policy chat template learned: %s", template.shape)
        return template

    @property
    def supports_system(self) -> bool:
        """Whether the template renders a system message of its own."""
        return self.shape.open_system is not None

    def parse(self, query: str, prompt: str | None = None) -> list[Message]:
        """The conversation in ``query`` (policy-templated prompt + response): system, user
        and assistant messages, the last one the response, markers removed.

        With ``prompt`` (the templated prompt alone) the query must start with it and the
        response is the rest; without it the response is what follows the last
        user->assistant separator. Raise PolicyTemplateError when the text is not in the
        template.
        """
        text = _strip_runs(query, self._leading)
        if prompt:
            messages, response = self._split_at_prompt(text, prompt)
        else:
            messages, response = self._scan(text)
        response = _strip_runs(response, self._trailing, at_end=True)
        return [*messages, {"role": "assistant", "content": response}]

    def _split_at_prompt(self, text: str, prompt: str) -> tuple[list[Message], str]:
        """(the prompt's messages, raw response) of ``text``, which must start with
        ``prompt``, which must end with the generation prompt."""
        shape = self.shape
        head = _strip_runs(prompt, self._leading)
        if not text.startswith(head):
            raise PolicyTemplateError(
                f"the query does not start with its prompt: prompt starts {_show(head)}, "
                f"query starts {_show(text)}"
            )
        messages, rest = self._scan(head)
        if rest or not head.endswith(shape.generation):
            raise PolicyTemplateError(
                "the prompt does not end with the policy template's generation prompt "
                f"{_show(shape.generation)}; it ends {_show(head[-60:])}"
            )
        # The response starts after the longest user->assistant separator there, as in
        # _scan_turns: Llama-2's history header " [/INST] " also takes the space that its
        # generation prompt " [/INST]" leaves to the response.
        user_end = len(head) - len(shape.generation)
        _, separator = _find_first(text, user_end, (shape.generation, shape.user_assistant))
        return messages, text[user_end + len(separator) :]

    def _scan(self, text: str) -> tuple[list[Message], str]:
        """``text`` as (messages before the response, raw response), trying the longer of the
        two openings first (a default system message is part of the no-system opening)."""
        shape = self.shape
        openings = [(shape.open_user, "user")]
        if shape.open_system is not None:
            openings.append((shape.open_system, "system"))
        openings.sort(key=lambda item: len(item[0]), reverse=True)
        first_error: PolicyTemplateError | None = None
        for opening, role in openings:
            if not text.startswith(opening):
                continue
            try:
                return self._scan_turns(text, len(opening), role)
            except PolicyTemplateError as exc:
                first_error = first_error or exc
        if first_error is not None:
            raise first_error
        expected = " or ".join(_show(opening) for opening, _ in openings)
        raise PolicyTemplateError(
            f"the text does not start with the policy template's opening {expected}; "
            f"it starts {_show(text)}"
        )

    def _scan_turns(self, text: str, pos: int, role: str) -> tuple[list[Message], str]:
        """Messages from ``pos`` (where a ``role`` message starts) up to the response: the
        assistant message that no assistant->user separator follows."""
        shape = self.shape
        messages: list[Message] = []
        if role == "system":
            end = text.find(shape.system_user or "", pos)
            if end < 0:
                raise PolicyTemplateError(
                    f"the system message does not end with {_show(shape.system_user or '')}"
                )
            messages.append({"role": "system", "content": text[pos:end]})
            pos = end + len(shape.system_user or "")
        while True:
            end, separator = _find_first(text, pos, (shape.generation, shape.user_assistant))
            if end < 0:
                expected = " or ".join(
                    _show(s) for s in dict.fromkeys((shape.generation, shape.user_assistant))
                )
                raise PolicyTemplateError(
                    f"message {len(messages) + 1} (user) does not end with {expected}: "
                    "no response follows it"
                )
            messages.append({"role": "user", "content": text[pos:end]})
            start = end + len(separator)
            next_user = text.find(shape.assistant_user, start)
            if next_user < 0:
                return messages, text[start:]
            messages.append({"role": "assistant", "content": text[start:next_user]})
            pos = next_user + len(shape.assistant_user)


def _probe(roles: str, mark: str) -> list[Message]:
    """A probe conversation of ``roles`` ("s", "u", "a" letters) whose contents are unique
    sentinels without whitespace (so that a template's ``trim`` leaves them alone)."""
    names = {"s": "system", "u": "user", "a": "assistant"}
    return [{"role": names[r], "content": f"{mark}{i:02d}{r}{mark}"} for i, r in enumerate(roles)]


class _Renderer:
    """Renders probe conversations with a tokenizer's chat template, leading BOS removed."""

    def __init__(self, tokenizer: Any, leading: Sequence[str]) -> None:
        self._tokenizer = tokenizer
        self._leading = tuple(t for t in leading if t)

    def render(self, messages: list[Message], generation: bool) -> str:
        """``messages`` rendered as text; PolicyTemplateLoadError when the template fails."""
        label = ",".join(m["role"] for m in messages) + (" + generation prompt" * generation)
        try:
            text = self._tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=generation
            )
        except Exception as exc:  # the template's own code: anything can come out of it
            raise PolicyTemplateLoadError(
                f"the chat template cannot render the probe conversation {label}: {_one_line(exc)}"
            ) from exc
        if not isinstance(text, str):
            raise PolicyTemplateLoadError(
                f"apply_chat_template returned {type(text).__name__}, not text, for {label}"
            )
        return _strip_runs(text, self._leading)

    def segments(self, roles: str, generation: bool) -> list[str]:
        """Render a probe of ``roles`` and return the texts between its sentinel contents:
        before the first, between each pair, and after the last."""
        messages = _probe(roles, "PRB")
        text = self.render(messages, generation)
        pieces, pos = [], 0
        for i, message in enumerate(messages):
            found = text.find(message["content"], pos)
            if found < 0 or text.count(message["content"]) != 1:
                folded = " (is the system message folded into a user message?)" * ("s" in roles)
                raise PolicyTemplateLoadError(
                    f"the chat template does not render message {i + 1} ({message['role']}) of "
                    f"the probe conversation {','.join(roles)} once and in order{folded}"
                )
            pieces.append(text[pos:found])
            pos = found + len(message["content"])
        pieces.append(text[pos:])
        return pieces


def _learn_shape(renderer: _Renderer) -> TemplateShape:
    """The template's shape from probe renderings (see the module docstring)."""
    # [user, assistant, user, assistant]: opening, u->a, a->u, u->a again, end.
    open_user, user_assistant, assistant_user, user_assistant_2, end = renderer.segments(
        "uaua", False
    )
    if user_assistant_2 != user_assistant:
        raise PolicyTemplateLoadError(
            "the chat template separates user and assistant messages differently in each turn "
            f"({_show(user_assistant)} then {_show(user_assistant_2)})"
        )
    open_user_2, generation = renderer.segments("u", True)
    if open_user_2 != open_user:
        raise PolicyTemplateLoadError(
            "the chat template opens a conversation differently with a generation prompt "
            f"({_show(open_user)} vs {_show(open_user_2)})"
        )
    open_system, system_user = _learn_system(renderer)
    separators = {
        "user->assistant": user_assistant,
        "assistant->user": assistant_user,
        "user->response (generation prompt)": generation,
    }
    if system_user is not None:
        separators["system->user"] = system_user
    for name, separator in separators.items():
        if not separator.strip():
            raise PolicyTemplateLoadError(
                f"the chat template separates {name} with whitespace only ({_show(separator)}), "
                "so rendered text cannot be split back into messages"
                + (
                    " (it folds the system message into the user message)"
                    if "system" in name
                    else ""
                )
            )
    return TemplateShape(
        open_user=open_user,
        open_system=open_system,
        system_user=system_user,
        user_assistant=user_assistant,
        assistant_user=assistant_user,
        generation=generation,
        end=end,
    )


def _learn_system(renderer: _Renderer) -> tuple[str | None, str | None]:
    """(opening before a system message, system->user separator), or ``(None, None)`` when
    the template refuses system messages (raises on one)."""
    try:
        renderer.render(_probe("su", "PRB"), True)
    except PolicyTemplateLoadError as exc:
        logger.info("policy chat template refuses system messages: %s", exc)
        return None, None
    open_system, system_user, *_ = renderer.segments("sua", False)
    return open_system, system_user


def _self_check(template: PolicyTemplate, renderer: _Renderer) -> None:
    """Fresh probe conversations, rendered by the template, must parse back to themselves,
    from the query alone and with the prompt, with and without an end of turn."""
    shapes = ["ua", "uaua", "uauaua"] + (["sua", "suaua"] if template.supports_system else [])
    for roles in shapes:
        conversation = _probe(roles, "CHK")
        prompt = renderer.render(conversation[:-1], True)
        response = conversation[-1]["content"]
        cases = [
            (renderer.render(conversation, False), None),
            (prompt + response, None),
            (prompt + response, prompt),
            (prompt + response + template.shape.end, prompt),
        ]
        for query, given in cases:
            try:
                parsed = template.parse(query, given)
            except PolicyTemplateError as exc:
                parsed, reason = None, str(exc)
            else:
                reason = f"got {parsed}"
            if parsed != conversation:
                raise PolicyTemplateLoadError(
                    "the learned chat template does not parse its own rendering of the probe "
                    f"conversation {','.join(roles)} back: {reason}"
                )


def load_policy_template(name_or_path: str, trust_remote_code: bool = False) -> PolicyTemplate:
    """Load only the tokenizer of ``name_or_path`` (no weights) and learn its chat template;
    raise PolicyTemplateLoadError with a one-line reason when either fails."""
    from transformers import AutoTokenizer  # deferred: importing transformers is slow

    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
        return PolicyTemplate.from_tokenizer(tokenizer)
    except PolicyTemplateLoadError as exc:
        raise PolicyTemplateLoadError(f"policy tokenizer {name_or_path!r}: {exc}") from exc
    except Exception as exc:
        raise PolicyTemplateLoadError(
            f"cannot load the policy tokenizer {name_or_path!r}: {_one_line(exc)}"
        ) from exc


def recover_conversations(
    template: PolicyTemplate, queries: Sequence[str], prompts: Sequence[str] | None
) -> list[list[Message]]:
    """The conversation of each policy-templated ``queries[i]`` (split at ``prompts[i]`` when
    given); a PolicyTemplateError names the first item that does not parse."""
    if prompts is not None and len(prompts) not in (0, len(queries)):
        raise PolicyTemplateError(
            f"{len(prompts)} prompts for {len(queries)} queries: send one prompt per query or none"
        )
    conversations = []
    for i, query in enumerate(queries):
        prompt = prompts[i] if prompts else None
        try:
            conversations.append(template.parse(query, prompt))
        except PolicyTemplateError as exc:
            raise PolicyTemplateError(
                f"query {i} is not in the policy's chat template: {exc}"
            ) from None
    return conversations
