"""A request's results as the scoring pipeline returns them: the answer's scores and each
scoring model's own results, with the views the routes answer with (components, objectives,
verifier errors, test verdicts, process steps)."""

from __future__ import annotations

from dataclasses import dataclass

from reward_server.scoring.served import ItemResult

__all__ = ["Scored"]


@dataclass(frozen=True, slots=True)
class Scored:
    """A request's results: the answer's scores and every scoring model's own results."""

    #: The name answers carry: the one scoring model's, or the models' joined by "+".
    name: str
    #: The combined score per item (the named model's own score when a request names one).
    scores: list[float]
    #: Each scoring model's results, by name in the models file's order.
    results: dict[str, list[ItemResult]]
    #: The names of each scoring model's ``logits``.
    labels: dict[str, list[str]]
    #: The combined score of the sequence models alone, when a process model scored too.
    outcome_scores: list[float] | None = None

    @property
    def tokens(self) -> list[int]:
        """Per item: the most tokens any scoring model used."""
        return [max(r.num_tokens for r in rs) for rs in zip(*self.results.values(), strict=True)]

    @property
    def truncated(self) -> list[bool]:
        """Per item: whether any scoring model truncated it."""
        return [any(r.truncated for r in rs) for rs in zip(*self.results.values(), strict=True)]

    def components(self) -> dict[str, list[float]]:
        """Each scoring model's own score per item."""
        return {name: [r.score for r in rs] for name, rs in self.results.items()}

    def objectives(self) -> dict[str, list[float]] | None:
        """Every label's raw logit of every scoring model with several labels, by label name
        (``model/label`` when several models scored); None when no model has several."""
        several = len(self.results) > 1
        out: dict[str, list[float]] = {}
        for name, results in self.results.items():
            labels = self.labels[name]
            if len(labels) < 2:
                continue
            for j, label in enumerate(labels):
                out[f"{name}/{label}" if several else label] = [r.logits[j] for r in results]
        for name, results in self.results.items():
            # A python verifier's values beyond its score, where every item has them.
            common = set.intersection(*(set(dict(r.extras)) for r in results)) if results else set()
            for key in sorted(common):
                out[f"{name}/{key}" if several else key] = [dict(r.extras)[key] for r in results]
        return out or None

    def verifier_errors(self) -> dict[str, list[str | None]] | None:
        """Per verifier that failed on any item: each item's reason (None where it did not
        fail); None when no verifier failed."""
        out = {
            name: [r.error for r in results]
            for name, results in self.results.items()
            if any(r.error is not None for r in results)
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

    def steps(self) -> list[ItemResult] | None:
        """The results of the process model that scored, if one did."""
        for results in self.results.values():
            if results and results[0].step_scores is not None:
                return results
        return None
