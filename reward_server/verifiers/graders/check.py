"""The check a worker of a grader's pool runs per item (``verifier: grader`` of
:class:`~reward_server.verifiers.VerifierPool`): the item's local leaves scored in the
worker, the reward combined when no leaf needs a model.

Its result is a dict of numbers: ``score`` (the reward, or 0 when a model leaf is still to
come: the server combines then) and each local leaf's score under :data:`SUB` + its name;
a failure is a :class:`~reward_server.verifiers.items.Failed` with OpenAI's flag.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from reward_server.config.graders import GraderObject, parse_grader
from reward_server.verifiers.graders.errors import GradeFailure
from reward_server.verifiers.graders.grading import (
    LocalGrader,
    combine,
    local_leaves,
    model_leaves,
)
from reward_server.verifiers.graders.python_sandbox import GraderLimits
from reward_server.verifiers.graders.similarity import wordnet
from reward_server.verifiers.graders.templates import build_sample
from reward_server.verifiers.items import Failed, Task

__all__ = ["SUB", "grader_check", "warm_up"]

#: The prefix of a leaf's score among a check's values.
SUB = "sub:"
#: Graders brought by requests, parsed once per worker (by their JSON), at most this many.
_PARSED = 256


def warm_up(grader: GraderObject, local: LocalGrader) -> None:
    """Load what the grader's leaves need before the first item (its time is the start's,
    not an item's): WordNet for meteor, the embedding model for cosine, the sandbox."""
    from reward_server.verifiers.graders.similarity import _embedder

    for leaf in local_leaves(grader).values():
        metric = getattr(leaf, "evaluation_metric", None)
        if metric == "meteor":
            wordnet()
        elif metric == "cosine" and local.embedding_model is not None:
            _embedder(local.embedding_model)
        elif leaf.type == "python":
            local.sandbox().start()


def grader_check(
    grader: dict[str, Any] | None, limits: GraderLimits, embedding_model: str | None
) -> Callable[[Task], Any]:
    """The check of a pool running ``grader`` (None: each task brings its own, the graders
    API's pool)."""
    local = LocalGrader(limits, embedding_model)
    fixed = parse_grader(grader) if grader is not None else None
    if fixed is not None:
        warm_up(fixed, local)
    parsed: dict[str, GraderObject] = {}

    def of(task: Task) -> GraderObject:
        if fixed is not None:
            return fixed
        key = json.dumps(task.grader, sort_keys=True)
        if key not in parsed:
            if len(parsed) >= _PARSED:
                parsed.clear()
            parsed[key] = parse_grader(task.grader)
        return parsed[key]

    def check(task: Task) -> Any:
        grader = of(task)
        sample = build_sample(task.response, task.tool_calls)
        try:
            scores = local.grade(grader, sample, task.label)
            reward = 0.0 if model_leaves(grader) else combine(grader, scores)
        except GradeFailure as exc:
            return Failed(exc.flag, exc.detail)
        return {"score": reward, **{SUB + name: value for name, value in scores.items()}}

    return check
