"""The exception types the server's layers raise (no dependencies: rendering, engines and the
batcher raise them without knowing HTTP; :mod:`reward_server.http.errors` maps them to answers)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

__all__ = [
    "BatcherClosedError",
    "ChatTemplateError",
    "ClientDisconnectedError",
    "EmptyTextError",
    "ModelLoadError",
    "ModelNotFoundError",
    "NotReadyError",
    "QueueFullError",
    "ResponseNotFoundError",
    "ScoringError",
    "StepsTruncatedError",
    "TextTooLongError",
    "TooManyItemsError",
    "UnauthorizedError",
    "UnknownModelError",
    "field_path",
    "load_errors",
    "one_line",
]


class ModelLoadError(RuntimeError):
    """The model, tokenizer or adapter could not be loaded; ``str(e)`` is a one-line reason."""


class ChatTemplateError(ValueError):
    """A pair or conversation needs a chat template that is missing or fails to render."""


class PolicyTemplateError(ValueError):
    """A text is not in the policy's chat template; ``str(e)`` says what did not match."""


class TextTooLongError(ValueError):
    """A text is longer than ``max_length`` while truncation is off."""

    def __init__(self, index: int, num_tokens: int, max_length: int) -> None:
        super().__init__(
            f"text {index} has {num_tokens} tokens, more than max_length {max_length} "
            "(truncation is off)"
        )
        self.index = index
        self.num_tokens = num_tokens
        self.max_length = max_length


class ResponseNotFoundError(ValueError):
    """A process reward model cannot find an item's response: texts (no response to split),
    a conversation that does not end with the assistant, a chat template that changes it."""


class StepsTruncatedError(ValueError):
    """Truncation cut every step of an item's response: no step is left to score."""


class QueueFullError(RuntimeError):
    """The queue cannot admit the request now; retry after ``retry_after`` seconds."""

    def __init__(self, retry_after: float, message: str | None = None) -> None:
        super().__init__(message or f"queue full, retry after {retry_after:.2f}s")
        self.retry_after = retry_after


class BatcherClosedError(RuntimeError):
    """The batcher is not running (not started, or stopping)."""


class TooManyItemsError(ValueError):
    """A request carries more items than the server accepts at once."""


class EmptyTextError(ValueError):
    """An item tokenizes to nothing, so there is no token to read a score from."""


class UnauthorizedError(PermissionError):
    """Missing or wrong API key."""


class ModelNotFoundError(LookupError):
    """A request names a model this server does not serve (``param``: the field)."""

    param = "model"


class UnknownModelError(LookupError):
    """A /score request names a model this server does not serve (the message lists them)."""

    param = "model"


class NotReadyError(RuntimeError):
    """The model is still loading (the lifespan has not finished starting)."""


class ScoringError(RuntimeError):
    """The model failed on a request (details are logged, never sent)."""


class ClientDisconnectedError(ConnectionError):
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
