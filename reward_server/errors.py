"""The one exception hierarchy of the server's core (no dependencies: configuration,
rendering, engines, the schedulers and the scoring pipeline raise these without knowing HTTP).

Every failure raised on purpose is a :class:`ServiceError`; each also derives from the
built-in exception it is a kind of, so callers may catch either::

    ServiceError
    ├── ModelsFileError           (ValueError)    the models file is not valid (start-up)
    ├── ModelLoadError            (RuntimeError)  a model, tokenizer or adapter did not load
    ├── PolicyTemplateLoadError   (RuntimeError)  the policy's chat template cannot be learned
    ├── ChatTemplateError         (ValueError)    no chat template, or it fails to render
    ├── UnrenderableError         (ValueError)    a template cannot show tool calls, tools ...
    ├── PolicyTemplateError       (ValueError)    a text is not in the policy's template
    ├── TextTooLongError          (ValueError)    over max_length with truncation off
    ├── ResponseNotFoundError     (ValueError)    a process model finds no response to split
    ├── StepsTruncatedError       (ValueError)    truncation cut every step
    ├── LabelError                (ValueError)    an item's label is not what its model reads
    ├── TooManyItemsError         (ValueError)    more items than one request may carry
    ├── EmptyTextError            (ValueError)    an item encodes to no tokens
    ├── RunRefusedError           (ValueError)    a program run cannot be made as asked
    ├── QueueFullError            (RuntimeError)  the queue is full: retry after retry_after
    │   └── TenantLimitError                      a tenant is over its queue share or rate
    ├── NotRunningError           (RuntimeError)  not started, stopping or closed
    ├── UnauthorizedError         (PermissionError)
    ├── ModelNotFoundError        (LookupError)   another server's route names another model
    ├── UnknownModelError         (LookupError)   /score names a model not served
    ├── NotReadyError             (RuntimeError)  still loading
    ├── ScoringError              (RuntimeError)  the model failed (details only in the log)
    └── ClientDisconnectedError   (ConnectionError)

The HTTP edge maps each class to a status code and an error ``type`` in one table
(:mod:`reward_server.http.errors`); anything that is not a ServiceError is a bug (500).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__all__ = [
    "BadDeadlineError",
    "ChatTemplateError",
    "ClientDisconnectedError",
    "EmptyTextError",
    "GroupsError",
    "LabelError",
    "ModelLoadError",
    "ModelNotFoundError",
    "ModelsFileError",
    "NotReadyError",
    "NotRunningError",
    "PolicyTemplateError",
    "PolicyTemplateLoadError",
    "QueueFullError",
    "ResponseNotFoundError",
    "RunRefusedError",
    "ScoringError",
    "ServiceError",
    "StepsTruncatedError",
    "TenantLimitError",
    "TextTooLongError",
    "TooManyItemsError",
    "UnauthorizedError",
    "UnknownModelError",
    "UnrenderableError",
    "field_path",
    "load_errors",
    "one_line",
    "validation_problem",
]


class ServiceError(Exception):
    """Base of every failure the server's layers raise on purpose (mapped to HTTP at the edge)."""


class ModelsFileError(ServiceError, ValueError):
    """The models file cannot be read or is not valid; ``str(e)`` says where and why."""


class PolicyTemplateLoadError(ServiceError, RuntimeError):
    """The policy tokenizer cannot be loaded, or its chat template cannot be learned."""


class ModelLoadError(ServiceError, RuntimeError):
    """The model, tokenizer or adapter could not be loaded; ``str(e)`` is a one-line reason."""


class ChatTemplateError(ServiceError, ValueError):
    """A pair or conversation needs a chat template that is missing or fails to render."""


class UnrenderableError(ServiceError, ValueError):
    """A model cannot render part of a request (tool calls, tool results, tools): its chat
    or judge template does not show them and its entry does not ask for the plain-text
    rendering; ``str(e)`` names the model and the part."""


class PolicyTemplateError(ServiceError, ValueError):
    """A text is not in the policy's chat template; ``str(e)`` says what did not match."""


class TextTooLongError(ServiceError, ValueError):
    """A text is longer than ``max_length`` while truncation is off."""

    def __init__(self, index: int, num_tokens: int, max_length: int) -> None:
        super().__init__(
            f"text {index} has {num_tokens} tokens, more than max_length {max_length} "
            "(truncation is off)"
        )
        self.index = index
        self.num_tokens = num_tokens
        self.max_length = max_length


class GroupsError(ServiceError, ValueError):
    """A request's groups do not fit its items or its models: a group whose items' prompts
    differ, groups without prompts, or no groups for a model that scores within groups;
    ``str(e)`` names the problem."""


class ResponseNotFoundError(ServiceError, ValueError):
    """A process reward model cannot find an item's response: texts (no response to split),
    a conversation that does not end with the assistant, a chat template that changes it."""


class StepsTruncatedError(ServiceError, ValueError):
    """Truncation cut every step of an item's response: no step is left to score."""


class LabelError(ServiceError, ValueError):
    """An item's label is not what its model reads (a rubric judge's criteria: not a list,
    a criterion without text, an unknown category ...); ``str(e)`` names the model, the item
    and the problem."""


class QueueFullError(ServiceError, RuntimeError):
    """The queue cannot admit the request now; retry after ``retry_after`` seconds."""

    def __init__(self, retry_after: float, message: str | None = None) -> None:
        super().__init__(message or f"queue full, retry after {retry_after:.2f}s")
        self.retry_after = retry_after


class TenantLimitError(QueueFullError):
    """One tenant is over its own limit (its share of the queue, or its rate in tokens per
    second); ``str(e)`` names the limit. Other tenants are still admitted."""


class NotRunningError(ServiceError, RuntimeError):
    """What would do the work is not running: a scheduler, a verifier's workers or sandbox,
    an engine (not started, stopping, or closed)."""


class TooManyItemsError(ServiceError, ValueError):
    """A request carries more items than the server accepts at once."""


class EmptyTextError(ServiceError, ValueError):
    """An item tokenizes to nothing, so there is no token to read a score from."""


class RunRefusedError(ServiceError, ValueError):
    """A program run (``/run_code``) cannot be made as asked: a language the server does not
    run, a file outside the work directory; ``str(e)`` says why."""


class BadDeadlineError(ServiceError, ValueError):
    """A request's deadline (``X-Request-Timeout-Ms`` or ``timeout_ms``) is not a positive
    finite number of milliseconds; ``str(e)`` says what was sent."""


class UnauthorizedError(ServiceError, PermissionError):
    """Missing or wrong API key."""


class ModelNotFoundError(ServiceError, LookupError):
    """A request names a model this server does not serve (``param``: the field)."""

    param = "model"


class UnknownModelError(ServiceError, LookupError):
    """A /score request names a model this server does not serve (the message lists them)."""

    param = "model"


class NotReadyError(ServiceError, RuntimeError):
    """The model is still loading (the lifespan has not finished starting)."""


class ScoringError(ServiceError, RuntimeError):
    """The model failed on a request (details are logged, never sent)."""


class ClientDisconnectedError(ServiceError, ConnectionError):
    """The client went away before its scores were ready; its queued work was dropped."""


def field_path(parts: Sequence[int | str]) -> str:
    """``("texts", 2, "role")`` -> ``texts[2].role``."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


def validation_problem(err: Mapping[str, Any]) -> str:
    """One pydantic validation error (an item of ``ValidationError.errors()``) as ``where:
    what``, unknown keys and missing ones by name. Never the input value: in a keys file it
    may be a key."""
    # A union told apart by a key puts the variant it took in the path ("<kind: judge>").
    loc = tuple(p for p in err.get("loc", ()) if not (isinstance(p, str) and p.startswith("<")))
    kind = err.get("type")
    if kind == "extra_forbidden":
        return f"{field_path(loc[:-1]) or 'top level'}: unknown key {loc[-1]!r}"
    if kind == "missing":
        return f"{field_path(loc[:-1]) or 'top level'}: {loc[-1]!r} is required"
    message = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"{field_path(loc)}: {message}" if loc else message


def one_line(exc: BaseException) -> str:
    """An exception as a single line of at most 300 characters (plus the flag to use when
    transformers asks for ``trust_remote_code=True``, a Python argument the CLI spells
    differently)."""
    full = " ".join(str(exc).split()) or type(exc).__name__
    text = full if len(full) <= 300 else full[:297] + "..."
    if "trust_remote_code" in full:
        text += " [the model needs its own code: pass --trust-remote-code if you trust it]"
    return text


@contextlib.contextmanager
def load_errors(model: str) -> Iterator[None]:
    """Turn any failure of loading ``model`` into a ModelLoadError with a one-line reason."""
    try:
        yield
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"cannot load model {model!r}: {one_line(exc)}") from exc
