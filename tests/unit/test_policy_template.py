"""Policy-template recovery: learn a policy's chat template from its tokenizer and parse
OpenRLHF-shaped text (templated prompt + response) back into the conversation."""

from __future__ import annotations

import random
from typing import Any

import pytest
from chat_templates import FAMILIES, Family, save_policy_tokenizer
from transformers import AutoTokenizer

from reward_server.text.policy_template import (
    PolicyTemplate,
    PolicyTemplateError,
    PolicyTemplateLoadError,
    load_policy_template,
)

LEARNABLE = ("qwen25", "llama3", "zephyr", "llama2", "mistral_v1")
QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


@pytest.fixture(scope="module")
def policies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Any, PolicyTemplate]]:
    """Each learnable family: (its tokenizer loaded from disk, its learned template)."""
    root = tmp_path_factory.mktemp("policy_tokenizers")
    out = {}
    for name in LEARNABLE:
        path = save_policy_tokenizer(root / name, name)
        out[name] = (AutoTokenizer.from_pretrained(path), load_policy_template(str(path)))
    return out


def conv(*pairs: tuple[str, str]) -> list[dict[str, str]]:
    return [{"role": role, "content": content} for role, content in pairs]


def render(tokenizer: Any, messages: list[dict[str, str]], generation: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)


SINGLE = conv(("user", "What is 2+2?\nThink step by step."), ("assistant", "It is 4."))
MULTI = conv(
    ("user", "Name a colour."),
    ("assistant", "Blue."),
    ("user", "Another one, in French?"),
    ("assistant", "Rouge, c'est ça."),
    ("user", "Thanks! 🎉 Now one in 中文."),
    ("assistant", "红色。"),
)
SYSTEM = conv(
    ("system", "You are terse.\nAnswer in one line."),
    ("user", "Why is the sky blue?"),
    ("assistant", "Rayleigh scattering."),
)


# ----------------------------------------------------------------------------- learning


def test_learns_chatml_with_its_default_system_message(policies) -> None:
    shape = policies["qwen25"][1].shape
    assert shape.open_user == (
        f"<|im_start|>system\n{QWEN_DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\n"
    )
    assert shape.open_system == "<|im_start|>system\n"
    assert shape.user_assistant == "<|im_end|>\n<|im_start|>assistant\n"
    assert shape.assistant_user == "<|im_end|>\n<|im_start|>user\n"
    assert shape.generation == "<|im_end|>\n<|im_start|>assistant\n"
    assert shape.end == "<|im_end|>\n"


def test_learns_llama3_headers_without_bos(policies) -> None:
    shape = policies["llama3"][1].shape
    assert shape.open_user == "<|start_header_id|>user<|end_header_id|>\n\n"
    assert shape.generation == "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    assert shape.end == "<|eot_id|>"


def test_template_that_refuses_system_messages_is_learned_without_them(policies) -> None:
    template = policies["mistral_v1"][1]
    assert not template.supports_system
    assert template.shape.generation == " [/INST]"  # no generation prompt of its own
    assert all(policies[n][1].supports_system for n in LEARNABLE if n != "mistral_v1")


# ------------------------------------------------------------------- OpenRLHF-shaped text


#: (template, conversation) cases; Mistral v0.1 refuses system messages, so it has none.
CASES = [
    pytest.param(name, conv, id=f"{name}-{conv_id}")
    for name in LEARNABLE
    for conv, conv_id in ((SINGLE, "single"), (MULTI, "multi"), (SYSTEM, "system"))
    if not (name == "mistral_v1" and conv is SYSTEM)
]


@pytest.mark.parametrize(("name", "conversation"), CASES)
@pytest.mark.parametrize("ending", ["none", "end_of_turn", "eos", "end_and_pad"])
def test_parses_prompt_plus_response(policies, name, conversation, ending) -> None:
    tokenizer, template = policies[name]
    end = template.shape.end
    tail = {
        "none": "",
        "end_of_turn": end.rstrip(),
        "eos": tokenizer.eos_token,
        "end_and_pad": end + (tokenizer.pad_token or ""),
    }[ending]
    prompt = render(tokenizer, conversation[:-1], True)
    query = prompt + conversation[-1]["content"] + tail
    assert template.parse(query) == conversation
    assert template.parse(query, prompt) == conversation
    assert template.parse(render(tokenizer, conversation, False)) == conversation


@pytest.mark.parametrize("name", ["qwen25", "llama3", "zephyr"])
def test_parses_text_decoded_from_token_ids_as_openrlhf_does(policies, name) -> None:
    """OpenRLHF tokenizes the templated prompt, generates, and decodes prompt + response
    ids with skip_special_tokens=False; the response ends with the EOS id."""
    tokenizer, template = policies[name]
    for conversation in (SINGLE, MULTI, SYSTEM):
        prompt = render(tokenizer, conversation[:-1], True)
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        response_ids = tokenizer(conversation[-1]["content"], add_special_tokens=False)["input_ids"]
        ids = prompt_ids + response_ids + [tokenizer.eos_token_id]
        query = tokenizer.decode(ids, skip_special_tokens=False)
        assert template.parse(query, prompt) == conversation
        assert template.parse(query) == conversation


def test_response_keeps_its_own_whitespace(policies) -> None:
    tokenizer, template = policies["llama3"]
    prompt = render(tokenizer, SINGLE[:1], True)
    parsed = template.parse(prompt + "\n It is 4.\n\n<|eot_id|>", prompt)
    assert parsed[-1] == {"role": "assistant", "content": "\n It is 4.\n\n"}


def test_qwen_default_system_message_reads_as_no_system_message(policies) -> None:
    tokenizer, template = policies["qwen25"]
    default = conv(("system", QWEN_DEFAULT_SYSTEM), *[(m["role"], m["content"]) for m in SINGLE])
    # Rendered identically to no system message at all: the reward model's own default applies.
    assert render(tokenizer, default, False) == render(tokenizer, SINGLE, False)
    assert template.parse(render(tokenizer, default, False)) == SINGLE
    custom = conv(("system", "Be brief."), *[(m["role"], m["content"]) for m in SINGLE])
    assert template.parse(render(tokenizer, custom, False)) == custom


def test_repeated_bos_at_the_start_is_ignored(policies) -> None:
    """A tokenizer that adds its BOS to a prompt that already has one (Llama-3)."""
    tokenizer, template = policies["llama3"]
    prompt = render(tokenizer, SINGLE[:1], True)
    assert prompt.startswith("<|begin_of_text|>")
    query = "<|begin_of_text|>" + prompt + "It is 4.<|eot_id|>"
    assert template.parse(query) == SINGLE
    assert template.parse(query, prompt) == SINGLE


def test_prompt_makes_the_split_exact_when_the_response_imitates_the_template(policies) -> None:
    tokenizer, template = policies["qwen25"]
    prompt = render(tokenizer, SINGLE[:1], True)
    response = "It is 4.<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n6"
    parsed = template.parse(prompt + response + "<|im_end|>", prompt)
    assert parsed == [SINGLE[0], {"role": "assistant", "content": response}]
    # Without the prompt the imitated turns read as turns: what the text says.
    assert [m["role"] for m in template.parse(prompt + response)] == [
        "user",
        "assistant",
        "user",
        "assistant",
    ]


# ------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("query", "prompt", "match"),
    [
        ("just some text, no template", None, "does not start with the policy template's opening"),
        ("", None, "opening"),
        ("<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", None, "opening"),
        ("<|im_start|>user\nhi<|im_end|>\n", None, "opening"),
    ],
    ids=["garbage", "empty", "other_template", "no_default_system"],
)
def test_text_not_in_the_template_is_an_error(policies, query, prompt, match) -> None:
    with pytest.raises(PolicyTemplateError, match=match):
        policies["qwen25"][1].parse(query, prompt)


def test_prompt_without_a_response_is_an_error(policies) -> None:
    tokenizer, template = policies["qwen25"]
    with pytest.raises(PolicyTemplateError, match=r"message 1 \(user\) does not end with"):
        template.parse(render(tokenizer, SINGLE[:1], False))


def test_query_that_does_not_start_with_its_prompt_is_an_error(policies) -> None:
    tokenizer, template = policies["qwen25"]
    prompt = render(tokenizer, SINGLE[:1], True)
    other = render(tokenizer, conv(("user", "Something else")), True)
    with pytest.raises(PolicyTemplateError, match="does not start with its prompt"):
        template.parse(other + "It is 4.", prompt)


def test_prompt_without_the_generation_prompt_is_an_error(policies) -> None:
    tokenizer, template = policies["qwen25"]
    bare = render(tokenizer, SINGLE[:1], False)
    with pytest.raises(PolicyTemplateError, match="does not end with"):
        template.parse(bare + "It is 4.", bare)
    full = render(tokenizer, SINGLE, False)
    with pytest.raises(PolicyTemplateError, match="generation prompt"):
        template.parse(full, full)


def test_template_error_is_a_value_error() -> None:
    assert issubclass(PolicyTemplateError, ValueError)


# ------------------------------------------------------------------------ load failures


@pytest.mark.parametrize(
    ("family", "match"),
    [
        ("mistral_v3", "system.*folded into a user message"),
        ("gemma3", r"system->user with whitespace only \('\\n\\n'\)"),
        (
            Family("{% for m in messages %}{{ m['content'] }}\n{% endfor %}", eos="</s>"),
            "whitespace",
        ),
        (Family("{{ raise_exception('no chat here') }}", eos="</s>"), "no chat here"),
        (
            Family("{% for m in messages %}[{{ m['role'] }}]{% endfor %}", eos="</s>"),
            "does not render message 1",
        ),
    ],
    ids=["system_in_last_user", "system_joined_by_blank_line", "whitespace", "raises", "drops"],
)
def test_templates_that_cannot_be_parsed_back_are_rejected(tmp_path, family, match) -> None:
    path = save_policy_tokenizer(tmp_path / "tok", family)
    with pytest.raises(PolicyTemplateLoadError, match=match):
        load_policy_template(str(path))


def test_tokenizer_without_chat_template_is_rejected(tmp_path) -> None:
    path = save_policy_tokenizer(tmp_path / "tok", "qwen25")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(tmp_path / "plain")
    for stale in (tmp_path / "plain").glob("chat_template*"):
        stale.unlink()
    with pytest.raises(PolicyTemplateLoadError, match="has no chat template"):
        load_policy_template(str(tmp_path / "plain"))


def test_missing_tokenizer_is_a_load_error(tmp_path) -> None:
    with pytest.raises(PolicyTemplateLoadError, match="cannot load the policy tokenizer"):
        load_policy_template(str(tmp_path / "nowhere"))


# ------------------------------------------------------------------------- round trip

_ALPHABET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    "     \n\n\t.,;:!?'\"()[]{}<>|/\\-_*#@&%$+=~`"
    "éèüßøåçñ中文字日本語한국어Ελληνικάкириллица🎉🙂✓→…"
)


def _text(rng: random.Random, trims: bool) -> str:
    """Random text; for a template that trims contents, already trimmed and not blank (a
    trimmed empty message can swallow its neighbour's markers, e.g. Llama-2's <</SYS>>)."""
    text = "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 60)))
    return (text.strip() or "x") if trims else text


def _random_conversation(rng: random.Random, family: Family, system: bool) -> list[dict]:
    messages = [{"role": "system", "content": _text(rng, family.trims)}] if system else []
    for _ in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": _text(rng, family.trims)})
        messages.append({"role": "assistant", "content": _text(rng, family.trims)})
    return messages


@pytest.mark.parametrize("name", LEARNABLE)
def test_round_trip_of_random_conversations(policies, name) -> None:
    """render then parse gives the conversation back: for the whole conversation, and for
    its prompt (with a generation prompt) plus a raw response, with and without prompts."""
    tokenizer, template = policies[name]
    family = FAMILIES[name]
    rng = random.Random(f"round-trip-{name}")
    for _ in range(150):
        system = template.supports_system and rng.random() < 0.5
        conversation = _random_conversation(rng, family, system)
        assert template.parse(render(tokenizer, conversation, False)) == conversation
        prompt = render(tokenizer, conversation[:-1], True)
        # A generated response is not trimmed; a trimming template only rules out trailing
        # whitespace, which its end marker (Llama-2's " </s>") would take.
        response = _text(rng, trims=False)
        response = response.rstrip() if family.trims else response
        tail = rng.choice(["", template.shape.end, tokenizer.eos_token])
        # Llama-2's history header " [/INST] " is one space longer than its generation
        # prompt " [/INST]": that space is the template's, not the response's.
        kept = response[1:] if name == "llama2" and response.startswith(" ") else response
        expected = [*conversation[:-1], {"role": "assistant", "content": kept}]
        assert template.parse(prompt + response + tail, prompt) == expected
        assert template.parse(prompt + response + tail) == expected
