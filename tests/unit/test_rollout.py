"""Rollout helpers: prompt encoding, sampling set-up, and the text that goes to the reward side."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

import tiny_models
from ppo_client import ppo
from ppo_client.rollout import (
    contains_token,
    encode_prompts,
    generate_responses,
    normalize_prompt,
    pad_token_id_for,
    position_ids_from_mask,
    reward_inputs,
    sampling_config,
)

MARKUP = ["<|user|>", "<|assistant|>", "<|system|>", "</s>", "<|endoftext|>"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tokenizer(gpt2_policy: Path) -> AutoTokenizer:
    return AutoTokenizer.from_pretrained(gpt2_policy)


@pytest.fixture(scope="module")
def chat_tokenizer() -> object:
    return tiny_models.chat_tokenizer()


def test_normalize_prompt() -> None:
    assert normalize_prompt("hi") == "hi"
    messages = [{"role": "user", "content": "hi", "name": None}]
    assert normalize_prompt(messages) == [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match="role"):
        normalize_prompt([{"role": "user"}])
    with pytest.raises(ValueError, match="string or a list"):
        normalize_prompt(3)


def test_pad_id_falls_back_to_eos_when_the_tokenizer_has_none(tokenizer: AutoTokenizer) -> None:
    assert tokenizer.pad_token_id is None
    assert pad_token_id_for(tokenizer) == tokenizer.eos_token_id


def test_encode_prompts_left_pads_and_masks(tokenizer: AutoTokenizer) -> None:
    prompts = ["the movie was", "a very long and boring film that i saw again"]
    enc = encode_prompts(tokenizer, prompts, pad_token_id=0)
    short = tokenizer(prompts[0])["input_ids"]
    long = tokenizer(prompts[1])["input_ids"]
    assert enc.input_ids.shape == (2, len(long))
    assert enc.input_ids[0, -len(short) :].tolist() == short
    assert enc.attention_mask[0].tolist() == [0] * (len(long) - len(short)) + [1] * len(short)
    assert enc.input_ids[0, : len(long) - len(short)].eq(0).all()
    assert enc.attention_mask[1].eq(1).all()
    assert enc.num_truncated == 0


def test_encode_prompts_keeps_the_end_of_long_prompts(tokenizer: AutoTokenizer) -> None:
    prompt = "one two three four five six seven"
    enc = encode_prompts(tokenizer, [prompt], pad_token_id=0, max_prompt_length=3)
    assert enc.input_ids[0].tolist() == tokenizer(prompt)["input_ids"][-3:]
    assert enc.num_truncated == 1


def test_chat_prompts_use_the_policy_template_with_a_generation_prompt(
    chat_tokenizer: object,
) -> None:
    messages = [{"role": "user", "content": "hello world"}]
    enc = encode_prompts(chat_tokenizer, [messages], pad_token_id=0)
    text = chat_tokenizer.decode(enc.input_ids[0])
    assert text == "<|user|>\nhello world</s>\n<|assistant|>\n"


def test_chat_prompts_need_a_template(tokenizer: AutoTokenizer) -> None:
    with pytest.raises(ValueError, match="chat template"):
        encode_prompts(tokenizer, [[{"role": "user", "content": "hi"}]], pad_token_id=0)


def test_position_ids_skip_left_padding() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
    assert position_ids_from_mask(mask).tolist() == [[0, 0, 0, 1, 2, 2], [0, 1, 2, 3, 4, 5]]


def test_sampling_config_is_pure_sampling() -> None:
    cfg = sampling_config(7, 0.7, stop_token_id=3, pad_token_id=0)
    assert (cfg.do_sample, cfg.top_k, cfg.top_p, cfg.temperature) == (True, 0, 1.0, 0.7)
    assert (cfg.max_new_tokens, cfg.eos_token_id, cfg.pad_token_id) == (7, 3, 0)
    assert cfg.repetition_penalty == 1.0


def test_generation_ignores_the_checkpoint_generation_config(gpt2_policy: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(gpt2_policy).eval()
    own = GenerationConfig(max_new_tokens=1, do_sample=False, top_k=1, eos_token_id=5)
    model.generation_config = own
    torch.manual_seed(0)
    ids = torch.tensor([[1, 2, 3], [0, 4, 5]])
    mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    cfg = sampling_config(6, 1.0, stop_token_id=None, pad_token_id=0)
    out = generate_responses(model, ids, mask, cfg, chunk_size=1)
    assert out.shape == (2, 6)  # no stop token: the full length, not the checkpoint's 1 token
    assert model.generation_config is own  # restored afterwards


def test_generated_responses_are_padded_after_the_stop_token(gpt2_policy: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(gpt2_policy).eval()
    ids = torch.randint(5, 300, (3, 4), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    torch.manual_seed(1)
    free = generate_responses(model, ids, mask, sampling_config(8, 1.0, None, 0), chunk_size=3)
    # Same seed, with the token sampled at position 3 of row 0 as the stop token: row 0 now
    # ends there and everything after it is padding.
    stop = int(free[0, 3])
    torch.manual_seed(1)
    out = generate_responses(model, ids, mask, sampling_config(8, 1.0, stop, 0), chunk_size=3)
    lengths = ppo.sequence_lengths(out, stop)
    assert int(lengths[0]) == int(ppo.first_true_indices(free[0:1] == stop)[0]) <= 3
    resp_mask = ppo.response_mask(lengths, 8)
    assert contains_token(out, stop, resp_mask)[0]
    assert out[~resp_mask].eq(0).all()
    assert out[0, : int(lengths[0]) + 1].tolist() == free[0, : int(lengths[0]) + 1].tolist()


def test_reward_inputs_are_clean_text(tokenizer: AutoTokenizer) -> None:
    eos = tokenizer.eos_token_id
    prompts = ["the movie was", "a film"]
    enc = encode_prompts(tokenizer, prompts, pad_token_id=eos)
    great = tokenizer(" great")["input_ids"]
    boring = tokenizer(" boring")["input_ids"]
    rows = [[*great, eos, *boring], boring + boring]
    width = max(len(r) for r in rows)
    responses = torch.tensor([r + [eos] * (width - len(r)) for r in rows])
    lengths = ppo.sequence_lengths(responses, eos)
    out = reward_inputs(tokenizer, prompts, enc.input_ids, enc.attention_mask, responses, lengths)
    # cut at the stop token, which is special and so not in the text
    assert out.responses == [" great", " boring boring"]
    assert out.prompts == prompts


def test_reward_inputs_keep_the_original_chat_messages(chat_tokenizer: object) -> None:
    messages = [
        {"role": "system", "content": "be kind"},
        {"role": "user", "content": "the movie was"},
    ]
    enc = encode_prompts(chat_tokenizer, [messages], pad_token_id=0)
    eos = chat_tokenizer.eos_token_id
    assistant = chat_tokenizer.convert_tokens_to_ids("<|assistant|>")
    words = chat_tokenizer(" great fun", add_special_tokens=False)["input_ids"]
    # The policy may emit its own markup tokens; they are special and never reach the reward.
    responses = torch.tensor([[assistant, *words, eos, 7, 7]])
    lengths = ppo.sequence_lengths(responses, eos)
    out = reward_inputs(
        chat_tokenizer, [messages], enc.input_ids, enc.attention_mask, responses, lengths
    )
    assert out.prompts == [messages]
    assert out.prompts[0] is not messages  # a copy
    assert out.responses == [" great fun"]
    for marker in MARKUP:
        assert marker not in out.responses[0]
        assert all(marker not in m["content"] for m in out.prompts[0])


def test_log_prob_forward_reproduces_the_sampling_distribution(gpt2_policy: Path) -> None:
    """On left-padded prompts, the forward pass that gives the rollout and update log-probs
    sees exactly the logits that generation sampled from (positions from the mask)."""
    from transformers import AutoModelForSequenceClassification

    from ppo_client.models import PolicyAndValue

    policy = AutoModelForCausalLM.from_pretrained(gpt2_policy).eval()
    critic = AutoModelForSequenceClassification.from_pretrained(gpt2_policy, num_labels=1)
    ids = torch.tensor([[0, 0, 0, 5, 6, 7], [1, 2, 3, 4, 5, 6]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    cfg = sampling_config(5, 0.7, stop_token_id=None, pad_token_id=0)
    cfg.output_logits, cfg.return_dict_in_generate = True, True
    torch.manual_seed(0)
    out = policy.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)
    sampled_from = torch.stack(out.logits, 1)  # (B, T, V), before the temperature
    full_mask = torch.cat([mask, torch.ones_like(out.sequences[:, 6:])], 1)
    with torch.no_grad():
        logits = PolicyAndValue(policy, critic, response_length=5).policy_logits(
            out.sequences, full_mask, position_ids_from_mask(full_mask)
        )
    torch.testing.assert_close(logits, sampled_from, atol=1e-5, rtol=0)
