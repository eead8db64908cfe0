"""Rubrics as rewards (``kind: judge``, ``mode: rubric``): an item's criteria read from its
label, and the score made from the judge's verdicts. Plain Python: no torch, no HTTP (the
served model is :mod:`reward_server.scoring.rubric_model`).

The label of an item is its rubric: a list of criteria, or a mapping whose ``rubric`` key
holds that list (its other keys, e.g. a reference answer, are the template's ``label`` to
read). A criterion is a mapping::

    {"text": "Names the capital of France", "category": "essential"}
    {"text": "Claims Lyon is the capital", "weight": -2.0, "required": false}

``text`` (required, a non-empty string), ``weight`` (a finite number) and/or ``category`` (a
name of the entry's ``categories``; its weight there unless ``weight`` is given too), and
``required`` (default false); a key whose value is null counts as absent (a dataset's
table fills the keys other criteria have with null). A criterion with a negative weight is a *pitfall*: its text
says what the response must not do, and the judge's "yes" means the response did it.

The verdict of criterion ``j``: ``v_j`` in [0, 1], the judge's probability that the answer is
yes (``verdict: logprobs``: the first verdict token's probability renormalised over the two;
``verdict: generate``: 1 or 0, the parsed answer). Criterion ``j`` is *met* when
``v_j >= t`` (``verdict_threshold``, 0.5). It *fails* when it is not met and its weight is
not negative, or when it is met and its weight is negative (the pitfall was committed).

Explicit aggregation (``aggregation: explicit``), with ``P`` the sum of the positive weights
and ``N`` the sum of the pitfalls' ``|w_j|``::

    P > 0:           score = sum_j w_j v_j / P                 in [-N / P, 1]
    P = 0, N > 0:    score = 1 - sum_j |w_j| v_j / N           in [0, 1]   (pitfalls only)
    P = 0, N = 0:    score = 1                                 (an empty rubric: nothing failed)

so a response that meets every positive criterion and commits no pitfall scores 1. When a
``required`` criterion fails, the score is the rubric's minimum instead: ``-N / P`` when
``P > 0``, else 0.

Implicit aggregation (``aggregation: implicit``): one generated answer per item that sees the
whole rubric; the number ``x`` that ``score_pattern`` captures is normalised with
``rating_range: [lo, hi]`` to ``(x - lo) / (hi - lo)`` in [0, 1]. An answer with no number
fails with :data:`PARSE_FAILURE`, a number outside ``[lo, hi]`` with :data:`OUT_OF_RANGE`.
An empty rubric scores 1 without asking the judge, as in explicit aggregation.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from reward_client.wire.openai_chat import parse_score
from reward_server.config.entries import DEFAULT_CATEGORIES
from reward_server.errors import LabelError

__all__ = [
    "DEFAULT_CATEGORIES",
    "OUT_OF_RANGE",
    "PARSE_FAILURE",
    "UNCATEGORISED",
    "Criterion",
    "CriterionVerdict",
    "explicit_score",
    "failed_categories",
    "fails",
    "minimum_score",
    "parse_rating",
    "parse_verdict",
    "rubric_of",
    "verdicts",
]

#: The category in metrics of a criterion given by weight alone.
UNCATEGORISED = "uncategorised"
#: The reason of an item whose judge's answer held no verdict or no rating.
PARSE_FAILURE = "parse_failure"
#: The reason of an item whose implicit rating lies outside ``rating_range``.
OUT_OF_RANGE = "out_of_range"

_KEYS = ("text", "weight", "category", "required")


@dataclass(frozen=True, slots=True)
class Criterion:
    """One criterion of an item's rubric, its weight resolved."""

    text: str
    weight: float
    #: The category it was given (None: by weight alone).
    category: str | None = None
    required: bool = False

    @property
    def pitfall(self) -> bool:
        """Whether a "yes" counts against the response (a negative weight)."""
        return self.weight < 0

    def as_variable(self) -> dict[str, Any]:
        """What a template reads of it (in ``rubric``): its keys as a label gives them."""
        return {key: getattr(self, key) for key in _KEYS}


@dataclass(frozen=True, slots=True)
class CriterionVerdict:
    """The judge's verdict on one criterion of one item, as the answer shows it."""

    #: Whether the judge said yes (``probability >= verdict_threshold``).
    verdict: bool
    #: The judge's probability of yes (1 or 0 for a generated verdict).
    probability: float
    weight: float
    category: str | None
    required: bool


def _problem(where: str, what: str) -> LabelError:
    return LabelError(f"{where}: {what}")


def rubric_of(label: Any, categories: Mapping[str, float], where: str) -> tuple[Criterion, ...]:
    """The criteria of one item's ``label`` (module docstring); LabelError starting with
    ``where`` (the model and the item) naming what is wrong."""
    criteria = label.get("rubric") if isinstance(label, dict) else label
    if label is None:
        raise _problem(
            where, 'no label: send its rubric (a list of criteria, or {"rubric": [...]})'
        )
    if isinstance(label, dict) and "rubric" not in label:
        raise _problem(where, "the label has no 'rubric' key (a list of criteria)")
    if not isinstance(criteria, list):
        kind = type(criteria).__name__
        raise _problem(where, f"the rubric is a {kind}, not a list of criteria")
    return tuple(
        _criterion(c, categories, f"{where}, criterion {j}") for j, c in enumerate(criteria)
    )


def _criterion(value: Any, categories: Mapping[str, float], where: str) -> Criterion:
    if not isinstance(value, dict):
        raise _problem(where, f"a {type(value).__name__}, not a mapping with text and weight")
    unknown = [str(k) for k in value if k not in _KEYS]
    if unknown:
        raise _problem(where, f"unknown key(s) {', '.join(unknown)}; a criterion has {_KEYS}")
    text = value.get("text")
    if not isinstance(text, str) or not text.strip():
        raise _problem(where, "'text' must be a non-empty string")
    category = value.get("category")
    weight = value.get("weight")
    if category is not None and (not isinstance(category, str) or category not in categories):
        known = ", ".join(categories) or "none"
        raise _problem(where, f"unknown category {category!r} (the model's: {known})")
    if weight is None:
        if category is None:
            raise _problem(where, "give a 'weight' or a 'category'")
        weight = categories[category]
    elif isinstance(weight, bool) or not isinstance(weight, int | float):
        raise _problem(where, f"'weight' must be a number, not {weight!r}")
    elif not math.isfinite(weight):
        raise _problem(where, "'weight' must be finite")
    required = value.get("required")
    required = False if required is None else required
    if not isinstance(required, bool):
        raise _problem(where, f"'required' must be true or false, not {required!r}")
    return Criterion(text, float(weight), category, required)


def fails(criterion: Criterion, probability: float, threshold: float) -> bool:
    """Whether the verdict fails the criterion: a pitfall said yes, any other said no."""
    met = probability >= threshold
    return met if criterion.pitfall else not met


def minimum_score(criteria: Sequence[Criterion]) -> float:
    """The least explicit score of the rubric: ``-N / P``, or 0 without positive weights."""
    positive = math.fsum(c.weight for c in criteria if c.weight > 0)
    pitfalls = math.fsum(-c.weight for c in criteria if c.weight < 0)
    return -pitfalls / positive if positive > 0 else 0.0


def explicit_score(
    criteria: Sequence[Criterion], probabilities: Sequence[float], threshold: float
) -> float:
    """The explicit aggregation of the verdicts (module docstring)."""
    if len(criteria) != len(probabilities):
        raise ValueError(f"{len(probabilities)} verdicts for {len(criteria)} criteria")
    pairs = list(zip(criteria, probabilities, strict=True))
    if any(c.required and fails(c, p, threshold) for c, p in pairs):
        return minimum_score(criteria)
    positive = math.fsum(c.weight for c in criteria if c.weight > 0)
    pitfalls = math.fsum(-c.weight for c in criteria if c.weight < 0)
    # Zero weights count in neither sum: such a criterion is reported, never scored.
    weighted = math.fsum(c.weight * p for c, p in pairs)
    if positive > 0:
        return weighted / positive
    if pitfalls > 0:
        return 1.0 + weighted / pitfalls  # weighted <= 0 here: 1 - sum |w| v / N
    return 1.0


def verdicts(
    criteria: Sequence[Criterion], probabilities: Sequence[float], threshold: float
) -> tuple[CriterionVerdict, ...]:
    """Each criterion's verdict as the answer shows it."""
    return tuple(
        CriterionVerdict(p >= threshold, p, c.weight, c.category, c.required)
        for c, p in zip(criteria, probabilities, strict=True)
    )


def failed_categories(
    criteria: Sequence[Criterion], probabilities: Sequence[float], threshold: float
) -> dict[str, bool]:
    """Per category the item's rubric has (:data:`UNCATEGORISED` for criteria given by
    weight alone): whether any of its criteria failed."""
    out: dict[str, bool] = {}
    for c, p in zip(criteria, probabilities, strict=True):
        name = c.category or UNCATEGORISED
        out[name] = out.get(name, False) or fails(c, p, threshold)
    return out


def parse_verdict(answer: str, pattern: re.Pattern[str], tokens: tuple[str, str]) -> float | None:
    """A generated verdict: 1.0 when the first match of ``pattern`` captures the first verdict
    token (case and surrounding spaces ignored), 0.0 for the second, None otherwise."""
    found = pattern.search(answer)
    if found is None or found.group(1) is None:
        return None
    said = found.group(1).strip().casefold()
    yes, no = (t.strip().casefold() for t in tokens)
    if said == yes:
        return 1.0
    if said == no:
        return 0.0
    return None


def parse_rating(
    answer: str, pattern: re.Pattern[str], low: float, high: float
) -> tuple[float | None, str | None]:
    """An implicit rating normalised to [0, 1] (``(x - low) / (high - low)``), or None with
    the reason: :data:`PARSE_FAILURE` (no finite number) or :data:`OUT_OF_RANGE`."""
    rating = parse_score(answer, pattern)
    if rating is None:
        return None, PARSE_FAILURE
    if not low <= rating <= high:
        return None, OUT_OF_RANGE
    return (rating - low) / (high - low), None
