"""Grading one item with an OpenAI grader object: the parts that need no model.

A grader is a set of *leaves* (a ``multi`` grader's ``graders`` by name; any other grader is
one leaf, named by its ``name``) and a way to combine their scores (``multi``: its formula;
else the leaf's score). :class:`LocalGrader` scores the leaves that need no model
(``string_check``, ``text_similarity``, ``python``) in a worker process;
:func:`model_messages` and :func:`parse_model_answer` are the two ends of a model leaf
(``score_model``, ``label_model``), whose call the scoring layer makes; :func:`combine` makes
the reward. Every failure is a :class:`~reward_server.verifiers.graders.errors.GradeFailure`
with OpenAI's flag.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from reward_server.config.graders import (
    GraderObject,
    LabelModelGrader,
    LeafGrader,
    MultiGrader,
    PythonGrader,
    ScoreModelGrader,
    StringCheckGrader,
    TextSimilarityGrader,
)
from reward_server.verifiers.graders.errors import GradeFailure
from reward_server.verifiers.graders.python_sandbox import GraderLimits, PythonSandbox
from reward_server.verifiers.graders.similarity import similarity
from reward_server.verifiers.graders.templates import public_sample, render

__all__ = [
    "LocalGrader",
    "combine",
    "leaves",
    "local_leaves",
    "model_leaves",
    "model_messages",
    "parse_model_answer",
    "string_check",
]


def leaves(grader: GraderObject) -> dict[str, LeafGrader]:
    """The grader's leaves by name: a multi grader's graders, else the grader itself."""
    if isinstance(grader, MultiGrader):
        return dict(grader.graders)
    return {grader.name: grader}


def local_leaves(grader: GraderObject) -> dict[str, LeafGrader]:
    """The leaves that need no model."""
    return {name: leaf for name, leaf in leaves(grader).items() if not leaf.MODEL}


def model_leaves(grader: GraderObject) -> dict[str, ScoreModelGrader | LabelModelGrader]:
    """The leaves a model answers (score_model, label_model)."""
    return {name: leaf for name, leaf in leaves(grader).items() if leaf.MODEL}  # type: ignore[misc]


def string_check(operation: str, text: str, reference: str) -> float:
    """OpenAI's string_check: eq, ne, like (contains), ilike (contains, any case)."""
    if operation == "eq":
        return float(text == reference)
    if operation == "ne":
        return float(text != reference)
    if operation == "like":
        return float(reference in text)
    return float(reference.lower() in text.lower())


def combine(grader: GraderObject, scores: Mapping[str, float]) -> float:
    """The reward from the leaves' scores: a multi grader's formula, else the one score."""
    if not isinstance(grader, MultiGrader):
        return float(scores[grader.name])
    try:
        value = grader.formula.evaluate(scores)
    except (ArithmeticError, ValueError, TypeError) as exc:
        raise GradeFailure(
            "formula_parse_error", f"{grader.calculate_output!r}: {type(exc).__name__}: {exc}"
        ) from None
    if not math.isfinite(value):
        raise GradeFailure("formula_parse_error", f"{grader.calculate_output!r} gave {value}")
    return value


@dataclass
class LocalGrader:
    """Scores the leaves that need no model, in one process (a worker of the grader's pool):
    python leaves in one warm sandbox (:class:`PythonSandbox`), started at the first."""

    limits: GraderLimits = field(default_factory=GraderLimits)
    embedding_model: str | None = None
    _sandbox: PythonSandbox | None = None

    def sandbox(self) -> PythonSandbox:
        if self._sandbox is None:
            self._sandbox = PythonSandbox(self.limits)
        return self._sandbox

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()

    def leaf(self, leaf: LeafGrader, sample: Mapping[str, Any], item: Any) -> float:
        """One leaf's score for one item."""
        if isinstance(leaf, StringCheckGrader):
            text, reference = render(leaf.input, sample, item), render(leaf.reference, sample, item)
            return string_check(leaf.operation, text, reference)
        if isinstance(leaf, TextSimilarityGrader):
            text, reference = render(leaf.input, sample, item), render(leaf.reference, sample, item)
            try:
                return similarity(leaf.evaluation_metric, text, reference, self.embedding_model)
            except (ValueError, ZeroDivisionError, LookupError) as exc:
                raise GradeFailure("other_error", f"{leaf.evaluation_metric}: {exc}") from None
        if isinstance(leaf, PythonGrader):
            return self.sandbox().grade(leaf.source, public_sample(sample), item)
        raise TypeError(f"a {leaf.type} grader needs a model")

    def grade(self, grader: GraderObject, sample: Mapping[str, Any], item: Any) -> dict[str, float]:
        """Every local leaf's score for one item (the first failure raised)."""
        return {name: self.leaf(leaf, sample, item) for name, leaf in local_leaves(grader).items()}


# -- model leaves -------------------------------------------------------------------------

#: The last message of a model leaf's input: the JSON answer asked for (OpenAI's graders
#: ask their models for it with structured outputs).
_FORMAT = {
    "score_model": 'Answer in JSON: {{"result": <{lo:g} to {hi:g}>, "steps": [...]}}',
    "label_model": 'Answer in JSON: {{"result": <one of {labels}>}}',
}


def model_messages(
    leaf: ScoreModelGrader | LabelModelGrader, sample: Mapping[str, Any], item: Any
) -> list[dict[str, str]]:
    """The chat messages a model leaf sends: its input, templated (text parts joined), and a
    last system message stating the JSON answer asked for (OpenAI's structured output)."""
    messages = []
    for message in leaf.input:
        content = message.content
        if isinstance(content, str):
            text = render(content, sample, item)
        else:
            text = "\n".join(render(str(part.get("text", "")), sample, item) for part in content)
        role = "system" if message.role == "developer" else message.role
        messages.append({"role": role, "content": text})
    if isinstance(leaf, ScoreModelGrader):
        lo, hi = leaf.range
        instruction = _FORMAT["score_model"].format(lo=lo, hi=hi)
    else:
        instruction = _FORMAT["label_model"].format(labels=json.dumps(leaf.labels))
    messages.append({"role": "system", "content": instruction})
    return messages


_FENCED = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)


def _json_object(text: str) -> dict[str, Any] | None:
    """The answer's JSON object: all of it, a fenced block, or its first {...} that parses."""
    candidates = [text.strip()]
    candidates += _FENCED.findall(text)
    start = text.find("{")
    if start >= 0:
        candidates.append(text[start : text.rfind("}") + 1])
    for candidate in candidates:
        try:
            value = json.loads(candidate)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(value, dict):
            return value
    return None


def parse_model_answer(leaf: ScoreModelGrader | LabelModelGrader, answer: str) -> float:
    """A model leaf's score from its answer: a score_model's ``result`` clipped to its range,
    a label_model's 1 for a passing label, 0 for another of its labels; GradeFailure
    ``model_grader_parse_error`` for an answer that is not that JSON."""
    found = _json_object(answer)
    if isinstance(leaf, ScoreModelGrader):
        result = found.get("result") if found is not None else None
        steps = found.get("steps", []) if found is not None else None
        if isinstance(result, bool) or not isinstance(result, int | float):
            raise GradeFailure(
                "model_grader_parse_error", f"no numeric 'result' in {answer[:200]!r}"
            )
        if not isinstance(steps, list) or not math.isfinite(result):
            raise GradeFailure(
                "model_grader_parse_error", f"bad 'steps' or result in {answer[:200]!r}"
            )
        lo, hi = leaf.range
        return float(min(max(result, lo), hi))
    label = found.get("result") if found is not None else answer.strip().strip('"')
    if not isinstance(label, str) or label not in leaf.labels:
        raise GradeFailure(
            "model_grader_parse_error", f"no label of {leaf.labels} in {answer[:200]!r}"
        )
    return 1.0 if label in leaf.passing_labels else 0.0
