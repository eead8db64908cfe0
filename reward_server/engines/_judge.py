"""LLM judges run with torch, in process: a causal LM scores a prompt by its next-token
distribution over a few score tokens (``kind: judge``, ``mode: logprobs``), or answers it
in text (``mode: generate``: :meth:`JudgeLM.generate_batch`, the score parsed by the served
model).

Not an engine of its own (``--engine`` names what runs the sequence models): the server loads
a judge with :func:`load`, taking the transformers engine's loading steps (device, dtype,
tokenizer, chat template, max length) with ``AutoModelForCausalLM``. The prompts are rendered
and tokenized by :class:`~reward_server.text.judge_prompt.JudgeRenderer`.

The score of one row of token ids (the rendered prompt, ending where the answer begins)::

    z_t = logit of score token t at the next-token position after the row's last token
    p_t = exp(z_t) / sum_u exp(z_u)        # softmax over the score tokens only
    score = sum_t value_t * p_t

A ``mode: pairwise`` judge's rows are such rows too: its two answer tokens are the score
tokens, valued 1 and 0, so a row's score is ``p = P(first response better)``
(:mod:`reward_server.scoring.pairwise_model`).

Rows are right-padded into one forward pass; a causal LM's logits at a real token do not see
the padding after it, so a row scores the same alone and in any batch. Only the logits of the
rows' last positions are computed (``logits_to_keep``), not the whole ``(B, T, V)``.

In ``mode: generate`` the rows are left-padded into one ``generate`` call per batch (greedy
unless a temperature is given), up to ``max_new_tokens`` new tokens or the end of text; each
row's new tokens up to its first end-of-text token are decoded without special tokens.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from reward_server.config import LoadOptions
from reward_server.engines._checkpoint import Network, load_parts
from reward_server.engines.transformers import NetworkModel, _pad
from reward_server.errors import ModelLoadError, load_errors
from reward_server.text.judge_prompt import JudgeRenderer

logger = logging.getLogger(__name__)

__all__ = ["Generation", "JudgeLM", "causal_lm_class", "load", "score_token_ids"]


@dataclasses.dataclass(frozen=True)
class Generation:
    """How a judge in ``mode: generate`` answers: greedy at temperature 0, else sampled."""

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_p: float | None = None
    #: The seed of the sampling (a grader's sampling_params.seed); None: the RNG as it is.
    seed: int | None = None


def load(
    options: LoadOptions,
    score_tokens: Mapping[str, float] | None,
    generation: Generation | None = None,
) -> JudgeLM:
    """Load the judge of ``options`` on the calling thread (ModelLoadError with one line):
    with ``score_tokens`` in logprobs mode, with ``generation`` in generate mode."""
    return JudgeLM.from_options(options, score_tokens or {}, generation)


def causal_lm_class(config: Any, options: LoadOptions) -> Any:
    """``AutoModelForCausalLM``, once the config names a causal LM (a classifier's checkpoint
    would load with a random LM head)."""
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    archs = list(getattr(config, "architectures", None) or [])
    known = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    own = "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {})
    if archs and not own and not any(a in known for a in archs):
        raise ModelLoadError(
            f"{options.model!r} is not a causal language model (architectures: "
            f"{', '.join(archs)}); a judge reads its next-token logits"
        )
    return AutoModelForCausalLM


def score_token_ids(tokenizer: Any, texts: Sequence[str], name: str) -> list[int]:
    """The token id of each score token text (ModelLoadError naming one that is not exactly
    one token of the tokenizer, or two that are the same token)."""
    ids: list[int] = []
    for text in texts:
        encoded = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(encoded) != 1:
            pieces = tokenizer.convert_ids_to_tokens(encoded)
            raise ModelLoadError(
                f"score token {text!r} is {len(encoded)} tokens {pieces} of the tokenizer of "
                f"{name!r}; each score token must be exactly one token"
            )
        if encoded[0] in ids:
            other = texts[ids.index(encoded[0])]
            raise ModelLoadError(
                f"score tokens {other!r} and {text!r} are the same token of the tokenizer of "
                f"{name!r}"
            )
        ids.append(int(encoded[0]))
    return ids


class JudgeLM(NetworkModel):
    """A causal LM with its tokenizer, scoring prompts by the expected value of its score
    tokens (:meth:`score_batch`)."""

    kind = "judge"
    rendering: JudgeRenderer

    def __init__(
        self, network: Network, score_tokens: Mapping[str, float], generation: Generation | None
    ) -> None:
        super().__init__(network)
        self.generation = generation
        self.score_tokens = dict(score_tokens)
        texts = list(self.score_tokens)
        self.token_ids = score_token_ids(self.tokenizer, texts, self.name)
        self._ids = torch.tensor(self.token_ids, device=network.device)
        self._values = torch.tensor([self.score_tokens[t] for t in texts], dtype=torch.float64)
        accepts = inspect.signature(self._base().forward).parameters
        self._keeps_logits = "logits_to_keep" in accepts
        # A probe forward: checks the model runs and has a logit for every score token.
        self.vocab_size = self._probe()

    def _base(self) -> torch.nn.Module:
        model = self.model
        return model.get_base_model() if hasattr(model, "get_base_model") else model

    @classmethod
    def from_options(
        cls,
        options: LoadOptions,
        score_tokens: Mapping[str, float],
        generation: Generation | None = None,
    ) -> JudgeLM:
        """Load the judge; any failure is a ModelLoadError with a one-line reason."""
        with load_errors(options.model):
            return cls._build(options, score_tokens, generation)

    @classmethod
    def _build(
        cls,
        options: LoadOptions,
        score_tokens: Mapping[str, float],
        generation: Generation | None,
    ) -> JudgeLM:
        """The transformers engine's loading steps, with a causal LM."""
        # A causal LM has no labels to choose from: the server's --label-index is not its.
        options = dataclasses.replace(options, label_index=0)
        loaded = load_parts(options, causal_lm_class, kind="causal-lm")
        renderer = JudgeRenderer.for_model(loaded.tokenizer, options, loaded.max_length)
        judge = cls(loaded.network(renderer, options.adapter), score_tokens, generation)
        logger.info(
            "loaded judge %s (%s) on %s in %s, max_length %d, score tokens %s (ids %s)",
            judge.name,
            judge.architecture,
            judge.device,
            judge.dtype,
            judge.max_length,
            list(judge.score_tokens),
            judge.token_ids,
        )
        return judge

    def _next_token_logits(self, batch: Sequence[Sequence[int]]) -> torch.Tensor:
        """The logits ``(B, V)`` of the token after each row's last real token."""
        ids, lengths = _pad(batch, self.rendering.pad_token_id)
        n_rows, width = ids.shape
        mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
        last = lengths - 1  # (B,) right padding: row b's last real token
        kwargs = dict(self._forward_kwargs)
        if self._keeps_logits:
            # Only the positions some row ends at: logits (B, K, V), K <= B.
            keep = torch.unique(last)  # sorted
            kwargs["logits_to_keep"] = keep.to(self._torch_device)
            at = torch.searchsorted(keep, last)
        else:
            at = last
        out = self.model(
            input_ids=ids.to(self._torch_device),
            attention_mask=mask.to(self._torch_device),
            **kwargs,
        )
        logits = out.logits if hasattr(out, "logits") else out[0]
        return logits[torch.arange(n_rows, device=logits.device), at.to(logits.device)]

    def _probe(self) -> int:
        """Run one tiny forward; the size of its vocabulary of logits."""
        r = self.rendering
        with torch.inference_mode():
            logits = self._next_token_logits([[*r.prefix, r.pad_token_id, r.pad_token_id]])
        if logits.dim() != 2 or logits.shape[0] != 1:
            raise ModelLoadError(
                f"{self.name!r} gives next-token logits of shape {tuple(logits.shape)}, not (1, V)"
            )
        vocab = int(logits.shape[-1])
        beyond = [t for t, i in zip(self.score_tokens, self.token_ids, strict=True) if i >= vocab]
        if beyond:
            raise ModelLoadError(
                f"score token(s) {', '.join(map(repr, beyond))} beyond the {vocab} logits of "
                f"{self.name!r}"
            )
        return vocab

    def render_prompts(self, contents: Sequence[str]) -> list[str]:
        """Each content as the one user message of the chat template, generation prompt on
        (as it is without a chat template)."""
        return self.rendering.render_prompts(contents)

    def render_chats(self, chats: Sequence[Sequence[Mapping[str, str]]]) -> list[str]:
        """Each list of chat messages through the chat template, generation prompt on (a
        grader's model leaf)."""
        return self.rendering.render_chats(chats)

    @torch.inference_mode()
    def probabilities(self, batch: Sequence[Sequence[int]]) -> torch.Tensor:
        """Each score token's probability ``(B, K)`` after each row, renormalised over the
        score tokens, in one right-padded pass."""
        logits = self._next_token_logits(batch)  # (B, V)
        chosen = logits[:, self._ids.to(logits.device)].float()  # (B, K)
        return chosen.log_softmax(-1).exp().cpu()

    def score_batch(self, batch: Sequence[Sequence[int]]) -> list[float]:
        """The expected value of the score tokens after each row of token ids, in order."""
        if not batch:
            return []
        probs = self.probabilities(batch).double()  # (B, K)
        return (probs @ self._values).tolist()

    def _end_ids(self) -> list[int]:
        """The token ids that end an answer: the model's generation config's, else EOS."""
        config = getattr(self.model, "generation_config", None)
        eos = getattr(config, "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        ends = eos if isinstance(eos, list) else [eos]
        return [int(e) for e in ends if e is not None]

    def generate_batch(self, batch: Sequence[Sequence[int]]) -> list[str]:
        """Each row's answer: the text of its new tokens. Rows with the same generation
        settings (the judge's, or a :class:`~reward_server.engines.GenerationRow`'s
        own) go left-padded into one ``generate`` call (greedy at temperature 0)."""
        own = self.generation or Generation()
        groups: dict[Generation, list[int]] = {}
        for i, row in enumerate(batch):
            groups.setdefault(getattr(row, "generation", None) or own, []).append(i)
        answers: list[str] = [""] * len(batch)
        for generation, members in groups.items():
            texts = self._generate([batch[i] for i in members], generation)
            for i, text in zip(members, texts, strict=True):
                answers[i] = text
        return answers

    @torch.inference_mode()
    def _generate(self, batch: Sequence[Sequence[int]], gen: Generation) -> list[str]:
        """One ``generate`` call over ``batch`` with ``gen``'s settings."""
        if not batch:
            return []
        from transformers import GenerationConfig

        pad = self.rendering.pad_token_id
        right, lengths = _pad(batch, pad)
        width = right.shape[1]
        ids = torch.full_like(right, pad)
        mask = torch.zeros_like(right)
        for b, length in enumerate(lengths.tolist()):
            ids[b, width - length :] = right[b, :length]
            mask[b, width - length :] = 1
        ends = self._end_ids()
        sample = gen.temperature > 0
        if sample and gen.seed is not None:
            torch.manual_seed(gen.seed)
        config = GenerationConfig(
            max_new_tokens=gen.max_new_tokens,
            do_sample=sample,
            temperature=gen.temperature if sample else None,
            top_p=gen.top_p if sample else None,
            top_k=None,
            pad_token_id=pad,
            eos_token_id=ends or None,
        )
        out = self.model.generate(  # type: ignore[operator]
            input_ids=ids.to(self._torch_device),
            attention_mask=mask.to(self._torch_device),
            generation_config=config,
        )
        answers = []
        for row in out[:, width:].tolist():
            for i, token in enumerate(row):
                if token in ends:
                    row = row[:i]
                    break
            answers.append(self.tokenizer.decode(row, skip_special_tokens=True))
        return answers

    def info(self) -> dict[str, object]:
        """Static facts about the loaded judge, for GET /info."""
        if self.generation is not None:
            return {**self.network_info(), **dataclasses.asdict(self.generation)}
        return {
            **self.network_info(),
            "score_tokens": dict(self.score_tokens),
            "score_token_ids": list(self.token_ids),
        }
