"""A request's results as the scoring pipeline returns them: the answer's scores and each
scoring model's own results, with the views the routes answer with (components, objectives,
verifier errors, test verdicts, rubric criteria, process steps).

A masked item (its reward could not be computed: a failure of a model whose entry masks, or
the request's deadline) has None for a score, wherever the score is shown, and its reason in
:meth:`Scored.masked`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from reward_server.scoring.item_result import ItemResult

__all__ = ["Scored"]


@dataclass(frozen=True, slots=True)
class Scored:
    """A request's results: the answer's scores and every scoring model's own results."""

    #: The name answers carry: the one scoring model's, or the models' joined by "+".
    name: str
    #: The combined score per item (the named model's own score when a request names one);
    #: None for a masked item.
    scores: list[float | None]
    #: Each scoring model's results, by name in the models file's order.
    results: dict[str, list[ItemResult]]
    #: The names of each scoring model's ``logits``.
    labels: dict[str, list[str]]
    #: The combined score of the sequence models alone, when a process model scored too.
    outcome_scores: list[float | None] | None = None
    #: Per item: why it is masked (the reason of the first model, in the models file's
    #: order, that masks it), None where it is not; empty when no item is.
    reasons: tuple[str | None, ...] = ()

    def masked(self) -> list[str | None] | None:
        """Per item the reason it is masked (None where it is not); None when none is."""
        if not any(reason is not None for reason in self.reasons):
            return None
        return list(self.reasons)

    @property
    def tokens(self) -> list[int]:
        """Per item: the most tokens any scoring model used."""
        return [max(r.num_tokens for r in rs) for rs in zip(*self.results.values(), strict=True)]

    @property
    def truncated(self) -> list[bool]:
        """Per item: whether any scoring model truncated it."""
        return [any(r.truncated for r in rs) for rs in zip(*self.results.values(), strict=True)]

    def components(self) -> dict[str, list[float | None]]:
        """Each scoring model's own score per item (None where it masked the item)."""
        return {
            name: [None if r.masked else r.score for r in rs] for name, rs in self.results.items()
        }

    def objectives(self) -> dict[str, list[float | None]] | None:
        """Every label's raw logit of every scoring model with several labels, by label name
        (``model/label`` when several models scored); None when no model has several. A
        model's masked items have None."""
        several = len(self.results) > 1
        out: dict[str, list[float | None]] = {}
        for name, results in self.results.items():
            labels = self.labels[name]
            if len(labels) < 2:
                continue
            for j, label in enumerate(labels):
                out[f"{name}/{label}" if several else label] = [
                    None if r.masked else r.logits[j] for r in results
                ]
        for name, results in self.results.items():
            # A python verifier's values beyond its score, where every unmasked item has them.
            kept = [set(dict(r.extras)) for r in results if not r.masked]
            common = set.intersection(*kept) if kept else set()
            for key in sorted(common):
                out[f"{name}/{key}" if several else key] = [
                    None if r.masked else dict(r.extras)[key] for r in results
                ]
        return out or None

    def verifier_errors(self) -> dict[str, list[str | None]] | None:
        """Per model that failed on any item, or whose verifier said why it scored an item
        below its best: each item's reason (the failure's, else the note; None where
        neither); None when no model has one."""
        out = {
            name: [r.error or r.note for r in results]
            for name, results in self.results.items()
            if any(r.error is not None or r.note is not None for r in results)
        }
        return out or None

    def tests(self) -> dict[str, list[list[str] | None]] | None:
        """Per code verifier: each item's test verdicts (None for an item whose tests could
        not be read); None when no code verifier scored."""
        out = {
            name: [None if r.tests is None else list(r.tests) for r in results]
            for name, results in self.results.items()
            if any(r.tests is not None for r in results)
        }
        return out or None

    def criteria(self) -> dict[str, list[list[dict[str, object]] | None]] | None:
        """Per rubric judge with explicit aggregation: each item's criteria verdicts, in its
        rubric's order (verdict, probability, weight, category, required; None for an item
        that failed); None when no such judge scored."""
        out = {
            name: [
                None if r.criteria is None else [dataclasses.asdict(c) for c in r.criteria]
                for r in results
            ]
            for name, results in self.results.items()
            if any(r.criteria is not None for r in results)
        }
        return out or None

    def steps(self) -> list[ItemResult] | None:
        """The results of the process model that scored, if one did."""
        for results in self.results.values():
            if results and results[0].step_scores is not None:
                return results
        return None
