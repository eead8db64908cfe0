"""Real-world chat templates as Jinja strings, and tiny policy tokenizers that carry them.

The templates reproduce the rendering of the named model families' published templates
(tool-calling branches left out). Each tokenizer is a byte-level BPE trained on a seeded toy
corpus with the family's special tokens, saved to disk and loaded back with
``AutoTokenizer.from_pretrained``, as a user's policy tokenizer would be. Nothing is
downloaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from tiny_models import make_corpus

#: ChatML as Qwen2.5 writes it: a default system message when none is given.
QWEN25 = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first)"
    " or message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

#: Llama-3 Instruct: BOS, role headers followed by a blank line, trimmed contents.
LLAMA3 = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)

#: Zephyr: ``<|role|>`` lines, every message closed by EOS and a newline.
ZEPHYR = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'system' %}"
    "{{ '<|system|>\\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'assistant' %}"
    "{{ '<|assistant|>\\n' + message['content'] + eos_token }}\n{% endif %}"
    "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>' }}\n{% endif %}"
    "{% endfor %}"
)

#: Llama-2 chat: the system message inside the first [INST] block, between <<SYS>> markers;
#: no generation prompt.
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}"
    "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
    "{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content.strip() + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)

#: Mistral-7B-Instruct v0.1: [INST] blocks, no system role (it raises on one).
MISTRAL_V1 = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}"
    "{% endfor %}"
)

#: Mistral-7B-Instruct v0.3: the system message goes into the *last* user message.
MISTRAL_V3 = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}"
    "{%- endif %}{{- bos_token }}{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if loop.last and system_message is defined %}"
    "{{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] + eos_token }}"
    "{%- endif %}{%- endfor %}"
)

#: Gemma-3: the system message joined to the first user message with a blank line.
GEMMA3 = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}"
    "{%- endif -%}{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '')"
    " + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)


@dataclass(frozen=True)
class Family:
    """A chat template with the special tokens its tokenizer has."""

    template: str
    eos: str
    bos: str | None = None
    pad: str | None = None
    specials: tuple[str, ...] = ()
    trims: bool = False
    """Whether the template strips whitespace around contents."""


FAMILIES: dict[str, Family] = {
    "qwen25": Family(
        QWEN25, eos="<|im_end|>", pad="<|endoftext|>", specials=("<|im_start|>", "<|im_end|>")
    ),
    "llama3": Family(
        LLAMA3,
        eos="<|eot_id|>",
        bos="<|begin_of_text|>",
        specials=("<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        trims=True,
    ),
    "zephyr": Family(
        ZEPHYR, eos="</s>", bos="<s>", specials=("<|system|>", "<|user|>", "<|assistant|>")
    ),
    "llama2": Family(LLAMA2, eos="</s>", bos="<s>", trims=True),
    "mistral_v1": Family(MISTRAL_V1, eos="</s>", bos="<s>"),
    "mistral_v3": Family(MISTRAL_V3, eos="</s>", bos="<s>", specials=("[INST]", "[/INST]")),
    "gemma3": Family(
        GEMMA3, eos="<eos>", bos="<bos>", pad="<pad>", specials=("<start_of_turn>", "<end_of_turn>")
    ),
}


def save_policy_tokenizer(path: str | Path, family: Family | str) -> Path:
    """A tiny byte-level BPE tokenizer with ``family``'s special tokens and chat template,
    saved to ``path``."""
    fam = FAMILIES[family] if isinstance(family, str) else family
    path = Path(path)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = list(dict.fromkeys(t for t in (fam.eos, fam.bos, fam.pad, *fam.specials) if t))
    tok.train_from_iterator(
        make_corpus(200, seed=3),
        trainers.BpeTrainer(
            vocab_size=350,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    named = {"eos_token": fam.eos, "bos_token": fam.bos, "pad_token": fam.pad}
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        model_max_length=4096,
        additional_special_tokens=[t for t in specials if t not in named.values()],
        clean_up_tokenization_spaces=False,
        **{k: v for k, v in named.items() if v is not None},
    )
    fast.chat_template = fam.template
    fast.save_pretrained(path)
    return path


# ------------------------------------------------------------------ tool-use templates
# Written for the tests in the styles of the major families' tool-calling templates (not
# copies): each renders tools, assistant tool calls and tool results its own way, so a
# change in any argument, result or tool changes the rendered text.

#: Hermes style (Qwen2.5, Qwen3, NousResearch): tools as JSON lines in the system turn,
#: each call as JSON inside <tool_call> tags, results as <tool_response> blocks in a user
#: turn (consecutive results in one turn); reasoning_content as a <think> block.
HERMES_TOOLS = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\n<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>"
    "<|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}"
    "<|im_end|>\n{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if message.reasoning_content %}<think>\n{{ message.reasoning_content }}\n</think>\n\n"
    "{% endif %}{{ message.content }}"
    "{%- for call in message.tool_calls or [] %}{%- set f = call.function %}"
    '\n<tool_call>\n{"name": "{{ f.name }}", "arguments": {{ f.arguments | tojson }}}\n'
    "</tool_call>{%- endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user"
    "{%- endif %}\n<tool_response>\n{{ message.content }}\n</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: Llama 3.1 style: an "Environment: ipython" system turn listing the functions, one call per
#: assistant turn as {"name", "parameters"} JSON closed by <|eom_id|>, results in an ipython
#: turn; more than one call in a turn is refused, as Llama 3.1's template does.
LLAMA31_TOOLS = (
    "{{- bos_token }}"
    "{%- if tools %}<|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
    "You have access to the following functions:\n"
    "{% for tool in tools %}\n{{ tool | tojson }}{%- endfor %}<|eot_id|>{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role in ['user', 'system'] %}"
    "<|start_header_id|>{{ message.role }}<|end_header_id|>\n\n{{ message.content | trim }}"
    "<|eot_id|>"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{%- if message.tool_calls | length != 1 %}"
    "{{- raise_exception('This model only supports single tool-calls at once!') }}{%- endif %}"
    "{%- set f = message.tool_calls[0].function %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
    '{"name": "{{ f.name }}", "parameters": {{ f.arguments | tojson }}}<|eom_id|>'
    "{%- elif message.role == 'assistant' %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{{ message.content | trim }}<|eot_id|>"
    "{%- elif message.role in ['tool', 'ipython'] %}"
    "<|start_header_id|>ipython<|end_header_id|>\n\n{{ message.content }}<|eot_id|>"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% endif %}"
)

#: Mistral style: the tools between [AVAILABLE_TOOLS] markers before the last [INST], an
#: assistant's calls as one [TOOL_CALLS] JSON list with their ids, each result as
#: [TOOL_RESULTS] {"content", "call_id"} [/TOOL_RESULTS].
MISTRAL_TOOLS = (
    "{%- set user_messages = messages | selectattr('role', 'equalto', 'user') | list %}"
    "{{- bos_token }}{%- for message in messages %}"
    "{%- if message.role == 'user' %}"
    "{%- if tools and message == user_messages[-1] %}"
    "[AVAILABLE_TOOLS] {{ tools | tojson }}[/AVAILABLE_TOOLS]"
    "{%- endif %}[INST] {{ message.content }}[/INST]"
    "{%- elif message.role == 'system' %}[SYSTEM_PROMPT]{{ message.content }}[/SYSTEM_PROMPT]"
    "{%- elif message.role == 'assistant' and message.tool_calls %}[TOOL_CALLS] ["
    "{%- for call in message.tool_calls %}"
    '{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}'
    ', "id": "{{ call.id }}"}{%- if not loop.last %}, {% endif %}{%- endfor %}]{{ eos_token }}'
    "{%- elif message.role == 'assistant' %} {{ message.content }}{{ eos_token }}"
    "{%- elif message.role == 'tool' %}[TOOL_RESULTS] "
    '{"content": {{ message.content | tojson }}, "call_id": "{{ message.tool_call_id }}"}'
    "[/TOOL_RESULTS]"
    "{%- endif %}{%- endfor %}"
)

#: The tool-use templates by name, with the special tokens their tokenizers have.
TOOL_FAMILIES: dict[str, Family] = {
    "hermes": Family(
        HERMES_TOOLS,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        specials=("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"),
    ),
    "llama31": Family(
        LLAMA31_TOOLS,
        eos="<|eot_id|>",
        bos="<|begin_of_text|>",
        specials=("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"),
        trims=True,
    ),
    "mistral": Family(
        MISTRAL_TOOLS,
        eos="</s>",
        bos="<s>",
        specials=("[INST]", "[/INST]", "[TOOL_CALLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
    ),
}
