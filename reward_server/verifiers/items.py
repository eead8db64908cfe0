"""One item of a verifier (:class:`Task`) and its outcome (:class:`Verdict`), and the
reasons an item can fail: plain, picklable data, sent to the workers and back as values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

__all__ = ["REASONS", "Failed", "Graded", "Reason", "Task", "Verdict"]

#: Why an item got ``on_error`` instead of its verifier's score:
#:
#: - ``timeout``: no answer within ``timeout_s`` (a ``math`` item is interrupted in its
#:   worker; any other kind's worker is killed and replaced);
#: - ``crash``: the worker process died on the item (replaced);
#: - ``error``: the verifier raised (the traceback is logged by the server, never sent);
#: - ``non_finite``: a NaN or infinite score or extra;
#: - ``bad_result``: neither a number nor a dict with a numeric ``"score"`` and numeric extras;
#: - ``sandbox_error``: a code verifier's sandbox failed to run the program (not the
#:   program's doing; the server logs why);
#: - ``deadline``: the request's deadline came before the item's verdict (its worker is
#:   killed and replaced, its sandbox ended; an item not started yet is never started).
Reason = Literal[
    "timeout", "crash", "error", "non_finite", "bad_result", "sandbox_error", "deadline"
]
REASONS: tuple[Reason, ...] = get_args(Reason)


@dataclass(frozen=True, slots=True)
class Task:
    """One item to verify, as plain data.

    ``prompt``: the query, or the chat messages before the response, or None for a bare
    text; ``response``: the response's text (its thinking removed unless the entry keeps it);
    ``label``: the item's reference (any JSON value), None when it has none; ``tools``: the
    tools the item offered (OpenAI function specs), None when none; ``tool_calls``: the
    response message's tool calls as sent (OpenAI's shape), None when it made none.
    """

    prompt: str | list[dict[str, Any]] | None
    response: str
    label: Any = None
    tools: list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    #: The response message's ``reasoning_content`` where the entry keeps the thinking.
    reasoning: str | None = None
    #: An OpenAI grader object brought by the request (the graders API's pool runs each
    #: task's own); None for every other verifier.
    grader: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Graded:
    """A built-in verifier's result when it can say why it gave less than full marks: the
    score, and the reason (``note``; None at full marks). Not a failure."""

    score: float
    note: str | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    """A built-in verifier's failure with a reason of its own (a grader's: OpenAI's error
    flag, :data:`reward_server.config.graders.GRADER_FLAGS`) and its detail for the log."""

    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """One item's outcome: ``score`` is ``on_error`` whenever ``error`` is set.

    ``extras``: a python verifier's dict result beyond ``"score"``, a code verifier's tests
    ``passed`` and ``total`` (empty otherwise). ``tests``: a code verifier's verdict of each
    test, in the label's order (None for other verifiers, and for an item whose tests could
    not be read).
    """

    score: float
    extras: dict[str, float]
    #: One of :data:`REASONS`, or a grader's flag (:class:`Failed`).
    error: str | None = None
    tests: tuple[str, ...] | None = None
    #: Why a rule gave less than full marks (a tool_call or format verifier's reason); not
    #: a failure: the score stands.
    note: str | None = None
