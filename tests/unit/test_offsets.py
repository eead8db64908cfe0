"""Step-end offsets -> policy tokens (ppo_client.offsets) over the three tokenizer families a
policy may have: GPT-2 byte-level BPE, Llama-style BPE with byte fallback, BERT WordPiece."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import PreTrainedTokenizerBase
from transformers.convert_slow_tokenizer import bytes_to_unicode

import tiny_models
from ppo_client.offsets import char_ends, step_rewards, step_tokens, token_for_offset

#: Characters of 2, 3 and 4 UTF-8 bytes that no tiny vocabulary holds.
MULTI_BYTE = ["é", "ß", "€", "日", "本", "🙂", "👍"]


@pytest.fixture(scope="module")
def gpt2() -> PreTrainedTokenizerBase:
    return tiny_models.byte_bpe_tokenizer()


@pytest.fixture(scope="module")
def llama() -> PreTrainedTokenizerBase:
    return tiny_models.byte_fallback_tokenizer()


@pytest.fixture(scope="module")
def bert() -> PreTrainedTokenizerBase:
    corpus = tiny_models.make_corpus() + ["it was 5€ and 7€ again"] * 5
    return tiny_models.wordpiece_tokenizer(corpus)


def texts(seed: int, n: int = 12) -> list[str]:
    """Corpus-like sentences sprinkled with multi-byte characters and blank-line steps."""
    rng = random.Random(seed)
    out = []
    for sentence in tiny_models.make_corpus(n, seed=seed, min_words=3, max_words=12):
        words = sentence.split()
        for _ in range(3):
            i = rng.randrange(len(words))
            words[i] = rng.choice([words[i] + rng.choice(MULTI_BYTE), rng.choice(MULTI_BYTE)])
        out.append(" ".join(words).replace(" and ", "\n\nand ", 1))
    return out


def owners_by_bytes(pieces: list[bytes], text: str, skipped: int = 0) -> list[int]:
    """For each character of ``text``, the index of the piece holding its last UTF-8 byte;
    the pieces spell ``skipped`` bytes before the text begins."""
    starts, pos = [], 0
    for piece in pieces:
        starts.append(pos)
        pos += len(piece)
    owners = []
    for c in range(len(text)):
        last_byte = skipped + len(text[: c + 1].encode()) - 1
        owners.append(max(k for k, start in enumerate(starts) if start <= last_byte))
    return owners


def assert_every_offset(ends: list[int], owners: list[int]) -> None:
    """A step ending after character c (offset c + 1) lands on that character's owner."""
    assert ends[-1] == len(owners)
    got = [token_for_offset(ends, c + 1) for c in range(len(owners))]
    assert got == owners


def test_gpt2_byte_level_every_offset_lands_on_the_token_with_the_last_byte(
    gpt2: PreTrainedTokenizerBase,
) -> None:
    byte_of = {ch: b for b, ch in bytes_to_unicode().items()}
    for text in texts(seed=1):
        ids = gpt2(text)["input_ids"]
        assert gpt2.decode(ids) == text
        pieces = [bytes(byte_of[ch] for ch in t) for t in gpt2.convert_ids_to_tokens(ids)]
        assert_every_offset(char_ends(gpt2, ids), owners_by_bytes(pieces, text))


def test_gpt2_step_inside_a_split_character_and_inside_a_long_token(
    gpt2: PreTrainedTokenizerBase,
) -> None:
    text = "the movie é was great"
    ids = gpt2(text)["input_ids"]
    tokens = gpt2.convert_ids_to_tokens(ids)
    # é (C3 A9) is not in the vocabulary: its two bytes are two tokens, Ã and ©.
    completing = tokens.index("©")
    assert tokens[completing - 1] == "Ã"
    ends = char_ends(gpt2, ids)
    after_e = text.index("é") + 1
    assert token_for_offset(ends, after_e) == completing  # the token that completes é
    # A boundary after "mo" of the multi-character token "Ġmovie" lands on that token.
    movie = tokens.index("Ġmovie")
    assert token_for_offset(ends, text.index("movie") + 2) == movie
    assert token_for_offset(ends, text.index(" movie")) == movie - 1  # "the" ends before it
    assert token_for_offset(ends, len(text)) == len(ids) - 1


def test_gpt2_special_tokens_own_no_character(gpt2: PreTrainedTokenizerBase) -> None:
    ids = gpt2("a great film")["input_ids"] + [gpt2.eos_token_id]
    ends = char_ends(gpt2, ids)
    assert ends[-1] == ends[-2] == len("a great film")
    assert token_for_offset(ends, len("a great film")) == len(ids) - 2  # not the EOS


def test_byte_fallback_every_offset_lands_on_the_token_with_the_last_byte(
    llama: PreTrainedTokenizerBase,
) -> None:
    def piece(token: str) -> bytes:
        if token.startswith("<0x") and token.endswith(">"):
            return bytes([int(token[3:-1], 16)])
        return token.replace("\u2581", " ").encode()

    for text in texts(seed=2):
        ids = llama(text, add_special_tokens=False)["input_ids"]
        assert llama.decode(ids) == text
        pieces = [piece(t) for t in llama.convert_ids_to_tokens(ids)]
        # The leading "▁" the normaliser added is one byte the decoder strips.
        assert pieces[0].startswith(b" ")
        assert_every_offset(char_ends(llama, ids), owners_by_bytes(pieces, text, skipped=1))


def test_byte_fallback_step_inside_a_byte_spelt_character(llama: PreTrainedTokenizerBase) -> None:
    text = "the movie 🙂 was great"
    ids = llama(text, add_special_tokens=False)["input_ids"]
    tokens = llama.convert_ids_to_tokens(ids)
    emoji = [f"<0x{b:02X}>" for b in "🙂".encode()]  # four byte tokens
    first = tokens.index(emoji[0])
    assert tokens[first : first + 4] == emoji
    ends = char_ends(llama, ids)
    assert token_for_offset(ends, text.index("🙂") + 1) == first + 3
    movie = next(k for k, t in enumerate(tokens) if "movie" in t)
    assert token_for_offset(ends, text.index("movie") + 3) == movie
    # The leading "▁" the normaliser added is stripped when decoding: a token that is only
    # that owns no character, and "t" belongs to the token after it.
    assert tokens[0] == "\u2581" and ends[0] == 0
    assert token_for_offset(ends, 1) == 1


def test_wordpiece_every_offset_lands_on_its_piece(bert: PreTrainedTokenizerBase) -> None:
    for text in ["the movie was 5€ great", "it was 7€ and really boring", "a b c"]:
        ids = bert(text, add_special_tokens=False)["input_ids"]
        tokens = bert.convert_ids_to_tokens(ids)
        decoded = bert.decode(ids)
        assert decoded == text
        # WordPiece decoding: pieces joined by spaces, "##" pieces glued to the one before.
        owners: list[int] = []
        for k, token in enumerate(tokens):
            if token.startswith("##"):
                owners += [k] * len(token[2:])
            else:
                owners += [k] * (len(token) + (k > 0))
        assert_every_offset(char_ends(bert, ids), owners)


def test_wordpiece_step_inside_a_long_token_and_after_a_multi_byte_character(
    bert: PreTrainedTokenizerBase,
) -> None:
    text = "the movie was 5€ great"
    ids = bert(text, add_special_tokens=False)["input_ids"]
    tokens = bert.convert_ids_to_tokens(ids)
    ends = char_ends(bert, ids)
    assert token_for_offset(ends, text.index("movie") + 2) == tokens.index("movie")
    euro = next(k for k, t in enumerate(tokens) if t.endswith("€"))
    assert token_for_offset(ends, text.index("€") + 1) == euro


def test_token_for_offset_edges() -> None:
    ends = [0, 3, 3, 7]  # a token with no characters first, and one (a special) in between
    assert token_for_offset(ends, 0) is None  # an empty step: nothing holds it
    assert token_for_offset(ends, 1) == 1
    assert token_for_offset(ends, 3) == 1
    assert token_for_offset(ends, 4) == 3
    assert token_for_offset(ends, 7) == 3
    with pytest.raises(ValueError, match="outside the response text of 7 characters"):
        token_for_offset(ends, 8)
    with pytest.raises(ValueError):
        token_for_offset(ends, -1)
    assert token_for_offset([], 0) is None
    assert char_ends(tiny_models.byte_bpe_tokenizer(), []) == []


def test_step_tokens_and_rewards_place_each_step_on_its_token(
    gpt2: PreTrainedTokenizerBase,
) -> None:
    eos = gpt2.eos_token_id
    first = gpt2("the movie\n\nwas é great")["input_ids"]
    # Both rows padded with EOS ids after their stop token; the second is empty.
    responses = torch.tensor([[*first, eos, eos], [eos] * (len(first) + 2)])
    seq_lengths = torch.tensor([len(first), 0])  # the stop token's index
    text = gpt2.decode(first)
    step_ends = [[text.index("\n\n") + 2, len(text)], [0]]
    tokens = step_tokens(gpt2, responses, seq_lengths, step_ends)

    ends = char_ends(gpt2, first)
    separator_token = token_for_offset(ends, step_ends[0][0])
    assert separator_token is not None and "Ċ" in gpt2.convert_ids_to_tokens(first)[separator_token]
    # The last step on the last text token, not the EOS after it; an empty response's one
    # step on its last (stop) token.
    assert tokens == [[separator_token, len(first) - 1], [0]]

    dense = step_rewards(responses.shape, [[0.5, 2.0], [-1.0]], tokens)
    expected = torch.zeros(responses.shape)
    expected[0, separator_token] = 0.5
    expected[0, len(first) - 1] = 2.0
    expected[1, 0] = -1.0
    assert torch.equal(dense, expected)
    # Two steps on one token add up.
    assert step_rewards(torch.Size([1, 3]), [[1.0, 2.0]], [[1, 1]]).tolist() == [[0, 3.0, 0]]
