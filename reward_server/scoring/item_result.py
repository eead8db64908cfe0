"""One model's result for one item (:class:`ItemResult`), as every kind of served model
gives it and the scoring pipeline combines it. Plain data: no torch, no HTTP."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from reward_server.scoring.rubric import CriterionVerdict

__all__ = ["UNCLOSED_REASONING", "ItemResult"]

#: The failure of an item whose response opened a thinking block and never closed it (the
#: policy ran out of tokens): it has no answer to score.
UNCLOSED_REASONING = "unclosed_reasoning"


@dataclass(frozen=True, slots=True)
class ItemResult:
    """One model's result for one item."""

    #: The model's own score: a sequence model's label logit (or its objectives' weighted
    #: sum), a process model's aggregate over the steps. Raw: before normalize and weight.
    score: float
    num_tokens: int  # tokens the model scored
    truncated: bool
    #: Every value of the row the model gave (named by the model's ``labels``); empty when
    #: the model gives none but the score.
    logits: tuple[float, ...] = ()
    #: Process models: the score of each scored step, where each ends in the response
    #: (character offsets, exclusive), and how many steps truncation cut off.
    step_scores: tuple[float, ...] | None = None
    step_ends: tuple[int, ...] | None = None
    steps_dropped: int = 0
    #: Why this item's reward could not be computed (a verifier's ``timeout``, ``crash``,
    #: ``error``, ``non_finite``, ``bad_result``, ``sandbox_error``; a judge's or remote's
    #: ``parse_failure``, ``remote_error``, ``timeout``; any model's ``deadline``); else None.
    #: ``score`` is then the entry's ``on_error`` number (0.0 when it masks).
    error: str | None = None
    #: True when the item has no score from this model: it failed (``error``) and the entry
    #: masks (``on_error: mask``), or the request's deadline came first. Set by the pipeline.
    masked: bool = False
    #: Verifiers: a python function's values beyond ``score``, a code verifier's tests
    #: ``passed`` and ``total``, by name.
    extras: tuple[tuple[str, float], ...] = ()
    #: Code verifiers: each test's verdict (``passed``, ``wrong_answer``, ...), in the
    #: label's order; None for other models and for an item whose tests could not be read.
    tests: tuple[str, ...] | None = None
    #: Why a verifier scored the item below its best when that is not a failure (a tool_call
    #: verifier's ``wrong_function``, a format verifier's ``no_answer``); else None.
    note: str | None = None
    #: Rubric judges (explicit aggregation): each criterion's verdict, in the rubric's order;
    #: None for other models, for implicit aggregation and for an item that failed.
    criteria: tuple[CriterionVerdict, ...] | None = None
    #: Rubric judges: per category of the item's rubric, whether a criterion of it failed.
    failed_categories: tuple[tuple[str, bool], ...] = ()
