"""An LLM judge served beside reward models: ``kind: judge`` entries of the models file.

A judge is a causal LM hosted by this server. For each item its Jinja ``template`` is rendered
with the item's prompt, response and label (:mod:`reward_server.text.judge_prompt`), put in one
user message of the judge's chat template with the generation prompt, and tokenized; the rows
go through the micro-batcher like a sequence model's, and each row's score is the expected
value of the configured ``score_tokens`` under the judge's next-token distribution,
renormalised over those tokens (:mod:`reward_server.engines._judge`: one forward pass per
batch). Its score is weighted, normalised and combined like any other model's.

``mode: logprobs`` on the transformers engine only, for now.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from reward_server.engines import DEFAULT_ENGINE, Scorer
from reward_server.errors import ModelLoadError
from reward_server.scoring.items import Items
from reward_server.scoring.served import BatchedModel, ItemResult, Tokenized, _check_rows
from reward_server.scoring.verifier_model import tasks
from reward_server.text.judge_prompt import JudgePrompt, JudgeTemplate

if TYPE_CHECKING:
    from reward_server.config import LoadOptions, ModelSpec
    from reward_server.verifiers import Task

__all__ = ["JudgeModel", "JudgeScorer", "judge_prompts", "load_judge"]

logger = logging.getLogger(__name__)


class JudgeScorer(Scorer, Protocol):
    """A loaded judge as the served model uses it (:class:`~reward_server.engines._judge.JudgeLM`
    is one): a scorer whose ``score_batch`` gives each row's expected score-token value, and
    which renders a rendered template as the user turn of its chat template."""

    score_tokens: dict[str, float]

    def render_prompts(self, contents: Sequence[str]) -> list[str]:
        """Each content as the one user message of the chat template, generation prompt on."""
        ...


def _judge_prompt(task: Task) -> JudgePrompt:
    """A verifier's reading of an item (prompt: text, messages or None) as a judge's."""
    prompt = task.prompt
    if prompt is None:
        return JudgePrompt(prompt="", response=task.response, label=task.label)
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
        return JudgePrompt(prompt, task.response, task.label, messages)
    messages = [dict(m) for m in prompt]
    joined = "\n\n".join(str(m.get("content", "")) for m in messages)
    return JudgePrompt(joined, task.response, task.label, messages)


def judge_prompts(items: Items, policy_template: Any = None) -> list[JudgePrompt]:
    """What a judge's template reads of each item (see :mod:`reward_server.text.judge_prompt`);
    ``policy_template``: the policy's, undone on policy-templated texts."""
    return [_judge_prompt(task) for task in tasks(items, policy_template)]


class JudgeModel(BatchedModel):
    """A ``kind: judge`` entry, served: its template, and its causal LM on the micro-batcher."""

    kind = "judge"

    def __init__(self, spec: ModelSpec, scorer: JudgeScorer, template: JudgeTemplate) -> None:
        super().__init__(spec, scorer)
        self.judge = scorer
        self.template = template

    @property
    def labels(self) -> list[str]:
        """Its one value: the score."""
        return ["score"]

    def prepare(
        self, items: Items, *, truncate: bool, max_tokens: int | None
    ) -> Sequence[Tokenized]:
        """Each item's template rendered, as the user turn of the judge's chat template with
        the generation prompt, tokenized (nothing after it: the next token is the answer)."""
        prompts = judge_prompts(items, self._context().policy_template)
        texts = self.judge.render_prompts(self.template.render(prompts))
        # A request's own limit (max_tokens) always truncates, as for the other models.
        cut = truncate if max_tokens is None else True
        return self.judge.encode(texts, truncate=cut, max_length=max_tokens)

    def finish(self, prepared: Sequence[Tokenized], values: Sequence[Any]) -> list[ItemResult]:
        """Each row's expected value as the item's score."""
        scores = [row[0] for row in _check_rows(values, len(prepared))]
        return [
            ItemResult(score=score, num_tokens=item.num_tokens, truncated=item.truncated)
            for item, score in zip(prepared, scores, strict=True)
        ]

    def batch_function(
        self,
    ) -> tuple[Callable[[list[Sequence[int]]], Sequence[Any]], Callable[[Any], Any]]:
        """The expected score-token value of each row."""
        return self.judge.score_batch, float

    def info(self) -> dict[str, object]:
        """The judge's facts for /info: the model's, and its mode, score tokens and template."""
        entry = self.spec.model_dump(
            include={"weight", "normalize", "mode", "score_tokens", "template"}
        )
        own = {"name": self.name, "kind": self.kind, "labels": self.labels}
        return {**self.scorer.info(), **entry, **own}


def load_judge(spec: ModelSpec, options: LoadOptions, engine: str) -> JudgeModel:
    """Load the judge of a ``kind: judge`` entry on the calling thread (the service's compute
    thread): its template, then its causal LM; ModelLoadError when either fails."""
    if engine != DEFAULT_ENGINE:
        raise ModelLoadError(f"judges run on the {DEFAULT_ENGINE} engine, not {engine!r} (not yet)")
    assert spec.template is not None and spec.score_tokens is not None
    template = JudgeTemplate.from_setting(spec.template, spec.name)
    module = importlib.import_module("reward_server.engines._judge")
    scorer = cast("JudgeScorer", module.load(options, spec.score_tokens))
    return JudgeModel(spec, scorer, template)
