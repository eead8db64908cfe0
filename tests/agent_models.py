"""A tiny agent set-up shared by the trainer tests with tools (TRL, verl): a weather tool, a
policy whose tokenizer carries Qwen2.5's chat template (one TRL's ``add_response_schema``
knows, in the Hermes tool-call format verl's ``hermes`` parser reads), and a reward-model
template that renders tools, tool calls and tool results.

The policy's calls of the tool, the tool's results and the answers are each one token of its
tokenizer (added as a whole, as the cities are), so a test can make the untrained policy
write a call or an answer with a bias on the token before it, or script its turns.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

import tiny_models

#: Qwen2.5-Instruct's chat template, tool-calling branches included, as TRL ships it (read
#: from TRL's folder without importing TRL).
_TRL = importlib.util.find_spec("trl")
assert _TRL is not None and _TRL.origin is not None
QWEN25_TEMPLATE = (Path(_TRL.origin).parent / "chat_templates" / "qwen2_5.jinja").read_text(
    encoding="utf-8"
)

#: The reward model's template: the tools' schemas, each call as
#: ``<call>name(arguments)</call>``, tool results under their own role.
REWARD_TEMPLATE = (
    "{%- if tools %}<|system|>\n{% for tool in tools %}{{ tool.function.name }}: "
    "{{ tool.function.parameters | tojson }}\n{% endfor %}</s>\n{% endif %}"
    "{%- for m in messages %}<|{{ m.role }}|>\n"
    "{%- if m.tool_calls %}{% for c in m.tool_calls %}<call>{{ c.function.name }}"
    "({{ c.function.arguments | tojson }})</call>{% endfor %}{% endif %}"
    "{{ m.content or '' }}</s>\n{% endfor %}"
)

#: The tool's answer per city.
WEATHER = {"Paris": "sunny, 18C", "London": "rain, 9C"}


def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: The city's name.
    """
    return WEATHER[city]


#: get_weather as a verl function tool (a file for ``multi_turn.function_tool_path``).
VERL_TOOL_SOURCE = f'''from verl.tools.function_tool import function_tool

WEATHER = {WEATHER!r}


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: The city's name.
    """
    return WEATHER[city]
'''


def call_text(city: str) -> str:
    """A call of get_weather as Qwen2.5 writes one (Hermes format)."""
    arguments = json.dumps({"city": city})
    return f'<tool_call>\n{{"name": "get_weather", "arguments": {arguments}}}\n</tool_call>'


def answer_text(city: str) -> str:
    """The policy's answer once it has the tool's result."""
    return f"In {city} it is {WEATHER[city]}."


def save_policy(path: Path) -> Path:
    """A tiny GPT-2 policy whose tokenizer has Qwen2.5's chat template and special tokens,
    saved to ``path``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    corpus = tiny_models.make_corpus(200, seed=3) + [QWEN25_TEMPLATE] * 3
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=600,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        model_max_length=4096,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_tokens(
        [
            "</tool_response>",
            *WEATHER,
            *WEATHER.values(),
            *map(call_text, WEATHER),
            *map(answer_text, WEATHER),
        ]
    )
    tokenizer.chat_template = QWEN25_TEMPLATE
    # Qwen2.5's prompt with a tool's schema is over 400 tokens of this tokenizer.
    model = tiny_models.gpt2_causal_lm(tokenizer, n_positions=1024)
    return tiny_models.save(path, model, tokenizer)
