"""A rubric judge, served: ``kind: judge``, ``mode: rubric``. Each item's label carries its
rubric (:func:`~reward_server.scoring.rubric.rubric_of`: a malformed one is a 422 naming the
item and the criterion, before anything is queued), and the score is made from the judge's
verdicts by the formulas of :mod:`reward_server.scoring.rubric`.

Rows. With ``aggregation: explicit`` an item has one row per criterion: the entry's Jinja
template rendered with the item's variables (``prompt``, ``response``, ``label``,
``messages``, ``tool_calls``, ``tools``), ``criterion`` (the criterion's text), ``category``
(its category, or None) and ``rubric`` (every criterion: ``text``, ``weight``, ``category``,
``required``), put in one user message of the judge's chat template with the generation
prompt and tokenized, exactly as a ``mode: logprobs`` judge's item is. With ``verdict:
logprobs`` its value is ``p = exp(z_yes) / (exp(z_yes) + exp(z_no))``, the next-token logits
of the two ``verdict_tokens`` (the engines run these rows as a logprobs judge's whose score
tokens are ``{yes: 1, no: 0}``); with ``verdict: generate`` the judge answers and
``verdict_pattern`` reads yes (1) or no (0). With ``aggregation: implicit`` an item has one
generated row whose template reads ``rubric`` (and not ``criterion``); its answer is the
rating. An empty rubric has no row (it scores 1).

Every row goes through the model's scheduler like any judge's (the micro-batcher on the
transformers engine, admission around vLLM), with the score cache keyed by its token ids.
A template that puts ``criterion`` last makes an item's rows share their head (the chat
template's start, the template's head, the prompt and the response): on vLLM the prefix
cache computes that head once and serves it to the item's other rows, which
``reward_server_model_cached_tokens_total`` counts; on transformers each row is a full row of
its pass.

Per item, ``tokens`` is the sum of its rows' tokens and ``truncated`` whether any row was
cut. An item whose generated verdict or rating does not parse fails (``parse_failure``, or
``out_of_range`` for a rating outside ``rating_range``): masked with ``on_error: mask`` (the
default), else that number; it is counted in ``reward_server_verifier_errors_total``. The
categories each item failed are counted in ``reward_server_rubric_items_total`` and
``reward_server_rubric_failed_items_total`` by model and category.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reward_server.errors import EmptyTextError, NotReadyError
from reward_server.scoring.item_result import ItemResult
from reward_server.scoring.items import Items
from reward_server.scoring.rubric import (
    PARSE_FAILURE,
    Criterion,
    explicit_score,
    failed_categories,
    parse_rating,
    parse_verdict,
    rubric_of,
    verdicts,
)
from reward_server.scoring.served import BatchedModel, Tokenized
from reward_server.text.judge_prompt import JUDGE_VARIABLES, item_variables

if TYPE_CHECKING:
    from reward_server.config.entries import RubricJudge
    from reward_server.scoring.judge_model import JudgeScorer
    from reward_server.text.judge_prompt import JudgeTemplate

__all__ = ["RUBRIC_VARIABLES", "RubricJudgeModel", "RubricRow"]

#: The variables a rubric judge's template may use.
RUBRIC_VARIABLES = (*JUDGE_VARIABLES, "criterion", "category", "rubric")
#: The criterion index of an implicit row (it sees every criterion).
IMPLICIT = -1


@dataclass(frozen=True, slots=True)
class RubricRow:
    """One row of a rubric item: its criterion's (or the implicit rating's)."""

    item: int
    criterion: int
    input_ids: list[int]
    num_tokens: int
    truncated: bool


@dataclass(frozen=True, slots=True)
class _RowValue:
    """What a row gave: the probability of yes, or the normalised rating; None with the
    reason when its answer did not parse."""

    value: float | None
    reason: str | None = None


class RubricJudgeModel(BatchedModel):
    """A ``kind: judge``, ``mode: rubric`` entry: its template and its causal LM, one row per
    criterion of each item (explicit) or one per item (implicit)."""

    kind = "judge"

    def __init__(self, spec: RubricJudge, scorer: JudgeScorer, template: JudgeTemplate) -> None:
        super().__init__(spec, scorer)
        self.rubric_spec = spec
        self.judge = scorer
        self.template = template
        self.implicit = spec.aggregation == "implicit"
        self.generates = spec.generates
        self._verdict = re.compile(spec.verdict_regex)
        self._rating = re.compile(spec.rating_pattern)

    @property
    def labels(self) -> list[str]:
        """Its one value: the score."""
        return ["score"]

    # ------------------------------------------------------------------ rows

    def _prepare(
        self, items: Items, *, truncate: bool, max_tokens: int | None
    ) -> tuple[list[tuple[Criterion, ...]], list[RubricRow]]:
        """Each item's rubric, and the rows of every item rendered and tokenized."""
        spec = self.rubric_spec
        labels = items.labels or (None,) * items.count
        rubrics = [
            rubric_of(label, spec.categories, f"model {self.name!r}, item {i}")
            for i, label in enumerate(labels)
        ]
        prompts = self.fitted_prompts(items, self.template.reads)
        variables: list[dict[str, Any]] = []
        where: list[tuple[int, int]] = []
        for i, (prompt, rubric) in enumerate(zip(prompts, rubrics, strict=True)):
            if not rubric:
                continue  # an empty rubric scores 1 without the judge
            shared = {**item_variables(prompt), "rubric": [c.as_variable() for c in rubric]}
            if self.implicit:
                variables.append({**shared, "criterion": None, "category": None})
                where.append((i, IMPLICIT))
                continue
            for j, criterion in enumerate(rubric):
                variables.append(
                    {**shared, "criterion": criterion.text, "category": criterion.category}
                )
                where.append((i, j))
        if not where:
            return rubrics, []
        rendered = self.template.render_variables(variables, "row")
        texts = self.judge.render_prompts(rendered)
        # A request's own limit (max_tokens) always truncates, as for the other models.
        cut = truncate if max_tokens is None else True
        if self.generates:
            # Room for the answer: the prompt at most max_length - max_new_tokens tokens.
            room = self.judge.max_length - spec.max_new_tokens
            max_tokens = room if max_tokens is None else min(max_tokens, room)
        encoded = self.judge.encode(texts, truncate=cut, max_length=max_tokens)
        rows = [
            RubricRow(i, j, list(row.input_ids), row.num_tokens, row.truncated)
            for (i, j), row in zip(where, encoded, strict=True)
        ]
        return rubrics, rows

    def prepare(
        self, items: Items, *, truncate: bool, max_tokens: int | None
    ) -> Sequence[Tokenized]:
        """The rows of every item's criteria (not one per item: see :meth:`score`)."""
        return self._prepare(items, truncate=truncate, max_tokens=max_tokens)[1]

    async def score(
        self, items: Items, *, truncate: bool, max_tokens: int | None, cache: bool = True
    ) -> list[ItemResult]:
        """Read the rubrics and prepare the rows on the tokenizer thread, score the rows
        (through the score cache when it is on), make each item's score from its rows."""
        ctx, scheduler = self._ctx, self.scheduler
        if ctx is None or scheduler is None:
            raise NotReadyError("the model is loading")
        prepare = functools.partial(self._prepare, items, truncate=truncate, max_tokens=max_tokens)
        # The tokenizer thread does not inherit the request's context: give it a copy.
        run = functools.partial(contextvars.copy_context().run, prepare)
        rubrics, rows = await asyncio.get_running_loop().run_in_executor(ctx.tokenizer, run)
        for row in rows:
            if row.num_tokens == 0:
                raise EmptyTextError(
                    f"item {row.item}'s row (criterion {row.criterion}) encodes to no tokens"
                )
        judged = await self._row_results(rows, ctx, scheduler, cache=cache)
        results = self._item_results(rubrics, rows, judged)
        ctx.metrics.on_model_items(self.name, len(results), sum(r.num_tokens for r in results))
        for result in results:
            if result.error is not None:
                ctx.metrics.on_verifier_error(self.name, result.error)
            ctx.metrics.on_rubric_item(self.name, result.failed_categories)
        return results

    def finish(self, prepared: Sequence[Tokenized], values: Sequence[Any]) -> list[ItemResult]:
        """One result per row (not per item): its probability of yes or its normalised
        rating as the score; a generated answer that does not parse has a NaN score and its
        reason as the error (it fails its item, not the request)."""
        if len(values) != len(prepared):
            raise RuntimeError(f"{len(values)} values for {len(prepared)} rows")
        out = []
        for row, value in zip(prepared, values, strict=True):
            got = self._row_value(value)
            out.append(
                ItemResult(
                    score=math.nan if got.value is None else got.value,
                    num_tokens=row.num_tokens,
                    truncated=row.truncated,
                    error=got.reason,
                )
            )
        return out

    def _row_value(self, value: Any) -> _RowValue:
        spec = self.rubric_spec
        if self.implicit:
            low, high = spec.rating_range
            rating, reason = parse_rating(str(value), self._rating, low, high)
            return _RowValue(rating, reason)
        if self.generates:
            verdict = parse_verdict(str(value), self._verdict, spec.verdict_tokens)
            return _RowValue(verdict, None if verdict is not None else PARSE_FAILURE)
        probability = float(value)
        if not math.isfinite(probability):
            # A model failure (as a logprobs judge's): the request's 500, not the item's.
            raise RuntimeError(f"non-finite verdict probability {probability}")
        return _RowValue(probability)

    def _item_results(
        self,
        rubrics: Sequence[tuple[Criterion, ...]],
        rows: Sequence[RubricRow],
        judged: Sequence[ItemResult],
    ) -> list[ItemResult]:
        """Each item's score from its rows' values (:mod:`reward_server.scoring.rubric`)."""
        spec = self.rubric_spec
        threshold = spec.verdict_threshold
        by_item: list[list[tuple[RubricRow, ItemResult]]] = [[] for _ in rubrics]
        for row, result in zip(rows, judged, strict=True):
            by_item[row.item].append((row, result))
        out = []
        for rubric, own in zip(rubrics, by_item, strict=True):
            tokens = sum(row.num_tokens for row, _ in own)
            truncated = any(row.truncated for row, _ in own)
            failure = next((r.error for _, r in own if r.error is not None), None)
            if failure is not None:
                out.append(ItemResult(spec.error_score, tokens, truncated, error=failure))
                continue
            if not rubric:
                none = None if self.implicit else ()
                out.append(ItemResult(1.0, tokens, truncated, criteria=none))
                continue
            if self.implicit:
                out.append(ItemResult(own[0][1].score, tokens, truncated))
                continue
            probabilities = [0.0] * len(rubric)
            for row, result in own:
                probabilities[row.criterion] = result.score
            failed = failed_categories(rubric, probabilities, threshold)
            out.append(
                ItemResult(
                    explicit_score(rubric, probabilities, threshold),
                    tokens,
                    truncated,
                    criteria=verdicts(rubric, probabilities, threshold),
                    failed_categories=tuple(failed.items()),
                )
            )
        return out

    def batch_function(
        self,
    ) -> tuple[Callable[[list[Sequence[int]]], Sequence[Any]], Callable[[Any], Any]]:
        """Each row's probability of yes (the verdict tokens as the score tokens
        ``{yes: 1.0, no: 0.0}``), or its generated answer."""
        if self.generates:
            return self.judge.generate_batch, str
        return self.judge.score_batch, float

    def info(self) -> dict[str, object]:
        """The judge's facts for /info: the model's, and its entry's keys."""
        entry = self.spec.shown()
        facts = dict(self.scorer.info())
        if not self.generates:
            facts["verdict_token_ids"] = facts.pop("score_token_ids", None)
            facts.pop("score_tokens", None)
        own = {"name": self.name, "kind": self.kind, "labels": self.labels}
        return {**facts, **entry, **own}
