"""The models file of ``reward-server --models FILE`` (or ``REWARD_SERVER_MODELS``): several
reward models behind one endpoint, each with its own tokenizer, chat template and limits.

.. code-block:: yaml

    aggregate: weighted_sum      # how the models' scores combine: weighted_sum | mean | min
    models:
      - name: helpful            # required, unique, letters, digits, "_", "." and "-"
        model: /models/helpful   # required: a folder or a hub id, as --model
        weight: 1.0              # default 1.0
        normalize: {mean: 0.0, std: 1.0}   # optional: (score - mean) / std before the weight
        label_index: 0           # which logit is the score (default: the server's --label-index)
      - name: safety
        model: /models/armo-like
        objectives: {harmless: 0.7, honest: 0.3}  # or weights by label name (id2label)
        max_length: 1024         # per-model: device, dtype, max_length, truncation_side,
        chat_template: auto      #   chat_template, trust_remote_code (default: the server's)
        adapter: null            # optional PEFT adapter (merge_adapter: false)
        kind: sequence           # sequence | process (a per-step reward model) | verifier | judge
        # kind: process only: step_separator ("\\n\\n"), step_tag (null), step_aggregate (min)
      - name: correct            # a rule instead of a model: no `model` key
        kind: verifier
        verifier: math           # math | exact | regex (pattern:) | python (function: mod:fn;
        weight: 1.0              #   sandbox: bwrap to call it in a sandbox) | code (below)
        workers: 2               # processes verifying items (default 1)
        timeout_s: 5             # per item; a timeout, crash or error scores on_error:
        on_error: mask           # mask (the default: null in scores, with its reason) or a number
      - name: tests              # programs run against each item's tests (label), sandboxed
        kind: verifier
        verifier: code
        languages: [python, cpp, javascript]   # the first: a block without a language tag
        score: pass_rate         # or all_pass; stop_on_failure: false
        test_timeout_s: 10       # one test; timeout_s (60): all of an item's tests
        memory_mb: 1024          # output_bytes (1 MiB), float_tolerance (none), workers (cores)
        sandbox: bwrap           # none: unsandboxed (trusted programs only; warned at start)
      - name: judge              # a causal LM that reads a prompt and answers a token
        kind: judge
        model: /models/small-instruct-lm
        template: |              # Jinja (prompt, response, label, messages) or a .jinja file
          Question: {{ prompt }}
          Answer: {{ response }}
          Is the answer correct? Reply Yes or No.
        mode: logprobs           # the expected value over score_tokens, or generate:
        score_tokens: {"Yes": 1.0, "No": 0.0}   # each one token of the judge's tokenizer
      - name: pairs              # a judge comparing the responses of a group, two at a time
        kind: judge
        model: /models/small-instruct-lm
        mode: pairwise           # requests must send groups
        template: |              # Jinja: prompt, response_a, response_b, label, messages
          Question: {{ prompt }}
          A: {{ response_a }}
          B: {{ response_b }}
          Which answer is better? Reply A or B.
        answer_tokens: ["A", "B"]   # each one token: the first says response_a is better
        pairs: all               # or k: each response against about k others (O(n k))
        aggregate: win_rate      # or bradley_terry; on_error (mask): an item without opponent
      - name: other              # scored by another HTTP service through reward_client
        kind: remote
        url: http://rm-host:8000 # or a list; dns+http:// as in reward_client
        protocol: remote-reward  # remote-reward | vllm | tei | openai-chat (a judge)
        model: null              # the remote model's name where the protocol needs one
        api_key_env: OTHER_RM_KEY   # the NAME of an environment variable holding the key
        timeout_s: 30            # a call's time budget, the client's retries included
        max_concurrent: 8        # requests in flight to it at once
        max_rpm: null            # requests per minute (an API judge's rate limit)
        on_error: mask           # an item the remote finally failed on: masked, or a number
        # openai-chat: template, score_pattern (one group), max_tokens (16), temperature (0)
        # mode: generate: score_pattern (a regex, one group: the number), max_new_tokens (32),
        # temperature (0: greedy) and top_p, on_error (mask: an answer without a number)

What the numbers mean: a model's own score per item is the raw logit of its ``label_index``,
or with ``objectives`` the sum over its labels of weight x raw logit; a judge's, the expected
value of its score tokens' values under its next-token probabilities renormalised over them,
or in ``mode: generate`` the number its score_pattern finds in its generated answer
(:mod:`reward_server.scoring.judge_model`), or in ``mode: pairwise`` the response's win rate
or Bradley-Terry strength within its group (:mod:`reward_server.scoring.pairwise`). The combined score is
``v_m = weight_m * (s_m - mean_m) / std_m`` (normalize optional), summed (``weighted_sum``),
averaged (``mean``) or the least (``min``) over the models. Server-wide flags (batching
limits, auth, --no-truncate, --engine, ...) stay server-wide. Any key not listed here is an
error naming it.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from reward_server.config._yaml_file import read_yaml_file
from reward_server.config.load_options import LoadOptions
from reward_server.config.model_keys import (
    CODE_KEYS,
    FORMAT_KEYS,
    GENERATE_KEYS,
    INHERITED_KEYS,
    JUDGE_KEYS,
    MODEL_KEYS,
    PAIRWISE_KEYS,
    PROCESS_KEYS,
    PYTHON_SANDBOX_KEYS,
    REASONING_KEYS,
    REMOTE_KEYS,
    REMOTE_SHARED_KEYS,
    TOOL_CALL_KEYS,
    VERIFIER_KEYS,
    AggregateName,
    CodeSandbox,
    CodeScore,
    JudgeMode,
    ModelKind,
    PairwiseAggregate,
    ReasoningMode,
    RemoteProtocol,
    StepAggregate,
    VerifierName,
)
from reward_server.errors import ModelsFileError, validation_problem

__all__ = [
    "AggregateName",
    "CodeSandbox",
    "CodeScore",
    "ModelKind",
    "ModelSpec",
    "ModelsFile",
    "ModelsFileError",
    "Normalize",
    "VerifierName",
    "parse_models_file",
    "read_models_file",
]


def pattern_groups(pattern: str) -> int:
    """How many groups the regular expression ``pattern`` has (ValueError if it is none)."""
    try:
        return re.compile(pattern).groups
    except re.error as exc:
        raise ValueError(f"score_pattern is not a regular expression: {exc}") from None


class Normalize(BaseModel):
    """``(score - mean) / std``, applied to a model's score before its weight."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    mean: float = 0.0
    """Subtracted from the model's score before its weight."""
    std: float = Field(default=1.0, gt=0)
    """The score minus mean is divided by it."""


class ModelSpec(BaseModel):
    """One entry of the models file: what to load and how its score counts."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    """The model's name in answers, /info and /metrics; unique; letters, digits, _, . and -."""
    model: str | None = Field(default=None, min_length=1)
    """A folder or a hub id, as --model (none for kind: verifier and kind: remote)."""
    adapter: str | None = Field(default=None, min_length=1)
    """A PEFT adapter on top of model, as --adapter."""
    merge_adapter: bool = False
    """Merge the adapter into the base weights at load time, as --merge-adapter."""
    weight: float = 1.0
    """The model's weight in the aggregate."""
    label_index: int | None = Field(default=None, ge=0)
    """Which logit is the model's score (default: --label-index); not with objectives."""
    objectives: dict[str, float] | None = Field(default=None, min_length=1)
    """Weights by label name (the config's id2label): the score is the sum of weight x raw logit."""
    normalize: Normalize | Literal["group", "group_rank"] | None = None
    """{mean, std}: the score becomes (score - mean) / std before the weight; group: (score - the group's mean) / the group's standard deviation, over the request's groups (0 where the group's scores are all equal); group_rank: the score's rank in its group, scaled to [-0.5, 0.5]. A request to a model normalising by group must send groups."""
    kind: ModelKind = "sequence"
    """sequence (a reward model), process (a score per step; at most one per file), verifier (a rule), judge (a causal LM reading a template) or remote (another HTTP service)."""
    device: str | None = Field(default=None, pattern=r"^(auto|cpu|mps|cuda(:\d+)?)$")
    """Per model, as --device (default: the server's flag)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = None
    """Per model, as --dtype (default: the server's flag)."""
    max_length: int | None = Field(default=None, gt=0)
    """Per model, as --max-length (default: the server's flag, else the model's limit)."""
    truncation_side: Literal["left", "right"] | None = None
    """Per model, as --truncation-side (default: the server's flag)."""
    chat_template: str | None = Field(default=None, min_length=1)
    """Per model, as --chat-template (default: the server's flag)."""
    trust_remote_code: bool | None = None
    """Per model, as --trust-remote-code (default: the server's flag)."""
    step_separator: str = Field(default="\n\n", min_length=1)
    """kind: process: what splits a response into steps."""
    step_tag: str | None = Field(default=None, min_length=1)
    """kind: process: the token read after each step (replaces the separators); one token of the model's tokenizer."""
    step_aggregate: StepAggregate = "min"
    """kind: process: how the step scores make the model's score."""
    verifier: VerifierName | None = None
    """kind: verifier: the rule (math via math-verify, exact, regex, python, or code: the response's program run against the item's tests in a sandbox)."""
    function: str | None = Field(default=None, pattern=r"^[^:]+:[A-Za-z_][A-Za-z0-9_]*$")
    """verifier: python: module:function or path/to/file.py:function, called as f(prompt, response, label)."""
    pattern: str | None = Field(default=None, min_length=1)
    """verifier: regex: the regular expression (default: the item's label)."""
    workers: int = Field(default=1, ge=1, le=256)
    """kind: verifier: worker processes (default 1); verifier: code: tests run at once, over all items (default: the machine's cores)."""
    timeout_s: float = Field(default=5.0, gt=0, le=3600)
    """kind: verifier: seconds per item (default 5; verifier: code: the run time of all of an item's tests and its compilation, default 60, after which its remaining tests are timeouts); kind: remote: one request's limit and the retry budget of one call."""
    on_error: float | Literal["mask"] = "mask"
    """kind: verifier, judge (mode: generate, pairwise) and remote: what an item whose verification, parse or remote call failed (a pairwise judge: an item without an opponent, or whose comparison was not finite) gets: mask (the default: null in scores, with its reason; a trainer leaves it out) or a number, its score."""
    languages: list[str] = Field(default=["python"], min_length=1)
    """verifier: code: the languages a program may be in (python, cpp, javascript; aliases such as py, c++, js); a fenced block's language tag picks one, the first is for a block without a tag."""
    score: CodeScore = "pass_rate"
    """verifier: code: pass_rate (the share of the item's tests passed) or all_pass (1 when every test passed, else 0)."""
    stop_on_failure: bool = False
    """verifier: code: after an item's first failed test start none of its others (they are skipped, and count as failed)."""
    test_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    """verifier: code: seconds one test may run (wall clock)."""
    memory_mb: int = Field(default=1024, ge=16, le=1 << 20)
    """verifier: code: a program's memory limit (address space), in MiB; verifier: python with sandbox: bwrap: the function's."""
    output_bytes: int = Field(default=1 << 20, ge=1024)
    """verifier: code: most bytes kept of a test's stdout (and of its stderr); a program that writes more is stopped: output_exceeded."""
    float_tolerance: float | None = Field(default=None, ge=0)
    """verifier: code: numbers in an answer match the expected ones within this tolerance, absolute or relative (default: exact)."""
    sandbox: CodeSandbox | None = None
    """verifier: code: bwrap (the default: every program in a bubblewrap sandbox; the server does not start where none can be made) or none (unsandboxed: trusted programs only, warned at every start). verifier: python: none (the default: the function runs in the worker processes, with the server's rights) or bwrap (each item's call in a sandbox of its own, seeing Python's standard library and the function's own file only; the server does not start where none can be made, or where the function does not import there)."""
    bwrap: str | None = Field(default=None, min_length=1)
    """verifier: code, and python with sandbox: bwrap: the bwrap binary to use (default: the one the server extra installs, else bwrap on PATH)."""
    reasoning: ReasoningMode | None = None
    """Every kind: strip (remove a reasoning policy's thinking, the blocks between reasoning_tags and reasoning_content, before scoring: the default, except for kind: process and verifier: format) or keep (score it as sent)."""
    reasoning_tags: tuple[str, str] = ("<think>", "</think>")
    """Every kind: the opening and the closing tag of a thinking block."""
    unclosed_reasoning: float | Literal["mask"] = "mask"
    """Every kind, with reasoning: strip: what an item whose response opens a thinking block and never closes it (the policy ran out of tokens) gets: mask (the default: null in scores, reason unclosed_reasoning) or a number, its score."""
    tool_rendering: Literal["template", "text"] | None = None
    """kind: sequence, process and judge: template (the default: tool calls, tool results and tools reach the chat template; a template that does not show them makes such a request a 422) or text (what the template does not show is written into the messages as plain text: <tool_call> and <tool_response> blocks, and the tools in front of the system message; see the agents guide)."""
    tool_call_tags: tuple[str, str] | None = ("<tool_call>", "</tool_call>")
    """verifier: tool_call: the tags around a call written in the response's text (read when the response message has no tool_calls); null: only tool_calls count."""
    credit: Literal["all", "partial"] = "all"
    """verifier: tool_call: all (1 when every expected call is made right, else 0) or partial (the share of the expected calls made right; see the agents guide)."""
    calls: Literal["response", "trajectory"] = "response"
    """verifier: tool_call: the calls checked: the response message's (response), or every assistant message's after the last user message, in order (trajectory)."""
    check_schema: bool = True
    """verifier: tool_call: check each call's arguments against its tool's JSON schema (when the item sends tools)."""
    answer_tags: tuple[str, str] | None = None
    """verifier: format: the tags the answer must be between (one such block after the thinking); null: no answer tag."""
    require_reasoning: bool = True
    """verifier: format: the response must hold one closed thinking block (reasoning_tags) before its answer."""
    template: str | None = Field(default=None, min_length=1)
    """kind: judge and openai-chat remotes: the Jinja prompt (prompt, response, label, messages) or a path to a .jinja file."""
    mode: JudgeMode = "logprobs"
    """kind: judge: logprobs (expected value over score_tokens, one forward pass), generate (score_pattern over the generated answer) or pairwise (the responses of a request's group compared two at a time)."""
    score_tokens: dict[str, float] | None = Field(default=None, min_length=2)
    """kind: judge, mode: logprobs: the value of each score token (each one token)."""
    answer_tokens: list[str] | None = Field(default=None, min_length=2, max_length=2)
    """kind: judge, mode: pairwise: two answers, each one token: the first says the first response shown (response_a) is the better, the second that response_b is."""
    pairs: Literal["all"] | StrictInt = "all"
    """kind: judge, mode: pairwise: all (every pair of a group) or k >= 1 (each response against about k others: the ring pairs i, i + d for d = 1 .. ceil(k / 2))."""
    aggregate: PairwiseAggregate = "win_rate"
    """kind: judge, mode: pairwise: win_rate (the mean probability of beating each opponent) or bradley_terry (the strengths of a Bradley-Terry fit)."""
    url: str | list[str] | None = Field(default=None, min_length=1)
    """kind: remote: the service's base URL or a list (dns+http:// names as in reward_client)."""
    protocol: RemoteProtocol = "remote-reward"
    """kind: remote: what the service speaks."""
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    """kind: remote: the name of the environment variable holding the service's key (never the key)."""
    max_concurrent: int = Field(default=8, ge=1, le=4096)
    """kind: remote: requests in flight to the service at once."""
    max_rpm: int | None = Field(default=None, ge=1)
    """kind: remote: request starts in any 60 s window."""
    score_pattern: str | None = Field(default=None, min_length=1)
    """judge mode: generate and openai-chat remotes: a regular expression with one group, the score."""
    max_tokens: int = Field(default=16, ge=1)
    """kind: remote, openai-chat: most tokens of the reply."""
    temperature: float = Field(default=0.0, ge=0)
    """judge mode: generate and openai-chat remotes: sampling temperature (0: greedy)."""
    max_new_tokens: int = Field(default=32, ge=1, le=4096)
    """kind: judge, mode: generate: most new tokens of the answer."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """kind: judge, mode: generate: nucleus sampling when temperature is above 0."""

    @field_validator("reasoning_tags", "tool_call_tags", "answer_tags")
    @classmethod
    def _two_tags(
        cls, value: tuple[str, str] | None, info: ValidationInfo
    ) -> tuple[str, str] | None:
        if value is not None and (not value[0] or not value[1] or value[0] == value[1]):
            raise ValueError(f"{info.field_name}: two different, non-empty tags")
        return value

    @property
    def reasoning_mode(self) -> ReasoningMode:
        """``reasoning`` as given, else the kind's default: keep for a process model (its
        steps are the thinking) and a format verifier (it checks the thinking's shape),
        strip for the others."""
        if self.reasoning is not None:
            return self.reasoning
        keeps = self.kind == "process" or (self.kind == "verifier" and self.verifier == "format")
        return "keep" if keeps else "strip"

    @field_validator("weight", "on_error", "unclosed_reasoning")
    @classmethod
    def _finite(cls, value: float | str, info: ValidationInfo) -> float | str:
        if not isinstance(value, str) and not math.isfinite(value):
            raise ValueError(f"{info.field_name} must be a finite number")
        return value

    @field_validator("normalize", mode="before")
    @classmethod
    def _one_normalize(cls, value: Any) -> Any:
        """{mean, std} or group or group_rank, with one error naming what is wrong (not one
        per form the value could have taken)."""
        if isinstance(value, str):
            if value not in ("group", "group_rank"):
                raise ValueError(f"give {{mean, std}}, group or group_rank, not {value!r}")
            return value
        if value is None or isinstance(value, Normalize):
            return value
        try:
            return Normalize.model_validate(value)
        except ValidationError as exc:
            problems = "; ".join(
                validation_problem(e).removeprefix("top level: ") for e in exc.errors()
            )
            raise ValueError(f"{{mean, std}}: {problems}") from None

    @field_validator("objectives", "score_tokens")
    @classmethod
    def _finite_values(
        cls, value: dict[str, float] | None, info: ValidationInfo
    ) -> dict[str, float] | None:
        bad = [k for k, w in (value or {}).items() if not math.isfinite(w)]
        what = "objective weights" if info.field_name == "objectives" else "score token values"
        if bad:
            raise ValueError(f"{what} must be finite numbers ({', '.join(bad)})")
        if "" in (value or {}):
            raise ValueError(f"{info.field_name}: an empty name")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        if self.kind == "remote":
            return self._consistent_remote()
        if self.objectives is not None and self.label_index is not None:
            raise ValueError("give label_index or objectives, not both")
        if self.kind != "process":
            given = [key for key in PROCESS_KEYS if key in self.model_fields_set]
            if given:
                raise ValueError(f"{', '.join(given)}: only for kind: process")
        self._no_remote_keys()
        if self.kind != "judge":
            given = [key for key in JUDGE_KEYS if key in self.model_fields_set]
            if given:
                raise ValueError(f"{', '.join(given)}: only for kind: judge")
        if self.kind == "verifier":
            return self._consistent_verifier()
        self._no_verifier_keys()
        if self.kind == "judge":
            self._consistent_judge()
        if self.model is None:
            raise ValueError("'model' is required")
        return self

    @property
    def masks(self) -> bool:
        """Whether an item this model failed on is masked (``on_error: mask``)."""
        return self.on_error == "mask"

    @property
    def error_score(self) -> float:
        """The score a failed item carries: ``on_error`` as a number, 0.0 when it is masked
        (then only seen in ``components`` of a weight-0 model, never in a trainer's reward)."""
        return 0.0 if isinstance(self.on_error, str) else float(self.on_error)

    def _no_verifier_keys(self) -> None:
        # A judge in mode: generate scores on_error when its pattern finds no number.
        shared = ("on_error",) if self.kind == "judge" else ()
        given = [k for k in VERIFIER_KEYS if k in self.model_fields_set and k not in shared]
        if given:
            raise ValueError(f"{', '.join(given)}: only for kind: verifier")

    def _consistent_verifier(self) -> ModelSpec:
        given = [key for key in (*MODEL_KEYS, *INHERITED_KEYS) if key in self.model_fields_set]
        if given:
            raise ValueError(f"{', '.join(given)}: not for kind: verifier (it loads no model)")
        if self.verifier is None:
            raise ValueError("kind: verifier needs 'verifier' (math, exact, regex, python or code)")
        if self.verifier == "python" and self.function is None:
            raise ValueError("verifier: python needs 'function' (module:function)")
        if self.function is not None and self.verifier != "python":
            raise ValueError("'function' is only for verifier: python")
        self._own_verifier_keys()
        python = self.verifier == "python"
        if self.verifier != "code":
            shared = PYTHON_SANDBOX_KEYS if python else ()
            given = [k for k in CODE_KEYS if k in self.model_fields_set and k not in shared]
            if given:
                raise ValueError(f"{', '.join(given)}: only for verifier: code")
        if self.verifier in ("code", "python") and self.sandbox is None:
            # The verifier's own default: code runs sandboxed, a python function (as it
            # always did) in the worker processes. Set on the frozen entry as its value,
            # not as a key the file gave.
            object.__setattr__(self, "sandbox", "none" if python else "bwrap")
        if self.bwrap is not None and self.sandbox == "none":
            raise ValueError("bwrap: not with sandbox: none (it runs no sandbox)")
        if python and self.sandbox == "none" and "memory_mb" in self.model_fields_set:
            raise ValueError("memory_mb: for verifier: python only with sandbox: bwrap")
        return self

    def _own_verifier_keys(self) -> None:
        """ValueError for a key of one verifier given to another."""
        if self.pattern is not None and self.verifier not in ("regex", "format"):
            raise ValueError("'pattern' is only for verifier: regex and format")
        for keys, verifier in ((TOOL_CALL_KEYS, "tool_call"), (FORMAT_KEYS, "format")):
            given = [k for k in keys if k in self.model_fields_set and self.verifier != verifier]
            if given:
                raise ValueError(f"{', '.join(given)}: only for verifier: {verifier}")

    def _no_remote_keys(self) -> None:
        # A judge in mode: generate reads score_pattern and temperature too.
        mine = GENERATE_KEYS if self.kind == "judge" else ()
        given = [k for k in REMOTE_KEYS if k in self.model_fields_set and k not in mine]
        if given:
            raise ValueError(f"{', '.join(given)}: only for kind: remote")

    def _consistent_remote(self) -> ModelSpec:
        allowed = {
            "name",
            "kind",
            "weight",
            "normalize",
            *REMOTE_KEYS,
            *REMOTE_SHARED_KEYS,
            *REASONING_KEYS,
            "tool_rendering",
        }
        given = sorted(self.model_fields_set - allowed)
        if given:
            raise ValueError(f"{', '.join(given)}: not for kind: remote")
        if self.url is None:
            raise ValueError("kind: remote needs 'url' (one base URL or a list)")
        chat = self.protocol == "openai-chat"
        if chat and (self.template is None or self.score_pattern is None):
            raise ValueError("protocol: openai-chat needs 'template' and 'score_pattern'")
        if chat and self.model is None:
            raise ValueError("protocol: openai-chat needs 'model' (the remote model's name)")
        if self.protocol in ("vllm", "tei") and self.model is not None:
            raise ValueError(f"'model': not for protocol: {self.protocol} (it serves one model)")
        chat_only = ("template", "score_pattern", "max_tokens", "temperature")
        given = [key for key in chat_only if key in self.model_fields_set and not chat]
        if given:
            raise ValueError(f"{', '.join(given)}: only for protocol: openai-chat")
        groups = 1 if self.score_pattern is None else pattern_groups(self.score_pattern)
        if groups != 1:
            raise ValueError(f"score_pattern needs exactly one group, it has {groups}")
        return self

    def _consistent_judge(self) -> None:
        given = [
            key
            for key in ("adapter", "merge_adapter", "label_index", "objectives")
            if key in self.model_fields_set
        ]
        if given:
            raise ValueError(f"{', '.join(given)}: not for kind: judge")
        if self.template is None:
            raise ValueError("kind: judge needs 'template' (Jinja text or a .jinja file)")
        if self.mode != "pairwise":
            given = [k for k in PAIRWISE_KEYS if k in self.model_fields_set]
            if given:
                raise ValueError(f"{', '.join(given)}: only for mode: pairwise")
        if self.mode == "generate":
            self._consistent_generate()
            return
        if self.mode == "pairwise":
            self._consistent_pairwise()
            return
        given = [k for k in (*GENERATE_KEYS, "on_error") if k in self.model_fields_set]
        if given:
            raise ValueError(f"{', '.join(given)}: only for mode: generate")
        if self.score_tokens is None:
            raise ValueError('kind: judge needs \'score_tokens\' (e.g. {"Yes": 1.0, "No": 0.0})')

    def _consistent_pairwise(self) -> None:
        given = [k for k in (*GENERATE_KEYS, "score_tokens") if k in self.model_fields_set]
        if given:
            raise ValueError(f"{', '.join(given)}: not for mode: pairwise (answer_tokens)")
        if self.answer_tokens is None:
            raise ValueError('mode: pairwise needs \'answer_tokens\' (e.g. ["A", "B"])')
        if self.answer_tokens[0] == self.answer_tokens[1] or "" in self.answer_tokens:
            raise ValueError("answer_tokens: two different, non-empty answers")
        if self.pairs != "all" and self.pairs < 1:
            raise ValueError(f"pairs: all or an integer k >= 1, not {self.pairs!r}")

    def _consistent_generate(self) -> None:
        if "score_tokens" in self.model_fields_set:
            raise ValueError("score_tokens: only for mode: logprobs (generate: score_pattern)")
        if self.score_pattern is None:
            raise ValueError("mode: generate needs 'score_pattern' (e.g. 'Score: (\\d+)')")
        try:
            groups = re.compile(self.score_pattern).groups
        except re.error as exc:
            raise ValueError(f"score_pattern {self.score_pattern!r}: {exc}") from None
        if groups != 1:
            raise ValueError(f"score_pattern needs exactly one group (the score), not {groups}")
        if self.top_p is not None and self.temperature == 0:
            raise ValueError("top_p samples: give a temperature above 0 too (0: greedy)")

    def load_options(self, server: LoadOptions) -> LoadOptions:
        """The server's load options with this entry's model and per-model keys over them."""
        if self.model is None:
            raise ValueError(f"model {self.name!r} is a {self.kind}: it loads no model")
        if self.kind == "remote":
            raise ValueError(f"model {self.name!r} is remote: it loads no model")
        own = {key: getattr(self, key) for key in INHERITED_KEYS if getattr(self, key) is not None}
        if self.objectives is not None:
            own["label_index"] = 0  # every label is read; the scorer's own one must exist
        return dataclasses.replace(
            server,
            model=self.model,
            adapter=self.adapter,
            merge_adapter=self.merge_adapter,
            reasoning_tags=self.reasoning_tags,
            **own,
        )


class ModelsFile(BaseModel):
    """The whole models file: the models and how their scores combine."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    aggregate: AggregateName = "weighted_sum"
    """How the models' weighted scores combine: their sum, its mean over the models, or the least."""
    models: list[ModelSpec] = Field(min_length=1)
    """The served models, in order."""

    @model_validator(mode="after")
    def _unique_names_one_process(self) -> ModelsFile:
        names = [spec.name for spec in self.models]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"model names must be unique ({', '.join(twice)} repeated)")
        process = [spec.name for spec in self.models if spec.kind == "process"]
        if len(process) > 1:
            raise ValueError(f"at most one kind: process model ({', '.join(process)})")
        return self

    @property
    def names(self) -> list[str]:
        """The models' names, in the file's order."""
        return [spec.name for spec in self.models]


def parse_models_file(data: Any, source: str = "models file") -> ModelsFile:
    """Validate the parsed YAML of a models file; ModelsFileError naming every problem."""
    if not isinstance(data, dict):
        raise ModelsFileError(f"{source}: expected a mapping with a 'models' list")
    try:
        return ModelsFile.model_validate(data)
    except ValidationError as exc:
        problems = [validation_problem(err) for err in exc.errors()]
        raise ModelsFileError(f"{source}: {'; '.join(problems)}") from None


def read_models_file(path: str | Path) -> ModelsFile:
    """Read and validate the models file at ``path``; ModelsFileError when it is not right."""
    data = read_yaml_file(path, "models file", ModelsFileError)
    return parse_models_file(data, str(path))
