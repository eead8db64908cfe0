"""What a flow yields (:class:`Send`, :class:`Resolve`, :class:`Sleep`, :class:`Gather`)
and the helpers that run flows (:func:`advance`, :func:`results`, :func:`scores`).

A flow (:data:`Flow`) is a generator that yields actions, is sent their outcomes and
returns its result; :mod:`reward_client.flows` writes the client's calls as flows and each
face in :mod:`reward_client.client` executes their actions its own way.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar

from reward_client.attempts import AttemptBudget
from reward_client.results import ScoreResult
from reward_client.targets import Target

__all__ = [
    "Action",
    "Flow",
    "Gather",
    "Resolve",
    "Send",
    "Sleep",
    "advance",
    "results",
    "scores",
]


@dataclass(frozen=True, slots=True)
class Send:
    """Send one HTTP request; the outcome is the ``httpx.Response`` or the transport error."""

    method: str
    url: str
    body: object | None
    #: The server it goes to (its Host header and TLS name for an address found by DNS).
    target: Target | None = None
    #: The attempt's time: told to the server, and the most to wait for its answer.
    budget: AttemptBudget | None = None


@dataclass(frozen=True, slots=True)
class Resolve:
    """Resolve the ``dns+`` base URLs again (blocking I/O); the outcome is None."""


@dataclass(frozen=True, slots=True)
class Sleep:
    """Pause; the outcome is None."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Gather:
    """Run the flows concurrently; the outcome is their results in order (or the first error)."""

    flows: list[Flow[Any]]


Action: TypeAlias = "Send | Resolve | Sleep | Gather"
T = TypeVar("T")
#: A computation that yields actions, is sent their outcomes, and returns a ``T``.
Flow: TypeAlias = Generator[Action, Any, T]


def advance(flow: Flow[Any], outcome: object) -> tuple[bool, Any]:
    """Send ``outcome`` into ``flow``: (False, next action) or (True, the flow's result)."""
    try:
        return False, flow.send(outcome)
    except StopIteration as stop:
        return True, stop.value


def results(futures: Sequence[Any]) -> list[Any]:
    """Results of finished futures or tasks in order; else the first error in chunk order."""
    # Every finished one's exception is retrieved, so that asyncio reports none as unretrieved.
    errors = [f.exception() for f in futures if f.done() and not f.cancelled()]
    for error in errors:
        if error is not None:
            raise error
    return [f.result() for f in futures]


def scores(flow: Flow[ScoreResult]) -> Flow[list[float | None]]:
    """Only the scores of a scoring flow."""
    result = yield from flow
    return result.scores
