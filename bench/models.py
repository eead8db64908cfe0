"""The benchmark's inputs: the MiniLM reward model, a seeded text mix, a tiny policy, prompts."""

from __future__ import annotations

import json
import logging
import random
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

#: Where prepared models are kept between runs (ignored by git).
CACHE_DIR = Path(__file__).resolve().parent / ".cache"

# Plain English words; most are one WordPiece token, some split into two or three.
_WORDS = (
    "the a an this that these those it its he she they we you i me my our your their his her "
    "movie film story plot actor actress scene music score director camera script cast "
    "performance ending beginning character characters dialogue sequel trailer screen "
    "was is were be been being has have had do does did will would could should might must "
    "great good bad terrible awful wonderful boring brilliant dull funny sad happy slow fast "
    "long short very really quite not never always often sometimes and but or so because "
    "although while when where why how what which who love hate like enjoyed loved hated "
    "watched saw seen again best worst ever made time times year years day night people "
    "world life family friends house city road water light dark early late old new young "
    "small large big little high low first last next other same different important "
    "problem question answer reason result example experience idea moment chance choice "
    "feeling voice face hand eyes heart mind head place point part side way work play run "
    "walk talk think know feel want need give take make find tell ask try leave call keep "
    "begin seem help show hear turn move live believe bring happen write provide sit stand "
    "lose pay meet include continue set learn change lead understand follow stop create "
    "speak read allow add spend grow open win offer remember consider appear buy wait serve "
    "die send expect build stay fall cut reach kill remain suggest raise pass sell require "
    "report decide pull explain hope develop carry break receive agree support hit produce "
    "eat cover catch draw choose cause realize beautiful strange simple clear hard easy "
    "honest quiet loud warm cold bright gentle clever careful patient curious nervous proud"
).split()


def words() -> list[str]:
    """The vocabulary the benchmark texts are drawn from."""
    return list(_WORDS)


def prepare_minilm_reward_model(cache_dir: Path = CACHE_DIR, *, seed: int = 0) -> Path:
    """MiniLM with a seeded one-logit score head, saved once as a sequence-classification model.

    The packaged checkpoint is a plain ``BertModel``; the server refuses a checkpoint without a
    trained head, so the head is initialised here (seeded) and saved with the encoder.
    """
    import tiny_models

    out = Path(cache_dir) / f"minilm-rm-seed{seed}"
    marker = out / "prepared.json"
    if marker.exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    model, tokenizer = tiny_models.minilm_reward_model(seed=seed, needed_by="the benchmark")
    tiny_models.save(out, model, tokenizer)
    source = tiny_models.minilm_path()
    marker.write_text(json.dumps({"source": str(source), "seed": seed}), encoding="utf-8")
    logger.info("saved MiniLM reward model with a seeded head to %s", out)
    return out


def _count(tokenizer: Any, texts: Sequence[str]) -> list[int]:
    """Tokens per text with the tokenizer's special tokens, as the server counts them."""
    return [len(ids) for ids in tokenizer(list(texts), add_special_tokens=True)["input_ids"]]


def make_texts(
    tokenizer: Any, n: int, *, min_tokens: int = 8, max_tokens: int = 256, seed: int = 0
) -> tuple[list[str], list[int]]:
    """``n`` seeded texts whose token counts are uniform in ``[min_tokens, max_tokens]``.

    Returns the texts and their token counts (special tokens included).
    """
    rng = random.Random(seed)
    vocab = words()
    pieces = tokenizer(vocab, add_special_tokens=False)["input_ids"]
    per_word = {w: len(ids) for w, ids in zip(vocab, pieces, strict=True)}
    specials = len(tokenizer("", add_special_tokens=True)["input_ids"])
    texts: list[str] = []
    targets: list[int] = []
    for _ in range(n):
        target = rng.randint(min_tokens, max_tokens)
        chosen: list[str] = []
        used = specials
        while used < target:
            word = rng.choice(vocab)
            if used + per_word[word] > target:
                word = next((w for w in vocab if per_word[w] == 1), word)
            chosen.append(word)
            used += per_word[word]
        texts.append(" ".join(chosen))
        targets.append(target)
    # Check with the real tokenizer and trim or pad the few texts that miss their target.
    counts = _count(tokenizer, texts)
    for i, (count, target) in enumerate(zip(counts, targets, strict=True)):
        parts = texts[i].split(" ")
        for _ in range(8):
            if count == target:
                break
            if count > target and len(parts) > 1:
                parts.pop()
            else:
                parts.append(vocab[0])
            texts[i] = " ".join(parts)
            count = _count(tokenizer, [texts[i]])[0]
        counts[i] = count
    return texts, counts


def make_prompts(n: int, *, seed: int = 0, min_words: int = 4, max_words: int = 12) -> list[str]:
    """Seeded short prompts for the PPO benchmark."""
    rng = random.Random(seed + 7919)
    vocab = words()
    return [
        " ".join(rng.choice(vocab) for _ in range(rng.randint(min_words, max_words)))
        for _ in range(n)
    ]


def prepare_tiny_policy(
    cache_dir: Path = CACHE_DIR,
    *,
    seed: int = 0,
    n_embd: int = 64,
    n_layer: int = 2,
    vocab_size: int = 512,
) -> Path:
    """A tiny GPT-2 causal LM with its own byte-level BPE tokenizer (not the reward model's)."""
    import tiny_models

    out = Path(cache_dir) / f"tiny-policy-e{n_embd}-l{n_layer}-v{vocab_size}-seed{seed}"
    marker = out / "prepared.json"
    if marker.exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    corpus = make_prompts(2000, seed=seed + 1, min_words=4, max_words=30)
    tokenizer = tiny_models.byte_bpe_tokenizer(corpus, vocab_size, model_max_length=256)
    model = tiny_models.gpt2_causal_lm(tokenizer, seed=seed, n_embd=n_embd, n_layer=n_layer)
    tiny_models.save(out, model, tokenizer)
    marker.write_text(json.dumps({"seed": seed, "n_embd": n_embd}), encoding="utf-8")
    return out


#: The engine comparison's reward model: Llama-style, 8 layers x 768, 64-wide heads
#: (vLLM's CPU attention kernels need at least 64), about 50M parameters, random weights.
LLAMA_BENCH_SIZES: dict[str, int] = {
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 8,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
}
#: The same shape at test size (2 layers of two 64-wide heads).
LLAMA_QUICK_SIZES: dict[str, int] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
}


def prepare_llama_reward_model(
    cache_dir: Path = CACHE_DIR,
    *,
    sizes: dict[str, int] | None = None,
    seed: int = 0,
    vocab_size: int = 2048,
    max_length: int = 1024,
) -> Path:
    """A Llama-style reward model with random weights and a byte-level BPE tokenizer trained
    on the benchmark's words, built from a config and saved once (nothing downloaded).

    The score head gets weights of scale 1/sqrt(hidden), so scores spread over O(1).
    """
    import torch
    from transformers import AutoModelForSequenceClassification, LlamaConfig

    import tiny_models

    dims = dict(sizes or LLAMA_BENCH_SIZES)
    tag = "-".join(str(dims[k]) for k in sorted(dims))
    out = Path(cache_dir) / f"llama-rm-{tag}-v{vocab_size}-seed{seed}"
    marker = out / "prepared.json"
    if marker.exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    corpus = make_prompts(4000, seed=seed + 3, min_words=4, max_words=40)
    tok = tiny_models.byte_bpe_tokenizer(
        corpus, vocab_size, eos="</s>", bos="<s>", model_max_length=max_length
    )
    config = LlamaConfig(
        vocab_size=len(tok),
        max_position_embeddings=max_length,
        num_labels=1,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        **dims,
    )
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(config)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        head = model.score.weight
        head.copy_(torch.randn(head.shape, generator=gen) / dims["hidden_size"] ** 0.5)
    tiny_models.save(out, model, tok)
    params = sum(p.numel() for p in model.parameters())
    marker.write_text(json.dumps({"seed": seed, "sizes": dims, "parameters": params}), "utf-8")
    logger.info("saved a %.1fM-parameter Llama reward model to %s", params / 1e6, out)
    return out
