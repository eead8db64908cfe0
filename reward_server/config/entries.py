"""One entry of the models file, one class per kind: what every entry has (:class:`Entry`),
what every entry that loads a model has (:class:`LoadedEntry`), and the model kinds: reward
models (:class:`SequenceEntry`), process reward models (:class:`ProcessEntry`) and judges,
one class per mode (:class:`LogprobsJudge`, :class:`GenerateJudge`, :class:`PairwiseJudge`,
:class:`RubricJudge`).
Verifiers are in :mod:`reward_server.config.verifier_entries`, remote components in
:mod:`reward_server.config.remote_entry`; :mod:`reward_server.config.models_file` joins them
in one union told apart by ``kind`` (and a verifier's ``verifier``, a judge's ``mode``).

Each class has only its own keys, and a key means one thing in every class that has it. A key
of another kind is an error saying which kinds take it (:func:`foreign_keys`); a key that was
renamed is an error naming the new one (each class's ``RENAMED``).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from reward_server.config.load_options import LoadOptions
from reward_server.errors import validation_problem

__all__ = [
    "DEFAULT_CATEGORIES",
    "REASONING_TAGS",
    "Entry",
    "GenerateJudge",
    "JudgeEntry",
    "LoadedEntry",
    "LogprobsJudge",
    "Normalize",
    "PairwiseJudge",
    "ProcessEntry",
    "ReasoningMode",
    "RubricJudge",
    "SequenceEntry",
    "pattern_groups",
]

#: How an entry treats a reasoning policy's thinking: removed before scoring, or kept.
ReasoningMode = Literal["strip", "keep"]
#: The tags of a thinking block unless an entry names others.
REASONING_TAGS = ("<think>", "</think>")
#: A rubric judge's category weights unless its entry sets its own (Scale's "Rubrics as
#: Rewards": Essential, Important, Optional, and Pitfalls, whose weight subtracts).
DEFAULT_CATEGORIES: dict[str, float] = {
    "essential": 1.0,
    "important": 0.7,
    "optional": 0.3,
    "pitfall": -0.9,
}
#: Keys that default to the server's flag of the same name (an entry that loads a model).
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


def pattern_groups(pattern: str) -> int:
    """How many groups the regular expression ``pattern`` has (ValueError if it is none)."""
    try:
        return re.compile(pattern).groups
    except re.error as exc:
        raise ValueError(f"score_pattern is not a regular expression: {exc}") from None


def one_group(pattern: str | None) -> str | None:
    """``pattern`` unless it has other than exactly one group (the score)."""
    if pattern is not None and (groups := pattern_groups(pattern)) != 1:
        raise ValueError(f"score_pattern needs exactly one group (the score), not {groups}")
    return pattern


def finite(value: Any, what: str) -> Any:
    """``value`` unless it is a number that is not finite."""
    if isinstance(value, float | int) and not isinstance(value, bool) and not math.isfinite(value):
        raise ValueError(f"{what} must be a finite number")
    return value


def numbers_by_name(what: str, field: str, least: int) -> Any:
    """The type of a ``field`` holding at least ``least`` numbers by name (``what`` in its
    errors): every number finite, no empty name."""

    def check(value: dict[str, float]) -> dict[str, float]:
        bad = [k for k, w in value.items() if not math.isfinite(w)]
        if bad:
            raise ValueError(f"{what} must be finite numbers ({', '.join(bad)})")
        if "" in value:
            raise ValueError(f"{field}: an empty name")
        return value

    return Annotated[dict[str, float], Field(min_length=least), AfterValidator(check)]


#: A reward model's weights by label name.
Objectives = numbers_by_name("objective weights", "objectives", 1)
#: A judge's score tokens and their values.
ScoreTokens = numbers_by_name("score token values", "score_tokens", 2)
#: A rubric judge's weight of each category.
CategoryWeights = numbers_by_name("category weights", "categories", 0)


def two_tags(value: tuple[str, str] | None, what: str) -> tuple[str, str] | None:
    """``value`` unless its two tags are empty or the same."""
    if value is not None and (not value[0] or not value[1] or value[0] == value[1]):
        raise ValueError(f"{what}: two different, non-empty tags")
    return value


class Normalize(BaseModel):
    """``(score - mean) / std``, applied to a model's score before its weight."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    mean: float = 0.0
    """Subtracted from the model's score before its weight."""
    std: float = Field(default=1.0, gt=0)
    """The score minus mean is divided by it."""


class Entry(BaseModel):
    """What every entry has: its name, its weight and normalisation, and how it treats a
    reasoning policy's thinking."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    #: The entry's kind (each class fixes its own).
    kind: str
    #: Keys of this class that replace old ones: {old: (new, what the new one means)}.
    RENAMED: ClassVar[dict[str, tuple[str, str]]] = {}
    #: Whether the thinking is kept by default (``reasoning`` unset).
    KEEPS_REASONING: ClassVar[bool] = False
    #: The discriminating keys and values that select this class (error messages).
    SELECTOR: ClassVar[str] = ""
    #: Keys a class needs, {key: the error when it is missing} (each defaults to null, so
    #: that its absence is said in the kind's own words).
    NEEDS: ClassVar[dict[str, str]] = {}
    #: Which of the keys given to a class belong to another kind, said (None: none). Set by
    #: :mod:`reward_server.config.models_file`, which knows every kind; until then only
    #: pydantic's "unknown key".
    key_check: ClassVar[Callable[[type[Entry], list[str]], str | None] | None] = None

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    """The model's name in answers, /info and /metrics; unique; letters, digits, _, . and -."""
    weight: float = 1.0
    """The model's weight in the aggregate."""
    normalize: Normalize | Literal["group", "group_rank"] | None = None
    """{mean, std}: the score becomes (score - mean) / std before the weight; group: (score - the group's mean) / the group's standard deviation, over the request's groups (0 where the group's scores are all equal); group_rank: the score's rank in its group, scaled to [-0.5, 0.5]. A request to a model normalising by group must send groups."""
    reasoning: ReasoningMode | None = None
    """strip (remove a reasoning policy's thinking, the blocks between reasoning_tags and reasoning_content, before scoring: the default, except for kind: process and verifier: format) or keep (score it as sent)."""
    reasoning_tags: tuple[str, str] = REASONING_TAGS
    """The opening and the closing tag of a thinking block."""
    unclosed_reasoning: float | Literal["mask"] = "mask"
    """With reasoning: strip, what an item whose response opens a thinking block and never closes it (the policy ran out of tokens) gets: mask (the default: null in scores, reason unclosed_reasoning) or a number, its score."""

    @model_validator(mode="before")
    @classmethod
    def _own_keys(cls, data: Any) -> Any:
        """A renamed key or a key of another kind, named with where it belongs."""
        if not isinstance(data, dict):
            return data
        for old, (new, meaning) in cls.RENAMED.items():
            if old in data:
                raise ValueError(f"{old!r} is now {new!r} ({meaning})")
        check = Entry.key_check
        problem = None if check is None else check(cls, list(data))
        if problem:
            raise ValueError(problem)
        return data

    @model_validator(mode="after")
    def _has_needed(self) -> Entry:
        for key, problem in self.NEEDS.items():
            if getattr(self, key) is None:
                raise ValueError(problem)
        return self

    @field_validator("weight", "unclosed_reasoning")
    @classmethod
    def _finite(cls, value: Any, info: ValidationInfo) -> Any:
        return finite(value, str(info.field_name))

    @field_validator("reasoning_tags")
    @classmethod
    def _tags(cls, value: tuple[str, str]) -> tuple[str, str] | None:
        return two_tags(value, "reasoning_tags")

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

    @property
    def reasoning_mode(self) -> ReasoningMode:
        """``reasoning`` as given, else the kind's default: keep for a process model (its
        steps are the thinking) and a format verifier (it checks the thinking's shape), strip
        for the others."""
        if self.reasoning is not None:
            return self.reasoning
        return "keep" if self.KEEPS_REASONING else "strip"

    @property
    def on_failure(self) -> float | Literal["mask"]:
        """What an item this entry failed on gets: its ``on_error`` where it has one, else
        mask (a model's failure is the request's, but a deadline masks any item)."""
        return getattr(self, "on_error", "mask")  # type: ignore[no-any-return]

    @property
    def masks(self) -> bool:
        """Whether an item this entry failed on is masked (``on_error: mask``)."""
        return self.on_failure == "mask"

    @property
    def error_score(self) -> float:
        """The score a failed item carries: ``on_error`` as a number, 0.0 when it is masked
        (then only seen in ``components`` of a weight-0 model, never in a trainer's reward)."""
        failure = self.on_failure
        return 0.0 if isinstance(failure, str) else float(failure)

    @property
    def scores_in_groups(self) -> bool:
        """Whether requests must send groups (normalised within them, or a pairwise judge)."""
        return isinstance(self.normalize, str)

    def shown(self) -> dict[str, Any]:
        """The entry's keys for GET /info (the key files and secrets of the server's machine
        left out by the classes that have them)."""
        return self.model_dump(
            exclude={"name", "kind", "reasoning_tags", "unclosed_reasoning"}, exclude_none=True
        )


class LoadedEntry(Entry):
    """An entry that loads a model: where it is and how to load and render it (each key
    defaults to the server's flag of the same name)."""

    model: str = Field(min_length=1)
    """A folder or a hub id, as --model."""
    device: str | None = Field(default=None, pattern=r"^(auto|cpu|mps|cuda(:\d+)?)$")
    """As --device (default: the server's flag)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = None
    """As --dtype (default: the server's flag)."""
    max_length: int | None = Field(default=None, gt=0)
    """As --max-length (default: the server's flag, else the model's limit)."""
    truncation_side: Literal["left", "right"] | None = None
    """As --truncation-side (default: the server's flag)."""
    chat_template: str | None = Field(default=None, min_length=1)
    """As --chat-template (default: the server's flag)."""
    trust_remote_code: bool | None = None
    """As --trust-remote-code (default: the server's flag)."""
    tool_rendering: Literal["template", "text"] | None = None
    """As --tool-rendering: template (tool calls, tool results and tools reach the chat template; a template that does not show them makes such a request a 422) or text (what the template does not show is written into the messages as plain text: <tool_call> and <tool_response> blocks, the tools in front of the system message; see the agents guide)."""

    def load_options(self, server: LoadOptions) -> LoadOptions:
        """The server's load options with this entry's model and own keys over them."""
        own = {
            key: getattr(self, key)
            for key in INHERITED_KEYS
            if getattr(self, key, None) is not None
        }
        return dataclasses.replace(
            server,
            model=self.model,
            adapter=getattr(self, "adapter", None),
            merge_adapter=getattr(self, "merge_adapter", False),
            reasoning_tags=self.reasoning_tags,
            **own,
        )


class _Adapted(LoadedEntry):
    """A classifier that may carry a PEFT adapter and reads one label of its head."""

    adapter: str | None = Field(default=None, min_length=1)
    """A PEFT adapter on top of model, as --adapter."""
    merge_adapter: bool = False
    """Merge the adapter into the base weights at load time, as --merge-adapter."""
    label_index: int | None = Field(default=None, ge=0)
    """Which logit is the model's score (default: --label-index)."""


class SequenceEntry(_Adapted):
    """``kind: sequence`` (the default): a sequence-classification reward model."""

    kind: Literal["sequence"] = "sequence"
    SELECTOR: ClassVar[str] = "kind: sequence"

    objectives: Objectives | None = None
    """Weights by label name (the config's id2label): the score is the sum of weight x raw logit; not with label_index."""

    def load_options(self, server: LoadOptions) -> LoadOptions:
        """As :meth:`LoadedEntry.load_options`; with objectives every label is read."""
        options = super().load_options(server)
        if self.objectives is not None:  # the scorer's own label must exist: the first
            options = dataclasses.replace(options, label_index=0)
        return options

    @model_validator(mode="after")
    def _label_or_objectives(self) -> SequenceEntry:
        if self.objectives is not None and self.label_index is not None:
            raise ValueError("give label_index or objectives, not both")
        return self


class ProcessEntry(_Adapted):
    """``kind: process``: a process reward model, a score per step of a response (at most one
    per file)."""

    kind: Literal["process"] = "process"
    SELECTOR: ClassVar[str] = "kind: process"
    KEEPS_REASONING: ClassVar[bool] = True

    step_separator: str = Field(default="\n\n", min_length=1)
    """What splits a response into steps."""
    step_tag: str | None = Field(default=None, min_length=1)
    """The token read after each step (replaces the separators); one token of the model's tokenizer."""
    step_aggregate: Literal["min", "mean", "last", "prod"] = "min"
    """How the step scores make the model's score."""


class JudgeEntry(LoadedEntry):
    """``kind: judge``: a causal LM that reads a Jinja template per item and answers."""

    kind: Literal["judge"] = "judge"
    NEEDS: ClassVar[dict[str, str]] = {
        "template": "kind: judge needs 'template' (Jinja text or a .jinja file)"
    }

    template: str | None = Field(default=None, min_length=1)
    """The Jinja prompt (prompt, response, label, messages, tool_calls, tools; a pairwise judge: response_a and response_b) or a path to a .jinja file."""


class LogprobsJudge(JudgeEntry):
    """``kind: judge``, ``mode: logprobs`` (the default): the expected value over the score
    tokens' next-token probabilities, one forward pass."""

    mode: Literal["logprobs"] = "logprobs"
    SELECTOR: ClassVar[str] = "mode: logprobs"
    NEEDS: ClassVar[dict[str, str]] = {
        **JudgeEntry.NEEDS,
        "score_tokens": 'kind: judge needs \'score_tokens\' (e.g. {"Yes": 1.0, "No": 0.0})',
    }

    score_tokens: ScoreTokens | None = None
    """The value of each score token (each one token of the judge's tokenizer)."""


class _Fallible(Entry):
    """An entry whose item can fail without failing the request."""

    on_error: float | Literal["mask"] = "mask"
    """What an item whose verification, parse or call failed gets: mask (the default: null in scores, with its reason; a trainer leaves it out) or a number, its score."""

    @field_validator("on_error")
    @classmethod
    def _finite_on_error(cls, value: Any) -> Any:
        return finite(value, "on_error")


class GenerateJudge(JudgeEntry, _Fallible):
    """``kind: judge``, ``mode: generate``: the judge writes an answer and the score is the
    number its pattern finds there (on_error where it finds none)."""

    mode: Literal["generate"]
    SELECTOR: ClassVar[str] = "mode: generate"

    score_pattern: str | None = Field(default=None, min_length=1)
    """A regular expression with one group, the score."""
    max_new_tokens: int = Field(default=32, ge=1, le=4096)
    """Most new tokens of the answer."""
    temperature: float = Field(default=0.0, ge=0)
    """Sampling temperature (0: greedy)."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """Nucleus sampling when temperature is above 0."""

    @model_validator(mode="after")
    def _has_pattern(self) -> GenerateJudge:
        if self.score_pattern is None:
            raise ValueError("mode: generate needs 'score_pattern' (e.g. 'Score: (\\d+)')")
        try:
            one_group(self.score_pattern)
        except ValueError as exc:
            raise ValueError(f"score_pattern {self.score_pattern!r}: {exc}") from None
        if self.top_p is not None and self.temperature == 0:
            raise ValueError("top_p samples: give a temperature above 0 too (0: greedy)")
        return self


class PairwiseJudge(JudgeEntry, _Fallible):
    """``kind: judge``, ``mode: pairwise``: the responses of a request's group compared two at
    a time (requests must send groups)."""

    mode: Literal["pairwise"]
    SELECTOR: ClassVar[str] = "mode: pairwise"
    RENAMED: ClassVar[dict[str, tuple[str, str]]] = {
        "aggregate": ("pairwise_aggregate", "how the comparisons make a score")
    }

    answer_tokens: list[str] | None = Field(default=None, min_length=2, max_length=2)
    """Two answers, each one token: the first says the first response shown (response_a) is the better, the second that response_b is."""
    pairs: Literal["all"] | StrictInt = "all"
    """all (every pair of a group) or k >= 1 (each response against about k others: the ring pairs i, i + d for d = 1 .. ceil(k / 2))."""
    pairwise_aggregate: Literal["win_rate", "bradley_terry"] = "win_rate"
    """How the comparisons make each response's score: win_rate (the mean probability of beating each opponent) or bradley_terry (the strengths of a Bradley-Terry fit)."""

    @model_validator(mode="after")
    def _has_answers(self) -> PairwiseJudge:
        if self.answer_tokens is None:
            raise ValueError('mode: pairwise needs \'answer_tokens\' (e.g. ["A", "B"])')
        if self.answer_tokens[0] == self.answer_tokens[1] or "" in self.answer_tokens:
            raise ValueError("answer_tokens: two different, non-empty answers")
        if self.pairs != "all" and self.pairs < 1:
            raise ValueError(f"pairs: all or an integer k >= 1, not {self.pairs!r}")
        return self

    @property
    def scores_in_groups(self) -> bool:
        """A pairwise judge compares the responses of a group: requests must send groups."""
        return True


class RubricJudge(JudgeEntry, _Fallible):
    """``kind: judge``, ``mode: rubric``: each item's label carries its rubric, a list of
    criteria; explicit aggregation judges each criterion in a row of its own and weighs the
    verdicts, implicit aggregation asks for one rating that sees the whole rubric
    (:mod:`reward_server.scoring.rubric` states the formulas)."""

    mode: Literal["rubric"]
    SELECTOR: ClassVar[str] = "mode: rubric"

    aggregation: Literal["explicit", "implicit"] = "explicit"
    """explicit (one row per criterion, the weighted verdicts over the sum of the positive weights, pitfalls subtracting; the template reads criterion) or implicit (one generated rating per item from a template that reads the whole rubric, normalised with rating_range)."""
    verdict: Literal["logprobs", "generate"] = "logprobs"
    """Explicit aggregation: how a criterion's row is judged: logprobs (the probability of the first verdict token, renormalised over the two, one forward pass) or generate (an answer whose verdict_pattern match is the first or the second verdict token)."""
    verdict_tokens: tuple[str, str] = ("Yes", "No")
    """The two answers, yes first (the criterion holds) then no; with verdict: logprobs each must be one token of the judge's tokenizer."""
    verdict_pattern: str | None = None
    """verdict: generate: a regular expression with one group holding the verdict (matched against verdict_tokens, case ignored); default: the first of the two verdict tokens found as a word."""
    verdict_threshold: float = Field(default=0.5, gt=0, le=1)
    """A criterion is met when its probability of yes is at least this; a required criterion that fails (not met, or a pitfall met) gives the rubric's minimum score, and /metrics counts the items failing each category by it."""
    categories: CategoryWeights = Field(default_factory=lambda: dict(DEFAULT_CATEGORIES))
    """The weight of each category a criterion may name instead of its own weight (negative: a pitfall); default essential 1.0, important 0.7, optional 0.3, pitfall -0.9."""
    score_pattern: str | None = Field(default=None, min_length=1)
    """aggregation: implicit: a regular expression with one group, the rating (default: the first number in the answer)."""
    rating_range: tuple[float, float] = (1.0, 10.0)
    """aggregation: implicit: the lowest and the highest rating; a rating x scores (x - low) / (high - low), one outside is masked (out_of_range)."""
    max_new_tokens: int = Field(default=32, ge=1, le=4096)
    """Most new tokens of a generated verdict or rating."""
    temperature: float = Field(default=0.0, ge=0)
    """Sampling temperature of generated answers (0: greedy)."""
    top_p: float | None = Field(default=None, gt=0, le=1)
    """Nucleus sampling when temperature is above 0."""

    @property
    def generates(self) -> bool:
        """Whether the judge writes answers (implicit, or verdict: generate)."""
        return self.aggregation == "implicit" or self.verdict == "generate"

    @property
    def rating_pattern(self) -> str:
        """The implicit rating's pattern: score_pattern, else the first number."""
        return self.score_pattern or r"(-?\d+(?:\.\d+)?)"

    @property
    def verdict_regex(self) -> str:
        """The generated verdict's pattern: verdict_pattern, else either verdict token as a
        word (case ignored)."""
        if self.verdict_pattern is not None:
            return self.verdict_pattern
        words = "|".join(re.escape(t.strip()) for t in self.verdict_tokens)
        return rf"(?i)(?<!\w)({words})(?!\w)"

    @model_validator(mode="after")
    def _consistent(self) -> RubricJudge:
        first, second = self.verdict_tokens
        if not first.strip() or not second.strip() or first.strip() == second.strip():
            raise ValueError("verdict_tokens: two different, non-empty answers (yes, then no)")
        for key in ("verdict_pattern", "score_pattern"):
            pattern = getattr(self, key)
            try:
                one_group(pattern)
            except ValueError as exc:
                raise ValueError(
                    f"{key} {pattern!r}: {str(exc).replace('score_pattern', key)}"
                ) from None
        if self.aggregation == "implicit" and self.verdict_pattern is not None:
            raise ValueError(
                "verdict_pattern is for aggregation: explicit (implicit reads score_pattern)"
            )
        if self.aggregation == "explicit" and self.score_pattern is not None:
            raise ValueError("score_pattern is for aggregation: implicit (explicit reads verdicts)")
        if self.verdict == "logprobs" and self.verdict_pattern is not None:
            raise ValueError("verdict_pattern is for verdict: generate")
        low, high = self.rating_range
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(
                f"rating_range: two finite numbers, low < high, not {list(self.rating_range)}"
            )
        if self.top_p is not None and self.temperature == 0:
            raise ValueError("top_p samples: give a temperature above 0 too (0: greedy)")
        return self
