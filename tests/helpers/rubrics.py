"""Rubric judges (``mode: rubric``) and their independent reference: each criterion's row
rendered with plain Jinja, one unpadded forward pass of plain transformers per row
(:func:`helpers.judges.reference`: the chat template's user turn, a softmax over Yes/No), and
the explicit aggregation written out here from the documented formula (not the server's
code): weighted verdicts over the sum of the positive weights, pitfalls subtracting, a rubric
of pitfalls only ``1 - sum |w| v / N``, an empty one 1, a failed required criterion the
rubric's minimum.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2

from helpers.judges import YES_NO, reference

#: The criterion last: an item's rows share the head (template, prompt, response).
TEMPLATE = "Q: {{ prompt }}\nA: {{ response }}\nMet? {{ criterion }}\n"
#: The categories' weights the tests set (not the defaults, so that the entry's are read).
CATEGORIES = {"essential": 1.0, "important": 0.5, "optional": 0.25, "pitfall": -0.75}
QUERIES = ["Capital of France?", "Why is the sky blue?", "A prime?", "Hi.", "A haiku."]
RESPONSES = ["Paris.", "Scattering of light.", "9", "hello there", "rain on the window"]
#: Weights, categories, pitfalls, required criteria, an empty rubric, pitfalls only.
RUBRICS: list[Any] = [
    [
        {"text": "Says Paris", "category": "essential", "required": True},
        {"text": "Names a landmark", "category": "optional"},
        {"text": "Says Lyon", "category": "pitfall"},
    ],
    {
        "rubric": [
            {"text": "Says scattering", "weight": 3},
            {"text": "Says wavelength", "weight": 1.5, "category": "important"},
            {"text": "Says sea", "weight": -2, "required": True},
        ],
        "reference": "Rayleigh scattering",
    },
    [
        {"text": "Is prime", "category": "essential", "required": True},
        {"text": "Says why", "category": "important"},
    ],
    [],
    [
        {"text": "Is rude", "category": "pitfall"},
        {"text": "Uses profanity", "weight": -0.5},
    ],
]


def entry(folder: Path, **extra: Any) -> dict[str, Any]:
    """A rubric judge's models-file entry: Yes/No verdicts by logprobs, the test's
    categories."""
    return {
        "name": "rubric",
        "kind": "judge",
        "mode": "rubric",
        "model": str(folder),
        "template": TEMPLATE,
        "categories": CATEGORIES,
        **extra,
    }


def criteria_of(label: Any) -> list[dict[str, Any]]:
    return list(label["rubric"] if isinstance(label, dict) else label)


def weight_of(criterion: dict[str, Any]) -> float:
    return float(
        criterion["weight"] if "weight" in criterion else CATEGORIES[criterion["category"]]
    )


def rows(prompts: Sequence[str], responses: Sequence[str], labels: Sequence[Any]) -> list[str]:
    """Every criterion's row (item by item, criterion by criterion), rendered with Jinja."""
    template = jinja2.Template(TEMPLATE)
    out = []
    for prompt, response, label in zip(prompts, responses, labels, strict=True):
        for criterion in criteria_of(label):
            out.append(
                template.render(
                    prompt=prompt, response=response, label=label, criterion=criterion["text"]
                )
            )
    return out


def probabilities(
    folder: Path, prompts: Sequence[str], responses: Sequence[str], labels: Sequence[Any]
) -> list[list[float]]:
    """Per item, each criterion's probability of Yes by plain transformers (one unpadded
    forward pass per row)."""
    flat = iter(reference(folder, rows(prompts, responses, labels), YES_NO))
    return [[next(flat) for _ in criteria_of(label)] for label in labels]


def aggregate(label: Any, probs: Sequence[float], threshold: float) -> tuple[float, bool]:
    """The documented explicit score of one item, and whether a required criterion gated it."""
    criteria = criteria_of(label)
    weights = [weight_of(c) for c in criteria]
    positive = sum(w for w in weights if w > 0)
    negative = sum(-w for w in weights if w < 0)
    for c, w, p in zip(criteria, weights, probs, strict=True):
        failed = p >= threshold if w < 0 else p < threshold
        if c.get("required") and failed:
            return (-negative / positive if positive > 0 else 0.0), True
    total = sum(w * p for w, p in zip(weights, probs, strict=True))
    if positive > 0:
        return total / positive, False
    if negative > 0:
        return 1.0 - sum(-w * p for w, p in zip(weights, probs, strict=True)) / negative, False
    return 1.0, False


def mixed_threshold(probs: Sequence[Sequence[float]], labels: Sequence[Any] = RUBRICS) -> float:
    """A verdict threshold at which some required criterion of ``labels`` fails and another
    holds (``probs``: each item's criteria's probabilities of yes)."""
    required = sorted(
        {
            p
            for label, ps in zip(labels, probs, strict=True)
            for c, p in zip(criteria_of(label), ps, strict=True)
            if c.get("required")
        }
        | {0.5}
    )
    for t in [(a + b) / 2 for a, b in itertools.pairwise(required)] + [0.5]:
        gated = [aggregate(label, ps, t)[1] for label, ps in zip(labels, probs, strict=True)]
        kept = [g for g, label in zip(gated, labels, strict=True) if criteria_of(label)]
        if any(gated) and not all(kept):
            return t
    raise AssertionError(f"no threshold mixes gated and kept items: {required}")
