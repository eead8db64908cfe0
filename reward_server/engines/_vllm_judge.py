"""LLM judges on the vLLM engine (``kind: judge`` with ``--engine vllm``): the same two modes
as :mod:`reward_server.engines._judge`, run by vLLM's generate runner.

The server renders and tokenizes the judge's prompts (:class:`~reward_server.text.judge_prompt.
JudgeRenderer`, as on the transformers engine) and gives vLLM token ids; every row is one
vLLM request, batched continuously with everyone else's, and the prompts of a GRPO group
(one question, many responses) share their prefix-cache blocks: the template's text up to
the response is computed once.

``mode: logprobs``: one new token per row (greedy), with the log-probabilities vLLM gives
for exactly the score tokens (``SamplingParams.logprob_token_ids``: log-softmax over the
whole vocabulary, before any sampling transformation). A softmax over those K values is the
softmax over the score tokens' logits (the whole vocabulary's normaliser cancels), so::

    p_t = exp(l_t - max_u l_u) / sum_u exp(l_u - max_u l_u),   l_t = log p(t | prompt)
    score = sum_t value_t * p_t

``mode: pairwise`` rows are logprobs rows whose score tokens are the two answer tokens,
valued 1 and 0: a row's value is the probability that its first response is the better
(:mod:`reward_server.scoring.pairwise_model`); the rows of a group share the prefix-cache
blocks of their common prefix.

``mode: generate``: up to ``max_new_tokens`` new tokens, greedy at temperature 0 else
sampled (``temperature``, ``top_p``), stopping at the model's end-of-text ids; the new tokens
up to the first end-of-text token are decoded without special tokens, as on transformers.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import types
from collections.abc import Mapping, Sequence
from typing import Any

from reward_server.config import LoadOptions
from reward_server.engines._checkpoint import (
    checkpoint_source,
    load_config,
    load_tokenizer,
    model_max_length,
    position_limit,
)
from reward_server.engines._judge import Generation, causal_lm_class, score_token_ids
from reward_server.engines.vllm import (
    Started,
    VllmScorer,
    abandon,
    cached_tokens,
    device_for,
    start,
)
from reward_server.errors import ModelLoadError, load_errors
from reward_server.text.judge_prompt import JudgeRenderer
from reward_server.text.rendering import read_template

logger = logging.getLogger(__name__)

__all__ = ["VllmJudge", "load"]

#: vLLM's bound on ``logprob_token_ids`` per request (``MAX_LOGPROB_TOKEN_IDS``).
MAX_SCORE_TOKENS = 128
#: vLLM's default ``max_logprobs``: a judge with more score tokens raises it.
_VLLM_MAX_LOGPROBS = 20


def load(
    options: LoadOptions,
    score_tokens: Mapping[str, float] | None,
    generation: Generation | None = None,
) -> VllmJudge:
    """Load the judge of ``options`` on vLLM (ModelLoadError with one line): with
    ``score_tokens`` in logprobs mode, with ``generation`` in generate mode."""
    with load_errors(options.model):
        return VllmJudge.launch(options, score_tokens or {}, generation)


def _end_ids(generation: Any, config: Any, tokenizer: Any) -> list[int]:
    """The token ids that end an answer: the checkpoint's generation config's, else the
    model config's, else the tokenizer's EOS (as the transformers judge reads them)."""
    eos = getattr(generation, "eos_token_id", None)
    if eos is None:
        eos = getattr(config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    ends = eos if isinstance(eos, list) else [eos]
    return [int(e) for e in ends if e is not None]


def _generation_config(source: str, options: LoadOptions) -> Any:
    """The checkpoint's ``generation_config.json``, or None without one."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(source, trust_remote_code=options.trust_remote_code)
    except OSError:
        return None


class VllmJudge(VllmScorer):
    """A causal LM judge served by vLLM: each row's expected score-token value, or its
    generated answer."""

    kind = "judge"
    rendering: JudgeRenderer

    def __init__(
        self,
        started: Started,
        renderer: JudgeRenderer,
        config: Any,
        score_tokens: Mapping[str, float],
        generation: Generation | None,
        *,
        adapter: str | None,
        end_ids: Sequence[int],
    ) -> None:
        super().__init__(started, renderer, config)
        self.adapter = adapter
        self.end_ids = list(end_ids)
        self.score_tokens = dict(score_tokens)
        self.generation = generation
        self.token_ids = score_token_ids(renderer.tokenizer, list(self.score_tokens), self.name)
        self._values = [self.score_tokens[t] for t in self.score_tokens]
        # Answers are decoded on the event loop while the tokenizer thread encodes with
        # the renderer's tokenizer: a copy of their own keeps the two apart.
        self._decoder = copy.deepcopy(renderer.tokenizer)

    @classmethod
    def launch(
        cls, options: LoadOptions, score_tokens: Mapping[str, float], generation: Generation | None
    ) -> VllmJudge:
        """Check, read the config and tokenizer, check the score tokens, start vLLM."""
        # A causal LM has no labels to choose from: the server's --label-index is not its.
        options = dataclasses.replace(options, label_index=0)
        device = device_for(options)
        source = checkpoint_source(options.model)
        template = read_template(options.chat_template)
        config = load_config(source, options)
        causal_lm_class(config, options)  # ModelLoadError for a classifier's checkpoint
        tokenizer = load_tokenizer(source, options, template)
        max_length = model_max_length(types.SimpleNamespace(config=config), tokenizer, options)
        limit = position_limit(config)
        if generation is None and limit is not None and max_length >= limit:
            # vLLM samples one token after a prompt and wants a position for it: a prompt
            # reads one token less than the model's position limit.
            max_length = limit - 1
        renderer = JudgeRenderer.for_model(tokenizer, options, max_length)
        vocab = int(config.get_text_config().vocab_size)
        ids = score_token_ids(tokenizer, list(score_tokens), options.model)
        beyond = [t for t, i in zip(score_tokens, ids, strict=True) if i >= vocab]
        if beyond:
            raise ModelLoadError(
                f"score token(s) {', '.join(map(repr, beyond))} beyond the {vocab} logits of "
                f"{options.model!r}"
            )
        if len(ids) > MAX_SCORE_TOKENS:
            raise ModelLoadError(
                f"{len(ids)} score tokens; vLLM reads at most {MAX_SCORE_TOKENS} per row"
            )
        ends = _end_ids(_generation_config(source, options), config, tokenizer)
        # Logprobs: room for the one token vLLM samples after a prompt of max_length tokens
        # (a generated answer's room is taken from the prompt: see JudgeModel.prepare).
        extra: dict[str, Any] = {"max_model_len": max_length + (generation is None)}
        if len(ids) > _VLLM_MAX_LOGPROBS:
            extra["max_logprobs"] = len(ids)
        started = start(
            options,
            (source, config, tokenizer),
            max_length,
            device,
            runner="generate",
            extra=extra,
        )
        try:
            judge = cls(
                started,
                renderer,
                config,
                score_tokens,
                generation,
                adapter=options.adapter,
                end_ids=ends,
            )
        except BaseException:
            abandon(started)
            raise
        judge._log_start("judge")
        return judge

    def render_prompts(self, contents: Sequence[str]) -> list[str]:
        """Each content as the one user message of the chat template, generation prompt on."""
        return self.rendering.render_prompts(contents)

    def render_chats(self, chats: Sequence[Sequence[Mapping[str, str]]]) -> list[str]:
        """Each list of chat messages through the chat template, generation prompt on (a
        grader's model leaf)."""
        return self.rendering.render_chats(chats)

    def _params(self, own: Generation | None = None) -> Any:
        """vLLM's sampling parameters for one row of this judge's mode (``own``: the row's
        own generation settings, a :class:`~reward_server.engines.GenerationRow`'s)."""
        from vllm import SamplingParams

        gen = own or self.generation
        if gen is None:  # logprobs: one greedy token, the score tokens' logprobs
            return SamplingParams(
                max_tokens=1, temperature=0.0, logprob_token_ids=self.token_ids, detokenize=False
            )
        sample = gen.temperature > 0
        return SamplingParams(
            max_tokens=gen.max_new_tokens,
            temperature=gen.temperature if sample else 0.0,
            top_p=gen.top_p if sample and gen.top_p is not None else 1.0,
            seed=gen.seed if sample else None,
            stop_token_ids=self.end_ids,
            detokenize=False,
        )

    async def _run_row(self, ids: Sequence[int]) -> tuple[Any, int]:
        """One row through vLLM: its expected score-token value, or its answer's text."""
        from vllm.inputs import TokensPrompt

        engine = self._live_engine()
        prompt = TokensPrompt(prompt_token_ids=list(ids))
        output = None
        params = self._params(getattr(ids, "generation", None))
        async for part in engine.generate(prompt, params, request_id=self._request_id()):
            output = part
        if output is None or not output.outputs:
            raise RuntimeError("vLLM returned no output")
        answer, cached = output.outputs[0], cached_tokens(output)
        if self.generation is not None:
            return self._decode(list(answer.token_ids)), cached
        return self._expected(answer.logprobs[0]), cached

    def _expected(self, logprobs: Mapping[int, Any]) -> float:
        """The expected value of the score tokens from their log-probabilities."""
        values = [float(logprobs[i].logprob) for i in self.token_ids]
        top = max(values)
        if not math.isfinite(top):
            raise RuntimeError(f"non-finite score-token log-probabilities {values}")
        weights = [math.exp(v - top) for v in values]
        total = math.fsum(weights)
        return math.fsum(w * v for w, v in zip(weights, self._values, strict=True)) / total

    def _decode(self, tokens: list[int]) -> str:
        """The answer up to its first end-of-text token, without special tokens."""
        for i, token in enumerate(tokens):
            if token in self.end_ids:
                tokens = tokens[:i]
                break
        return str(self._decoder.decode(tokens, skip_special_tokens=True))

    def score_batch(self, batch: Sequence[Sequence[int]]) -> list[float]:
        """Expected values of rows, from a thread other than the engine's event loop."""
        return [float(v) for v in self.run_blocking(batch)]

    def generate_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        """Answers of rows, from a thread other than the engine's event loop."""
        return [str(v) for v in self.run_blocking(batch)]

    def info(self) -> dict[str, object]:
        """Static facts for GET /info: the network's, the vLLM settings, the mode's."""
        facts = {**self.engine_info(), "adapter": self.adapter}
        if self.generation is not None:
            return {**facts, **dataclasses.asdict(self.generation)}
        return {
            **facts,
            "score_tokens": dict(self.score_tokens),
            "score_token_ids": list(self.token_ids),
        }
