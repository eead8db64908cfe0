"""A pairwise judge, served: ``kind: judge``, ``mode: pairwise``. It scores the responses of
each of a request's groups (:data:`~reward_server.scoring.groups.current_groups`; a request
to it without groups is a 422 before it is asked) by comparing them two at a time.

For each group, the pairs :func:`~reward_server.scoring.pairwise.unordered_pairs` chooses
(``pairs: all`` or ``k``) are judged in both orders. The row of an ordered pair ``(i, j)`` is
the entry's Jinja template rendered with ``prompt`` and ``messages`` (the group's shared
prompt), ``response_a`` (``i``'s response), ``response_b`` (``j``'s) and ``label`` (the label
of the group's first item: one label per group, the same in both orders), put in one user
message of the judge's chat template with the generation prompt, and tokenized, exactly as a
``mode: logprobs`` judge's item is. Its value is

    p_ij = exp(z_A) / (exp(z_A) + exp(z_B))

with ``z_A``, ``z_B`` the next-token logits of the two ``answer_tokens`` after the row: the
probability that the first response shown is the better. These rows are ``mode: logprobs``
rows whose score tokens are ``{A: 1.0, B: 0.0}``, so both engines run them as they run a
logprobs judge's (:mod:`reward_server.engines._judge`, :mod:`reward_server.engines._vllm_judge`),
through the model's scheduler, with the score cache keyed by their token ids (a row repeated
within or across requests is computed once). The per-response scores are made from the
``p_ij`` by ``aggregate`` (``win_rate`` or ``bradley_terry``,
:mod:`reward_server.scoring.pairwise`).

The shared prompt prefix: on vLLM the prefix cache computes a group's common prefix (chat
template, template head, the prompt, and in ``pairs: all`` every row that shows the same
``response_a``) once; on transformers each row is a full right-padded row of its micro-batch
(no KV sharing between rows: the rows of a pass are computed together, and identical rows
only once, through the score cache).

An item alone in its group (one the request's groups leave out, or a group of one) has no
opponent: it fails with the reason ``no_opponent``, and so does an item one of whose pairs
came back non-finite (``non_finite``); with ``on_error: mask`` (the default) it is masked,
with a number it scores that number. Per item, ``tokens`` is the sum of the tokens of the rows
that show its response first (so the items' tokens add up to the rows'), and ``truncated``
says whether any row showing its response was cut.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from reward_server.errors import EmptyTextError, GroupsError, NotReadyError
from reward_server.scoring.groups import current_groups, group_of
from reward_server.scoring.item_result import ItemResult
from reward_server.scoring.items import Items
from reward_server.scoring.pairwise import aggregate, ordered_rows, unordered_pairs
from reward_server.scoring.served import BatchedModel, Tokenized
from reward_server.text.judge_prompt import JudgePrompt

if TYPE_CHECKING:
    from reward_server.config.entries import PairwiseJudge
    from reward_server.scoring.judge_model import JudgeScorer
    from reward_server.text.judge_prompt import JudgeTemplate

__all__ = ["PAIRWISE_VARIABLES", "PairRow", "PairwiseJudgeModel"]

#: The variables a pairwise judge's template may use.
PAIRWISE_VARIABLES = ("prompt", "response_a", "response_b", "label", "messages")


@dataclass(frozen=True, slots=True)
class PairRow:
    """The row of one ordered pair: ``first``'s response shown as A, ``second``'s as B."""

    first: int
    second: int
    input_ids: list[int]
    num_tokens: int
    truncated: bool


class PairwiseJudgeModel(BatchedModel):
    """A ``kind: judge``, ``mode: pairwise`` entry: its template and its causal LM, one row
    per ordered pair of each group."""

    kind = "judge"

    def __init__(self, spec: PairwiseJudge, scorer: JudgeScorer, template: JudgeTemplate) -> None:
        super().__init__(spec, scorer)
        self.judge = scorer
        self.template = template

    @property
    def labels(self) -> list[str]:
        """Its one value: the score."""
        return ["score"]

    def _same_prompt(self, prompts: Sequence[JudgePrompt], group: Sequence[int]) -> None:
        """GroupsError unless every item of ``group`` has the first's messages before its
        response (agent trajectories of one task may differ there: a pairwise judge shows one
        prompt and two final responses, so it compares those only)."""
        first = prompts[group[0]]
        for index in group[1:]:
            if prompts[index].messages != first.messages or prompts[index].prompt != first.prompt:
                raise GroupsError(
                    f"model {self.name!r} compares responses to one prompt: item {index}'s "
                    f"messages before its response differ from item {group[0]}'s (agent "
                    "trajectories); send them in groups of their own, or score them with a "
                    "judge that reads the whole trajectory"
                )

    def prepare(self, items: Items, *, truncate: bool, max_tokens: int | None) -> Sequence[PairRow]:
        """The rows of the ordered pairs of the request's groups (read from
        :data:`~reward_server.scoring.groups.current_groups`), rendered and tokenized."""
        prompts = self.fitted_prompts(items, self.template.reads)
        variables: list[dict[str, Any]] = []
        pairs: list[tuple[int, int]] = []
        for group in group_of(current_groups.get(), items.count):
            shared = prompts[group[0]]
            self._same_prompt(prompts, group)
            for i, j in ordered_rows(unordered_pairs(group, self.spec.pairs)):
                pairs.append((i, j))
                variables.append(
                    {
                        "prompt": shared.prompt,
                        "messages": shared.messages,
                        "label": shared.label,
                        "response_a": prompts[i].response,
                        "response_b": prompts[j].response,
                    }
                )
        if not pairs:
            return []
        texts = self.judge.render_prompts(self.template.render_variables(variables, "pair"))
        cut = truncate if max_tokens is None else True
        encoded = self.judge.encode(texts, truncate=cut, max_length=max_tokens)
        return [
            PairRow(i, j, list(row.input_ids), row.num_tokens, row.truncated)
            for (i, j), row in zip(pairs, encoded, strict=True)
        ]

    async def score(
        self, items: Items, *, truncate: bool, max_tokens: int | None, cache: bool = True
    ) -> list[ItemResult]:
        """Prepare the pairs' rows on the tokenizer thread, score them (through the score
        cache when it is on), make each item's score from its group's judgements."""
        ctx, scheduler = self._ctx, self.scheduler
        if ctx is None or scheduler is None:
            raise NotReadyError("the model is loading")
        groups = group_of(current_groups.get(), items.count)
        prepare = functools.partial(self.prepare, items, truncate=truncate, max_tokens=max_tokens)
        # The tokenizer thread does not inherit the request's context: give it a copy.
        run = functools.partial(contextvars.copy_context().run, prepare)
        prepared = await asyncio.get_running_loop().run_in_executor(ctx.tokenizer, run)
        for row in prepared:
            if row.num_tokens == 0:
                raise EmptyTextError(f"the pair ({row.first}, {row.second}) encodes to no tokens")
        judged = await self._row_results(prepared, ctx, scheduler, cache=cache)
        results = self._item_results(items.count, groups, prepared, judged)
        ctx.metrics.on_model_items(self.name, len(results), sum(r.num_tokens for r in results))
        return results

    def finish(self, prepared: Sequence[Tokenized], values: Sequence[Any]) -> list[ItemResult]:
        """One result per row (not per item): the row's ``p_ij`` as its score (a non-finite
        value is kept: it fails its pair's items, not the request)."""
        if len(values) != len(prepared):
            raise RuntimeError(f"{len(values)} values for {len(prepared)} rows")
        return [
            ItemResult(score=float(value), num_tokens=row.num_tokens, truncated=row.truncated)
            for row, value in zip(prepared, values, strict=True)
        ]

    def _item_results(
        self,
        count: int,
        groups: Sequence[Sequence[int]],
        prepared: Sequence[PairRow],
        judged: Sequence[ItemResult],
    ) -> list[ItemResult]:
        """Each item's score from its group's ``p_ij`` (module docstring), or its failure."""
        first_better = {
            (row.first, row.second): r.score for row, r in zip(prepared, judged, strict=True)
        }
        made = aggregate(groups, self.spec.pairs, first_better, self.spec.pairwise_aggregate)
        tokens = [0] * count
        truncated = [False] * count
        for row in prepared:
            tokens[row.first] += row.num_tokens
            if row.truncated:
                truncated[row.first] = truncated[row.second] = True
        return [
            ItemResult(
                score=made.scores.get(k, self.spec.error_score),
                num_tokens=tokens[k],
                truncated=truncated[k],
                error=made.failed.get(k),
            )
            for k in range(count)
        ]

    def batch_function(
        self,
    ) -> tuple[Callable[[list[Sequence[int]]], Sequence[Any]], Callable[[Any], Any]]:
        """Each row's probability that its first response is the better (the answer tokens
        as the score tokens ``{A: 1.0, B: 0.0}``)."""
        return self.judge.score_batch, float

    def info(self) -> dict[str, object]:
        """The judge's facts for /info: the model's, its mode, answer tokens, pairs,
        aggregate, on_error and template."""
        entry = self.spec.shown()
        facts = dict(self.scorer.info())
        facts["answer_token_ids"] = facts.pop("score_token_ids", None)
        facts.pop("score_tokens", None)
        own = {"name": self.name, "kind": self.kind, "labels": self.labels}
        return {**facts, **entry, **own}
