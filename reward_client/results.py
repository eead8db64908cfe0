"""What the clients hand back: :class:`ScoreResult` per call, :class:`RetryEvent` per retry."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reward_client.errors import RewardClientError

__all__ = ["BREAKDOWN", "UNKNOWN_REASON", "RetryEvent", "ScoreResult", "merge"]

#: The optional breakdown fields of a ``/score`` answer (ScoreResult's names).
BREAKDOWN = (
    "components",
    "objectives",
    "step_scores",
    "step_ends",
    "steps_dropped",
    "outcome_scores",
    "criteria",
)

#: The reason of a masked item whose answer says only that it is masked (a ``null`` score
#: without a reason, the ``X-Reward-Masked`` header of the vLLM and TEI routes, OpenRLHF's
#: ``extra_logs["masked"]``).
UNKNOWN_REASON = "unknown"


@dataclass(frozen=True)
class ScoreResult:
    """Scores in input order, with the number of tokens scored and truncation per item.

    A score is None where the server *masked* the item: its reward could not be computed
    (a verifier that timed out or crashed, a judge answer that did not parse, a remote
    reward service that failed, the request's deadline...). Such an item is no evidence
    about the response: leave it out of whatever the scores feed, never count it as 0.
    ``masked`` gives each item's reason (``timeout``, ``crash``, ``error``, ``non_finite``,
    ``bad_result``, ``parse_failure``, ``remote_error``, ``deadline``, ``sandbox_error``;
    :data:`UNKNOWN_REASON` where the answer gives none) or None for a scored item; it is
    None itself when no item is masked.

    The breakdown of a composite server (one list entry per item; None where the server
    sent none, and always None for protocols other than remote-reward): ``components``
    (model name -> its own scores), ``objectives`` (label name -> raw logits),
    ``step_scores`` and ``step_ends`` (per item, a process model's score of each step and
    the code-point offset into the response where that step ends), ``steps_dropped``
    (steps lost to truncation), ``outcome_scores`` (the sequence models' aggregate) and
    ``criteria`` (rubric judge name -> per item its criteria's verdicts in rubric order, each
    ``{"verdict", "probability", "weight", "category", "required"}``; None for an item the
    judge failed on).
    """

    scores: list[float | None]
    tokens: list[int]
    truncated: list[bool]
    components: dict[str, list[float | None]] | None = None
    objectives: dict[str, list[float]] | None = None
    step_scores: list[list[float]] | None = None
    step_ends: list[list[int]] | None = None
    steps_dropped: list[int] | None = None
    outcome_scores: list[float | None] | None = None
    masked: list[str | None] | None = None
    criteria: dict[str, list[list[dict[str, Any]] | None]] | None = None

    def __len__(self) -> int:
        return len(self.scores)

    @property
    def masked_count(self) -> int:
        """How many items the server masked (their score is None)."""
        return sum(score is None for score in self.scores)

    def masked_reasons(self) -> dict[str, int]:
        """How many items were masked for each reason (empty when none was)."""
        counts: dict[str, int] = {}
        for score, reason in zip(self.scores, self.masked or [None] * len(self), strict=True):
            if score is None:
                key = reason or UNKNOWN_REASON
                counts[key] = counts.get(key, 0) + 1
        return counts

    @property
    def truncated_frac(self) -> float:
        """Fraction of items the server truncated (0.0 for an empty result)."""
        return sum(self.truncated) / len(self.truncated) if self.truncated else 0.0


@dataclass(frozen=True, slots=True)
class RetryEvent:
    """A failed attempt that will be tried again; passed to the clients' ``on_retry`` hook.

    ``waited_s`` is the time since the request was first sent, out of ``budget_s``;
    ``next_delay_s`` the pause before the next try (0: at once), on ``next_url``.
    """

    method: str
    url: str
    error: str
    status: int | None
    attempt: int
    waited_s: float
    budget_s: float
    next_delay_s: float
    next_url: str


def merge(results: Sequence[ScoreResult]) -> ScoreResult:
    """Concatenate per-chunk results in chunk order (the breakdown and the mask reasons too)."""
    breakdown: dict[str, Any] = {}
    for key in BREAKDOWN:
        parts = [getattr(r, key) for r in results]
        present = [p is not None for p in parts]
        if not any(present):
            continue
        if key == "criteria":  # a chunk whose items the judge all failed on has none
            parts = [p if p is not None else {} for p in parts]
            names = list(dict.fromkeys(n for p in parts for n in p))
            breakdown[key] = {
                n: [
                    v
                    for p, r in zip(parts, results, strict=True)
                    for v in p.get(n, [None] * len(r))
                ]
                for n in names
            }
            continue
        if not all(present):
            raise RewardClientError(f"some chunks' answers have {key} and others not")
        if isinstance(parts[0], dict):
            names = list(parts[0])
            if any(list(p) != names for p in parts):
                raise RewardClientError(f"the chunks' answers name different {key}")
            breakdown[key] = {n: [v for p in parts for v in p[n]] for n in names}
        else:
            breakdown[key] = [v for p in parts for v in p]
    masked: list[str | None] | None = None
    if any(r.masked is not None for r in results):
        masked = [m for r in results for m in (r.masked or [None] * len(r))]
    return ScoreResult(
        scores=[s for r in results for s in r.scores],
        tokens=[t for r in results for t in r.tokens],
        truncated=[t for r in results for t in r.truncated],
        masked=masked,
        **breakdown,
    )
