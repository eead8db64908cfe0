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
        workers: 2               #   | tool_call | format (the agents guide); processes (1)
        timeout_s: 5             # per item; a timeout, crash or error scores on_error:
        on_error: mask           # mask (the default: null in scores, with its reason) or a number
      - name: tests              # programs run against each item's tests (label), sandboxed
        kind: verifier
        verifier: code
        languages: [python, cpp, javascript]   # the first: a block without a language tag
        score: pass_rate         # or all_pass; stop_on_failure: false
        test_timeout_s: 10       # one test; timeout_s (60): all of an item's tests
        memory_mb: 1024          # output_bytes (1 MiB), float_tolerance (none), parallel_tests
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
        pairwise_aggregate: win_rate   # or bradley_terry; on_error (mask): no opponent
      - name: rubric             # each item's label is its rubric: a list of criteria
        kind: judge              #   {text, weight or category, required}
        model: /models/small-instruct-lm
        mode: rubric
        template: |              # Jinja: criterion (its text) and category, rubric (all of
          Question: {{ prompt }} #   them), prompt, response, label, messages
          Answer: {{ response }}
          Does the answer satisfy this criterion? {{ criterion }}
          Reply Yes or No.
        aggregation: explicit    # one row per criterion; or implicit: one generated rating
        verdict: logprobs        # or generate (verdict_pattern); verdict_tokens [Yes, No]
        categories: {essential: 1.0, important: 0.7, optional: 0.3, pitfall: -0.9}
      - name: other              # scored by another HTTP service through reward_client
        kind: remote
        url: http://rm-host:8000 # or a list; dns+http:// as in reward_client
        protocol: remote-reward  # remote-reward | vllm | tei | openai-chat (a judge)
        remote_model: null       # the remote model's name where the protocol needs one
        api_key_env: OTHER_RM_KEY   # the NAME of an environment variable holding the key
        call_timeout_s: 30       # a call's time budget, the client's retries included
        max_concurrent: 8        # requests in flight to it at once
        max_rpm: null            # requests per minute (an API judge's rate limit)
        on_error: mask           # an item the remote finally failed on: masked, or a number
        # openai-chat: template, score_pattern (one group), max_new_tokens (16), temperature
        # mode: generate: score_pattern (a regex, one group: the number), max_new_tokens (32),
        # temperature (0: greedy) and top_p, on_error (mask: an answer without a number)
      - name: rft                # an OpenAI grader object, verbatim (the graders guide)
        kind: grader
        grader: {type: string_check, name: exact, operation: eq,
                 input: "{{ sample.output_text }}", reference: "{{ item.answer }}"}
        # or grader_file: FILE (JSON or YAML); workers (1); timeout_s (120: a python
        # grader's time per item), memory_mb (2048), disk_mb (1024), sandbox (bwrap);
        # embedding_model (cosine); models: {grader model name: entry of this file};
        # on_error (mask; 0 is OpenAI's behaviour)

What the numbers mean: a model's own score per item is the raw logit of its ``label_index``,
or with ``objectives`` the sum over its labels of weight x raw logit; a judge's, the expected
value of its score tokens' values under its next-token probabilities renormalised over them,
or in ``mode: generate`` the number its score_pattern finds in its generated answer
(:mod:`reward_server.scoring.judge_model`), or in ``mode: pairwise`` the response's win rate
or Bradley-Terry strength within its group (:mod:`reward_server.scoring.pairwise`). The combined score is
``v_m = weight_m * (s_m - mean_m) / std_m`` (normalize optional), summed (``weighted_sum``),
averaged (``mean``) or the least (``min``) over the models. Server-wide flags (batching
limits, auth, --no-truncate, --engine, ...) stay server-wide. Any key not listed here is an
error naming it, a key of another kind an error naming the kinds that take it, and a renamed
key an error naming the new one. One class per kind holds its keys
(:mod:`reward_server.config.entries`, :mod:`~reward_server.config.verifier_entries`,
:mod:`~reward_server.config.remote_entry`): :data:`ModelSpec` is their union, told apart by
``kind`` (a verifier's by ``verifier``, a judge's by ``mode``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from reward_server.config._yaml_file import read_yaml_file
from reward_server.config.entries import (
    Entry,
    GenerateJudge,
    LoadedEntry,
    LogprobsJudge,
    Normalize,
    PairwiseJudge,
    ProcessEntry,
    RubricJudge,
    SequenceEntry,
)
from reward_server.config.grader_entry import GraderEntry
from reward_server.config.remote_entry import RemoteEntry
from reward_server.config.verifier_entries import (
    CodeVerifierEntry,
    ExactVerifier,
    FormatVerifier,
    MathVerifier,
    PythonVerifier,
    RegexVerifier,
    ToolCallVerifier,
)
from reward_server.errors import ModelsFileError, validation_problem

__all__ = [
    "KINDS",
    "AggregateName",
    "ModelKind",
    "ModelSpec",
    "ModelsFile",
    "ModelsFileError",
    "Normalize",
    "foreign_keys",
    "parse_entry",
    "parse_models_file",
    "read_models_file",
]

ModelKind = Literal["sequence", "process", "verifier", "judge", "remote", "grader"]
#: How several models' scores combine (the top-level ``aggregate``; the arithmetic is in
#: :mod:`reward_server.scoring.aggregate`).
AggregateName = Literal["weighted_sum", "mean", "min"]

#: Every class of entry, each selected by its kind (and verifier or mode).
KINDS: tuple[type[Entry], ...] = (
    SequenceEntry,
    ProcessEntry,
    LogprobsJudge,
    GenerateJudge,
    PairwiseJudge,
    RubricJudge,
    MathVerifier,
    ExactVerifier,
    RegexVerifier,
    PythonVerifier,
    CodeVerifierEntry,
    ToolCallVerifier,
    FormatVerifier,
    RemoteEntry,
    GraderEntry,
)


def _kind_of(cls: type[Entry]) -> str:
    """The ``kind`` an entry class takes (its field's one literal value)."""
    return str(get_args(cls.model_fields["kind"].annotation)[0])


def _owners_label(cls: type[Entry], owners: list[type[Entry]]) -> str:
    """Where a key belongs, said from ``cls``'s side: its own kind's variants that take it
    (``only for mode: generate or pairwise``), a model's key given to an entry that loads
    none, else the kinds that take it (``only for kind: judge``)."""
    kind = _kind_of(cls)
    siblings = [o for o in owners if _kind_of(o) == kind]
    if siblings:
        field = siblings[0].SELECTOR.split(":")[0]
        values = [o.SELECTOR.split(": ", 1)[1] for o in siblings]
        return f"only for {field}: {_or(values)}"
    if not issubclass(cls, LoadedEntry) and all(issubclass(o, LoadedEntry) for o in owners):
        return f"not for kind: {kind} (it loads no model)"
    kinds = list(dict.fromkeys(_kind_of(o) for o in owners))
    return f"only for kind: {_or(kinds)}"


def _or(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def foreign_keys(cls: type[Entry], given: Any) -> str | None:
    """The keys of ``given`` that ``cls`` has not but another kind has, with where they
    belong (``step_tag: only for kind: process``); None when there are none (an unknown key
    is left to pydantic: 'unknown key')."""
    own = set(cls.model_fields)
    by_label: dict[str, list[str]] = {}
    for key in given:
        owners = [other for other in KINDS if key in other.model_fields]
        if key in own or not owners:
            continue
        by_label.setdefault(_owners_label(cls, owners), []).append(key)
    parts = [f"{', '.join(keys)}: {label}" for label, keys in by_label.items()]
    return "; ".join(parts) or None


Entry.key_check = staticmethod(foreign_keys)  # type: ignore[assignment]

_VERIFIERS = ("math", "exact", "regex", "python", "code", "tool_call", "format")


def _field(value: Any, key: str, default: str | None, known: tuple[str, ...]) -> str | None:
    """The tag of an entry by its ``key`` (``default`` when it has none), None when unknown."""
    found = value.get(key, default) if isinstance(value, dict) else getattr(value, key, None)
    return f"<{key}: {found}>" if found in known else None


def _tagged(cls: type[Entry]) -> Any:
    return Annotated[cls, Tag(f"<{cls.SELECTOR}>")]


Judge = Annotated[
    Union[  # noqa: UP007
        _tagged(LogprobsJudge),
        _tagged(GenerateJudge),
        _tagged(PairwiseJudge),
        _tagged(RubricJudge),
    ],
    Discriminator(
        lambda v: _field(v, "mode", "logprobs", ("logprobs", "generate", "pairwise", "rubric")),
        custom_error_type="judge_mode",
        custom_error_message="mode: Input should be 'logprobs', 'generate', 'pairwise' or 'rubric'",
    ),
]
Verifier = Annotated[
    Union[tuple(_tagged(cls) for cls in KINDS if _kind_of(cls) == "verifier")],  # noqa: UP007
    Discriminator(
        lambda v: _field(v, "verifier", None, _VERIFIERS),
        custom_error_type="verifier_name",
        custom_error_message=f"kind: verifier needs 'verifier' ({_or(list(_VERIFIERS))})",
    ),
]
#: One entry of the models file: the class of its kind.
ModelSpec = Annotated[
    Union[  # noqa: UP007
        Annotated[SequenceEntry, Tag("<kind: sequence>")],
        Annotated[ProcessEntry, Tag("<kind: process>")],
        Annotated[Judge, Tag("<kind: judge>")],
        Annotated[Verifier, Tag("<kind: verifier>")],
        Annotated[RemoteEntry, Tag("<kind: remote>")],
        Annotated[GraderEntry, Tag("<kind: grader>")],
    ],
    Discriminator(
        lambda v: _field(
            v,
            "kind",
            "sequence",
            ("sequence", "process", "judge", "verifier", "remote", "grader"),
        ),
        custom_error_type="model_kind",
        custom_error_message="kind is sequence, process, verifier, judge, remote or grader",
    ),
]


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


_ENTRY: TypeAdapter[Any] = TypeAdapter(ModelSpec)


def parse_entry(data: Any) -> ModelSpec:
    """One entry (a mapping, as in a models file) as the class of its kind; ValidationError
    when it is not valid."""
    return _ENTRY.validate_python(data)  # type: ignore[no-any-return]


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
