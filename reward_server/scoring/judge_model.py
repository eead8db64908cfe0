"""An LLM judge served beside reward models: ``kind: judge`` entries of the models file.

A judge is a causal LM hosted by this server. For each item its Jinja ``template`` is rendered
with the item's prompt, response and label (:mod:`reward_server.text.judge_prompt`), put in one
user message of the judge's chat template with the generation prompt, and tokenized; the rows
go through the micro-batcher like a sequence model's, and each row's score is the expected
value of the configured ``score_tokens`` under the judge's next-token distribution,
renormalised over those tokens (:mod:`reward_server.engines._judge`: one forward pass per
batch). Its score is weighted, normalised and combined like any other model's.

In ``mode: generate`` the judge answers in text instead (greedy unless ``temperature`` is
above 0, up to ``max_new_tokens``; one left-padded ``generate`` call per micro-batch) and the
score is the number that the first match of ``score_pattern`` captures in its one group, as
a float (:func:`reward_client.wire.openai_chat.parse_score`, the parser of a remote chat
judge's reply too). An answer without a match (or whose group is not a finite number) scores the entry's
``on_error`` with the reason ``parse_failure`` in the answer's ``verifier_errors``, counted in
``reward_server_verifier_errors_total{model,reason="parse_failure"}`` (the verifiers' counter).
The prompt is cut to ``max_length - max_new_tokens`` tokens, leaving room for the answer.

``mode: rubric`` judges each criterion of an item's rubric (its label) in a row of its own, or
rates the item against its whole rubric (:mod:`reward_server.scoring.rubric_model`, served by
:class:`~reward_server.scoring.rubric_model.RubricJudgeModel`).

``mode: pairwise`` compares the responses of a request's groups two at a time
(:mod:`reward_server.scoring.pairwise_model`, served by :class:`~reward_server.scoring.
pairwise_model.PairwiseJudgeModel`).

All four modes run on the transformers engine (:mod:`reward_server.engines._judge`) and on the
vLLM engine (:mod:`reward_server.engines._vllm_judge`: continuous batching, the prefix cache
shared by prompts that begin alike, e.g. a GRPO group's).
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

from reward_client.wire.openai_chat import parse_score
from reward_server.config.entries import (
    GenerateJudge,
    JudgeEntry,
    LogprobsJudge,
    PairwiseJudge,
    RubricJudge,
)
from reward_server.engines import DEFAULT_ENGINE, Scorer
from reward_server.errors import ModelLoadError
from reward_server.scoring.item_result import ItemResult
from reward_server.scoring.items import Items, judge_prompts
from reward_server.scoring.pairwise_model import PAIRWISE_VARIABLES, PairwiseJudgeModel
from reward_server.scoring.rubric_model import RUBRIC_VARIABLES, RubricJudgeModel
from reward_server.scoring.served import BatchedModel, Tokenized, _check_rows
from reward_server.text.judge_prompt import JudgeTemplate

if TYPE_CHECKING:
    from reward_server.config import LoadOptions

__all__ = ["JudgeModel", "JudgeScorer", "load_judge"]

logger = logging.getLogger(__name__)


class JudgeScorer(Scorer, Protocol):
    """A loaded judge as the served model uses it (:class:`~reward_server.engines._judge.JudgeLM`
    is one): a scorer whose ``score_batch`` gives each row's expected score-token value, and
    which renders a rendered template as the user turn of its chat template."""

    score_tokens: dict[str, float]

    def generate_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        """Each row's answer text (``mode: generate``)."""
        ...

    def render_prompts(self, contents: Sequence[str]) -> list[str]:
        """Each content as the one user message of the chat template, generation prompt on."""
        ...


class JudgeModel(BatchedModel):
    """A ``kind: judge`` entry, served: its template, and its causal LM on the micro-batcher."""

    kind = "judge"

    def __init__(
        self, spec: LogprobsJudge | GenerateJudge, scorer: JudgeScorer, template: JudgeTemplate
    ) -> None:
        super().__init__(spec, scorer)
        self.judge = scorer
        self.template = template
        self.generates = isinstance(spec, GenerateJudge)
        self.pattern = re.compile(spec.score_pattern) if isinstance(spec, GenerateJudge) else None

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
        texts = self.judge.render_prompts(self.template.render(prompts, self.tool_rendering()))
        # A request's own limit (max_tokens) always truncates, as for the other models.
        cut = truncate if max_tokens is None else True
        if self.generates:
            # Room for the answer: the prompt at most max_length - max_new_tokens tokens.
            room = self.judge.max_length - self.spec.max_new_tokens
            max_tokens = room if max_tokens is None else min(max_tokens, room)
        return self.judge.encode(texts, truncate=cut, max_length=max_tokens)

    def finish(self, prepared: Sequence[Tokenized], values: Sequence[Any]) -> list[ItemResult]:
        """Each row's expected value (or parsed answer) as the item's score."""
        if self.generates:
            return self._parsed(prepared, values)
        scores = [row[0] for row in _check_rows(values)]
        return [
            ItemResult(score=score, num_tokens=item.num_tokens, truncated=item.truncated)
            for item, score in zip(prepared, scores, strict=True)
        ]

    def _parsed(self, prepared: Sequence[Tokenized], answers: Sequence[Any]) -> list[ItemResult]:
        """Each answer's parsed score; on_error with reason ``parse_failure`` (counted) where none."""
        if len(answers) != len(prepared):
            raise RuntimeError(f"{len(answers)} answers for {len(prepared)} rows")
        metrics = self._context().metrics
        assert self.pattern is not None
        results = []
        for item, answer in zip(prepared, answers, strict=True):
            score = parse_score(answer, self.pattern)
            if score is None:
                logger.debug("judge %s: no score in %r", self.name, answer)
                metrics.on_verifier_error(self.name, "parse_failure")
            results.append(
                ItemResult(
                    score=self.spec.error_score if score is None else score,
                    num_tokens=item.num_tokens,
                    truncated=item.truncated,
                    error="parse_failure" if score is None else None,
                )
            )
        return results

    def batch_function(
        self,
    ) -> tuple[Callable[[list[Sequence[int]]], Sequence[Any]], Callable[[Any], Any]]:
        """The expected score-token value of each row, or its generated answer."""
        if self.generates:
            return self.judge.generate_batch, str
        return self.judge.score_batch, float

    def info(self) -> dict[str, object]:
        """The judge's facts for /info: the model's, and its mode, score tokens (or pattern,
        generation settings and on_error) and template."""
        entry = self.spec.shown()
        own = {"name": self.name, "kind": self.kind, "labels": self.labels}
        return {**self.scorer.info(), **entry, **own}


def load_judge(
    spec: JudgeEntry, options: LoadOptions, engine: str
) -> JudgeModel | PairwiseJudgeModel | RubricJudgeModel:
    """Load the judge of a ``kind: judge`` entry on the calling thread (the registry's compute
    thread): its template, then its causal LM; ModelLoadError when either fails."""
    modules = {DEFAULT_ENGINE: "_judge", "vllm": "_vllm_judge"}
    if engine not in modules:
        raise ModelLoadError(f"judges run on the {' or '.join(modules)} engine, not {engine!r}")
    assert spec.template is not None
    module = importlib.import_module(f"reward_server.engines.{modules[engine]}")
    if isinstance(spec, PairwiseJudge):
        return _load_pairwise(spec, options, module)
    if isinstance(spec, RubricJudge):
        return _load_rubric(spec, options, module)
    template = JudgeTemplate.from_setting(spec.template, spec.name)
    if isinstance(spec, GenerateJudge):
        scorer = _load_generating(spec, options, module)
    else:
        assert isinstance(spec, LogprobsJudge) and spec.score_tokens is not None
        scorer = cast("JudgeScorer", module.load(options, spec.score_tokens))
    return JudgeModel(spec, scorer, template)


def _load_generating(
    spec: GenerateJudge | RubricJudge, options: LoadOptions, module: Any
) -> JudgeScorer:
    """The causal LM of a judge that writes answers, with room for a prompt."""
    generation = module.Generation(spec.max_new_tokens, spec.temperature, spec.top_p)
    scorer = cast("JudgeScorer", module.load(options, None, generation))
    if scorer.max_length - spec.max_new_tokens < 1:
        scorer.close()
        raise ModelLoadError(
            f"max_new_tokens {spec.max_new_tokens} leaves no room for a prompt in the "
            f"max_length {scorer.max_length} of {spec.name!r}"
        )
    return scorer


def _load_rubric(spec: RubricJudge, options: LoadOptions, module: Any) -> RubricJudgeModel:
    """A rubric judge: its template (which must read ``criterion`` with explicit aggregation,
    ``rubric`` and not ``criterion`` with implicit), and its causal LM: a generating judge,
    or a logprobs judge whose score tokens are the verdict tokens, valued 1 and 0."""
    assert spec.template is not None
    template = JudgeTemplate.from_setting(spec.template, spec.name, RUBRIC_VARIABLES)
    if spec.aggregation == "explicit" and "criterion" not in template.reads:
        raise ModelLoadError(
            f"judge template of {spec.name!r} does not read criterion: with aggregation: "
            "explicit each row judges one criterion (put {{ criterion }} last, so that an "
            "item's rows share their head)"
        )
    if spec.aggregation == "implicit" and (
        "rubric" not in template.reads or template.reads & {"criterion", "category"}
    ):
        raise ModelLoadError(
            f"judge template of {spec.name!r}: with aggregation: implicit one row sees the "
            "whole rubric: read rubric (each criterion's text, weight, category, required), "
            "not criterion or category"
        )
    if spec.generates:
        return RubricJudgeModel(spec, _load_generating(spec, options, module), template)
    scorer = _two_token_judge(module, options, spec.verdict_tokens, "verdict token")
    return RubricJudgeModel(spec, scorer, template)


def _load_pairwise(spec: PairwiseJudge, options: LoadOptions, module: Any) -> PairwiseJudgeModel:
    """A pairwise judge: its template (with response_a and response_b), and its causal LM
    loaded as a logprobs judge whose score tokens are the answer tokens, valued 1 and 0."""
    assert spec.template is not None and spec.answer_tokens is not None
    template = JudgeTemplate.from_setting(spec.template, spec.name, PAIRWISE_VARIABLES)
    scorer = _two_token_judge(module, options, spec.answer_tokens, "answer token")
    return PairwiseJudgeModel(spec, scorer, template)


def _two_token_judge(
    module: Any, options: LoadOptions, tokens: tuple[str, str], word: str
) -> JudgeScorer:
    """A causal LM loaded as a logprobs judge whose score tokens are ``tokens``, valued 1
    and 0; a load error speaks of them as ``word`` (a verdict or an answer token)."""
    first, second = tokens
    try:
        return cast("JudgeScorer", module.load(options, {first: 1.0, second: 0.0}))
    except ModelLoadError as exc:
        raise ModelLoadError(str(exc).replace("score token", word)) from exc
