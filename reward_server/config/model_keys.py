"""The names of a models file's entries: the kinds, the choices of their keys, and which keys
each kind reads (:mod:`reward_server.config.models_file` validates an entry with them)."""

from __future__ import annotations

from typing import Literal

__all__ = [
    "CODE_KEYS",
    "FORMAT_KEYS",
    "GENERATE_KEYS",
    "INHERITED_KEYS",
    "JUDGE_KEYS",
    "MODEL_KEYS",
    "PAIRWISE_KEYS",
    "PROCESS_KEYS",
    "PYTHON_SANDBOX_KEYS",
    "REASONING_KEYS",
    "REMOTE_KEYS",
    "REMOTE_SHARED_KEYS",
    "TOOL_CALL_KEYS",
    "VERIFIER_KEYS",
    "AggregateName",
    "CodeSandbox",
    "CodeScore",
    "JudgeMode",
    "ModelKind",
    "PairwiseAggregate",
    "ReasoningMode",
    "RemoteProtocol",
    "StepAggregate",
    "VerifierName",
]

ModelKind = Literal["sequence", "process", "verifier", "judge", "remote"]
#: The built-in verifiers of ``kind: verifier`` (:mod:`reward_server.verifiers`).
VerifierName = Literal["math", "exact", "regex", "python", "code", "tool_call", "format"]
#: How a code verifier scores an item: the share of its tests passed, or 1 when all passed.
CodeScore = Literal["pass_rate", "all_pass"]
#: Where a code verifier runs programs, or a python verifier its function: a bubblewrap
#: sandbox, or unsandboxed (trusted code; a python function in the pool's worker processes).
CodeSandbox = Literal["bwrap", "none"]
#: How several models' scores combine (the top-level ``aggregate``; the arithmetic is in
#: :mod:`reward_server.scoring.aggregate`).
AggregateName = Literal["weighted_sum", "mean", "min"]
StepAggregate = Literal["min", "mean", "last", "prod"]

#: Keys of an entry that only a process reward model reads.
PROCESS_KEYS = ("step_separator", "step_tag", "step_aggregate")
#: Keys of an entry that only a code verifier reads.
CODE_KEYS = (
    "languages",
    "score",
    "stop_on_failure",
    "test_timeout_s",
    "memory_mb",
    "output_bytes",
    "float_tolerance",
    "sandbox",
    "bwrap",
)
#: Keys of a code verifier that a python verifier reads too (its function in the sandbox).
PYTHON_SANDBOX_KEYS = ("sandbox", "bwrap", "memory_mb")
#: Keys of an entry that only a tool_call verifier reads.
TOOL_CALL_KEYS = ("tool_call_tags", "credit", "calls", "check_schema")
#: Keys of an entry that only a format verifier reads.
FORMAT_KEYS = ("answer_tags", "require_reasoning")
#: Keys of an entry that only a verifier reads.
VERIFIER_KEYS = (
    "verifier",
    "function",
    "pattern",
    "workers",
    "timeout_s",
    "on_error",
    *CODE_KEYS,
    *TOOL_CALL_KEYS,
    *FORMAT_KEYS,
)
#: How an entry treats a reasoning policy's thinking: removed before scoring, or kept.
ReasoningMode = Literal["strip", "keep"]
#: Keys of a judge in ``mode: generate`` only.
GENERATE_KEYS = ("score_pattern", "max_new_tokens", "temperature", "top_p")
#: Keys of an entry that only a judge reads.
#: Keys of a judge in ``mode: pairwise`` only.
PAIRWISE_KEYS = ("answer_tokens", "pairs", "aggregate")
JUDGE_KEYS = ("template", "mode", "score_tokens", *GENERATE_KEYS, *PAIRWISE_KEYS)
#: How a judge scores: the expected value over its score tokens' probabilities of the next
#: token (``logprobs``), a score parsed from generated text (``generate``), or the responses
#: of a group compared two at a time (``pairwise``: :mod:`reward_server.scoring.pairwise`).
JudgeMode = Literal["logprobs", "generate", "pairwise"]
#: How a pairwise judge's comparisons make each response's score.
PairwiseAggregate = Literal["win_rate", "bradley_terry"]
#: How a ``kind: remote`` entry talks to its service (the first three: reward_client's).
RemoteProtocol = Literal["remote-reward", "vllm", "tei", "openai-chat"]
#: Keys of an entry that only a remote component reads.
REMOTE_KEYS = (
    "url",
    "protocol",
    "api_key_env",
    "max_concurrent",
    "max_rpm",
    "score_pattern",
    "max_tokens",
    "temperature",
)
#: Keys a remote component shares with verifiers and judges.
REMOTE_SHARED_KEYS = ("model", "timeout_s", "on_error", "template")
#: Keys of an entry that only a model (not a verifier) reads.
MODEL_KEYS = ("model", "adapter", "merge_adapter", "label_index", "objectives")
#: Per-model keys that default to the server's flag of the same name.
INHERITED_KEYS = (
    "device",
    "dtype",
    "max_length",
    "truncation_side",
    "chat_template",
    "trust_remote_code",
    "label_index",
    "tool_rendering",
)
#: Keys every kind reads: how it treats a reasoning policy's thinking.
REASONING_KEYS = ("reasoning", "reasoning_tags", "unclosed_reasoning")
