"""LLM judges in ``mode: logprobs`` (a tiny random causal LM) and their reference: the
template rendered with plain Jinja, one unpadded forward pass of plain transformers per item,
a softmax over the score tokens' logits, the expected value.

``save_judge`` makes the judge (GPT-2 without BOS, or Llama with a BOS its tokenizer adds;
the ``judges`` fixture of tests/conftest.py holds one of each), ``judge_entry`` its entry in
a models file, ``reference`` the scores an independent computation gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
import torch
from tokenizers import processors
from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, LlamaConfig

import tiny_models

ATOL = 1e-5
YES_NO = {"Yes": 1.0, "No": 0.0}
TEMPLATE = (
    "Question: {{ prompt }}\n"
    "Answer: {{ response }}\n"
    "{% if label %}Reference: {{ label }}\n{% endif %}"
    "Is the answer correct? Reply Yes or No.\n"
)
QUERIES = ["What is 2 + 2?", "Name a colour.", "Say something long about the movie please."]
RESPONSES = ["4", "the red fox jumps over the lazy dog again and again", "boring"]
LABELS = ["4", "red", "it was dull"]
CONVERSATIONS = [
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "hello world"},
    ],
    [{"role": "user", "content": "What is 3 + 4?"}, {"role": "assistant", "content": "7"}],
]
TEXTS = ["a", "the movie was great and the music was wonderful", "bad"]


def _bos_first(tok: Any) -> None:
    """Make the tokenizer put BOS before every text, as Llama's does (the template does not)."""
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.bos_token_id)]
    )


def save_judge(path: Path, family: str, seed: int = 0, *, wide: bool = False) -> Path:
    """A tiny random causal LM whose chat template has a generation prompt and whose
    vocabulary holds "Yes" and "No"; weights large enough that scores differ visibly.
    ``wide`` (llama): two 64-wide attention heads, as vLLM's CPU kernels need."""
    if family == "gpt2":
        tok = tiny_models.chat_tokenizer()
        tok.add_tokens(["Yes", "No"])
        config: Any = GPT2Config(
            vocab_size=len(tok), n_positions=128, n_embd=32, n_layer=2, n_head=2,
            initializer_range=0.3, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        )  # fmt: skip
    else:
        tok = tiny_models.byte_bpe_tokenizer(
            eos="</s>",
            bos="<s>",
            extra_special=tiny_models.CHAT_SPECIAL_TOKENS,
            chat_template=tiny_models.POLICY_CHAT_TEMPLATE,
        )
        tok.add_tokens(["Yes", "No"])
        _bos_first(tok)
        config = LlamaConfig(
            vocab_size=len(tok), hidden_size=128 if wide else 32,
            intermediate_size=256 if wide else 64, num_hidden_layers=2,
            num_attention_heads=2 if wide else 4, num_key_value_heads=1 if wide else 2,
            max_position_embeddings=512 if wide else 128,
            initializer_range=0.3, tie_word_embeddings=False,
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        )  # fmt: skip
    torch.manual_seed(seed)
    return tiny_models.save(path, AutoModelForCausalLM.from_config(config), tok)


# --------------------------------------------------------------------------- the reference


def contents(prompts: Sequence[str], responses: Sequence[str], labels: Sequence[Any]) -> list[str]:
    """The template rendered with plain Jinja (a missing label printed as nothing)."""
    template = jinja2.Template(TEMPLATE)
    return [
        template.render(prompt=p, response=r, label="" if label is None else label)
        for p, r, label in zip(prompts, responses, labels, strict=True)
    ]


def reference(
    folder: Path,
    texts: Sequence[str],
    score_tokens: dict[str, float],
    *,
    chat: bool = True,
    max_length: int | None = None,
) -> list[float]:
    """Each content's score by plain transformers: the user turn of the chat template with the
    generation prompt (or the text alone), tokenized as the tokenizer does, one forward pass,
    a softmax over the score tokens' logits at the last position, the expected value."""
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = [tok.convert_tokens_to_ids(tok.tokenize(t)) for t in score_tokens]
    assert all(len(i) == 1 for i in ids), ids
    values = torch.tensor(list(score_tokens.values()), dtype=torch.float64)
    scores = []
    for text in texts:
        if chat:
            turn = [{"role": "user", "content": text}]
            text = tok.apply_chat_template(turn, tokenize=False, add_generation_prompt=True)
        row = tok(text)["input_ids"]
        if max_length is not None and len(row) > max_length:
            # The left side cut, a leading BOS kept in place.
            bos = row[:1] if row[0] == tok.bos_token_id else []
            row = bos + row[len(row) - max_length + len(bos) :]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([row])).logits[0, -1]
        probs = logits[[i[0] for i in ids]].double().softmax(-1)
        scores.append(float(probs @ values))
    return scores


def judge_entry(folder: Path, **extra: Any) -> dict[str, Any]:
    return {
        "name": "judge",
        "kind": "judge",
        "model": str(folder),
        "template": TEMPLATE,
        "score_tokens": YES_NO,
        **extra,
    }
