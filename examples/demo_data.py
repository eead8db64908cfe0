"""The demo's generated data: short movie-review sentences of known sentiment.

A small grammar writes sentences whose sentiment is fixed by the adjectives and verbs it
picks. From it come the policy's pre-training corpus (both kinds, half and half), the
reward model's preference pairs (chosen = positive, rejected = negative, written from the
same template so that only the sentiment differs) and the PPO prompts (sentence openings).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SUBJECTS = [
    "the movie",
    "the film",
    "the story",
    "the plot",
    "the acting",
    "the cast",
    "the music",
    "the ending",
    "the script",
    "the dialogue",
    "this movie",
    "this film",
]
VERBS = ["was", "is", "felt", "seemed"]
ADVERBS = ["", "very", "really", "quite", "truly", "so"]
ADJECTIVES = {
    True: ["wonderful", "great", "brilliant", "superb", "delightful", "moving", "excellent",
           "beautiful", "charming", "fantastic", "funny", "touching"],
    False: ["awful", "terrible", "boring", "dull", "dreadful", "weak", "bad", "painful",
            "tedious", "clumsy", "lifeless", "forgettable"],
}  # fmt: skip
FEELINGS = {True: ["loved", "enjoyed", "adored"], False: ["hated", "disliked", "regretted"]}
VERDICTS = {
    True: ["i would recommend it", "i would watch it again", "a real pleasure"],
    False: ["i would not recommend it", "i would never watch it again", "a waste of time"],
}


@dataclass(frozen=True)
class Review:
    """One generated sentence and its sentiment."""

    text: str
    positive: bool


def _phrase(rng: random.Random, positive: bool) -> str:
    adverb = rng.choice(ADVERBS)
    adjective = rng.choice(ADJECTIVES[positive])
    return f"{adverb} {adjective}" if adverb else adjective


def review(rng: random.Random, positive: bool, template: int | None = None) -> str:
    """A sentence of the given sentiment from one of five templates."""
    t = rng.randrange(5) if template is None else template
    subj, verb = rng.choice(SUBJECTS), rng.choice(VERBS)
    if t == 0:
        return f"{subj} {verb} {_phrase(rng, positive)} ."
    if t == 1:
        subj2 = rng.choice([s for s in SUBJECTS if s != subj])
        return f"{subj} {verb} {_phrase(rng, positive)} and {subj2} was {rng.choice(ADJECTIVES[positive])} ."
    if t == 2:
        return f"i thought {subj} {verb} {_phrase(rng, positive)} ."
    if t == 3:
        return f"i {rng.choice(FEELINGS[positive])} {subj} , {rng.choice(VERDICTS[positive])} ."
    return f"{subj} {verb} {rng.choice(ADJECTIVES[positive])} , {rng.choice(VERDICTS[positive])} ."


def corpus(n: int, seed: int = 0) -> list[Review]:
    """``n`` sentences, alternating positive and negative."""
    rng = random.Random(seed)
    return [Review(review(rng, positive=i % 2 == 0), positive=i % 2 == 0) for i in range(n)]


def preference_pairs(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` pairs ``{"chosen": positive, "rejected": negative}`` from the same template."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        template = rng.randrange(5)
        state = rng.getstate()
        chosen = review(rng, True, template)
        rng.setstate(state)  # same subject and verb: only the sentiment differs
        rejected = review(rng, False, template)
        pairs.append({"chosen": chosen, "rejected": rejected})
    return pairs


PROMPTS = sorted(
    {f"{s}" for s in SUBJECTS}
    | {f"{s} {v}" for s in SUBJECTS for v in ("was", "is")}
    | {"i thought", "i thought the movie", "i thought the film", "i"}
)


def prompts(n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` PPO prompts (sentence openings) as ``{"prompt": text}`` rows."""
    rng = random.Random(seed)
    return [{"prompt": rng.choice(PROMPTS)} for _ in range(n)]
