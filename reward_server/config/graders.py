"""OpenAI's grader objects, as its reinforcement fine-tuning and graders API define them:
one pydantic class per ``type`` (``string_check``, ``text_similarity``, ``python``,
``score_model``, ``label_model``, ``multi``), told apart by ``type``, each with only its own
keys. A ``kind: grader`` entry of the models file holds one verbatim
(:mod:`reward_server.config.grader_entry`), and ``POST /v1/fine_tuning/alpha/graders/run``
and ``/validate`` take one in the request.

What is checked here, before any item is graded: every key and its type; every template
string's variables (``{{ item.x }}``, ``{{ sample.output_text }}``: a namespace other than
``item`` and ``sample``, or a path that does not parse, is an error naming the field); a
``multi`` grader's formula (:class:`Formula`: ``+ - * / ^``, parentheses, numbers, the names
of its graders and ``min max abs floor ceil exp sqrt log``; parsed with :mod:`ast`, never
``eval``); a ``python`` grader's source (at most 256 KiB, it compiles, it defines
``grade``); a ``score_model``'s range and a ``label_model``'s passing labels.

Plain data and rules: no model, no process, no HTTP.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Union, get_args

import pydantic
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictFloat,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from reward_server.errors import validation_problem

__all__ = [
    "FORMULA_FUNCTIONS",
    "GRADER_FLAGS",
    "GRADER_TYPES",
    "MAX_SOURCE_BYTES",
    "SIMILARITY_METRICS",
    "Formula",
    "FormulaError",
    "GraderFlag",
    "GraderObject",
    "LabelModelGrader",
    "LeafGrader",
    "ModelMessage",
    "MultiGrader",
    "PythonGrader",
    "SamplingParams",
    "ScoreModelGrader",
    "SimilarityMetric",
    "StringCheckGrader",
    "TextSimilarityGrader",
    "grader_problem",
    "parse_grader",
    "template_paths",
]

#: OpenAI's error flags that a grade here can raise (``metadata.errors`` of /graders/run):
#:
#: - ``invalid_variable_error``: a template reads a variable the item or sample lacks;
#: - ``sample_parse_error``: a template reads ``sample.output_json`` of a response that is
#:   not JSON;
#: - ``formula_parse_error``: a multi grader's formula cannot be computed (a division by
#:   zero, the log of 0: a formula that does not parse is refused before any item);
#: - ``python_grader_runtime_error``: ``grade`` raised, or returned no finite number;
#: - ``python_grader_server_error``: the sandbox failed, or the grader was cut at its time
#:   limit;
#: - ``model_grader_parse_error``: the grader model's answer is not the JSON asked for;
#: - ``model_grader_server_error``: the grader model could not be called (not served here,
#:   the remote failed);
#: - ``other_error``: anything else (a metric that cannot be computed).
GraderFlag = Literal[
    "invalid_variable_error",
    "sample_parse_error",
    "formula_parse_error",
    "python_grader_runtime_error",
    "python_grader_server_error",
    "model_grader_parse_error",
    "model_grader_server_error",
    "other_error",
]
GRADER_FLAGS: tuple[GraderFlag, ...] = get_args(GraderFlag)

GRADER_TYPES = ("string_check", "text_similarity", "python", "score_model", "label_model", "multi")
#: The metrics of a text_similarity grader.
SimilarityMetric = Literal[
    "fuzzy_match",
    "bleu",
    "gleu",
    "meteor",
    "cosine",
    "rouge_1",
    "rouge_2",
    "rouge_3",
    "rouge_4",
    "rouge_5",
    "rouge_l",
]
SIMILARITY_METRICS: tuple[str, ...] = get_args(SimilarityMetric)
#: The largest python grader source OpenAI takes (its limit: 256 kB).
MAX_SOURCE_BYTES = 256 * 1024

#: ``{{ path }}`` in a template string (spaces inside the braces optional).
_VARIABLE = re.compile(r"\{\{\s*(.*?)\s*\}\}")
#: One step of a variable's path: ``.name`` or ``[index]`` (an integer or a quoted key).
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_-]*)|\[\s*(-?\d+|'[^']*'|\"[^\"]*\")\s*\]")
_HEAD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: The namespaces a template may read.
NAMESPACES = ("item", "sample")


# -- template variables ------------------------------------------------------------------


def parse_path(text: str) -> tuple[str | int, ...]:
    """The steps of a variable's path (``item.a[0].b`` -> ``("item", "a", 0, "b")``);
    ValueError when it does not parse."""
    head = _HEAD.match(text)
    if head is None:
        raise ValueError(f"{{{{ {text} }}}} is not a variable (item.x or sample.x)")
    steps: list[str | int] = [head.group(0)]
    at = head.end()
    while at < len(text):
        step = _STEP.match(text, at)
        if step is None:
            raise ValueError(f"{{{{ {text} }}}}: cannot read the path from {text[at:]!r}")
        name, index = step.groups()
        if name is not None:
            steps.append(name)
        elif index[0] in "'\"":
            steps.append(index[1:-1])
        else:
            steps.append(int(index))
        at = step.end()
    return tuple(steps)


def template_paths(text: str) -> list[tuple[str | int, ...]]:
    """The variables of a template string, each as its path; ValueError naming the first
    that does not parse or reads a namespace other than ``item`` and ``sample``."""
    paths = []
    for match in _VARIABLE.finditer(text):
        path = parse_path(match.group(1))
        if path[0] not in NAMESPACES:
            raise ValueError(
                f"{{{{ {match.group(1)} }}}}: unknown namespace {path[0]!r} (item or sample)"
            )
        paths.append(path)
    return paths


def _template(value: str) -> str:
    template_paths(value)
    return value


# -- the safe formula ----------------------------------------------------------------------


class FormulaError(ValueError):
    """A ``calculate_output`` that does not parse, or names what is not there."""


#: The functions a formula may call, by name, with how many arguments (None: one or more).
FORMULA_FUNCTIONS: dict[str, tuple[Callable[..., float], int | None]] = {
    "min": (min, None),
    "max": (max, None),
    "abs": (abs, 1),
    "floor": (math.floor, 1),
    "ceil": (math.ceil, 1),
    "exp": (math.exp, 1),
    "sqrt": (math.sqrt, 1),
    "log": (math.log, 1),
}
_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.Pow: lambda a, b: a**b,
}
_MAX_FORMULA = 4096
#: The deepest a formula's tree may be (its evaluation recurses once per level).
_MAX_DEPTH = 64


def _depth(tree: ast.AST) -> int:
    """The depth of ``tree`` (iteratively: a long chain of + must not exhaust the stack)."""
    deepest, stack = 0, [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest


@dataclass(frozen=True)
class Formula:
    """A parsed ``calculate_output``: :meth:`parse` checks it once, :meth:`evaluate` reads
    its graders' scores by name. Only numbers, the names given, ``+ - * / ^`` (``**`` too),
    unary minus and plus, parentheses and :data:`FORMULA_FUNCTIONS` are accepted; anything
    else is a :class:`FormulaError` naming it."""

    text: str
    tree: ast.expr
    names: frozenset[str]

    @classmethod
    def parse(cls, text: str, names: frozenset[str] | set[str]) -> Formula:
        if len(text) > _MAX_FORMULA:
            raise FormulaError(f"longer than {_MAX_FORMULA} characters")
        # OpenAI's ^ is a power, with a power's precedence (2 * a ^ 2 is 2 * (a ^ 2)):
        # Python's ** has it (its ^ is xor, looser than +).
        try:
            tree = ast.parse(text.strip().replace("^", "**"), mode="eval").body
        except SyntaxError as exc:
            raise FormulaError(f"{text!r} does not parse: {exc.msg}") from None
        if _depth(tree) > _MAX_DEPTH:
            raise FormulaError(f"nested deeper than {_MAX_DEPTH} operations")
        used: set[str] = set()
        for node in ast.walk(tree):
            _check_node(node, names, used)
        return cls(text, tree, frozenset(used))

    def evaluate(self, scores: Mapping[str, float]) -> float:
        """The formula's value with each grader name bound to its score (ArithmeticError or
        ValueError for a value it cannot take: a division by zero, the log of 0)."""
        return float(_evaluate(self.tree, scores))


def _check_node(node: ast.AST, names: frozenset[str] | set[str], used: set[str]) -> None:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise FormulaError(f"{node.value!r} is not a number")
    elif isinstance(node, ast.Name):
        if node.id in FORMULA_FUNCTIONS and node.id not in names:
            return  # a function's name, checked at its call
        if node.id not in names:
            known = ", ".join(sorted(names)) or "none"
            raise FormulaError(f"unknown name {node.id!r} (the graders: {known})")
        used.add(node.id)
    elif isinstance(node, ast.BinOp):
        if type(node.op) not in _BINARY:
            raise FormulaError(f"operator {type(node.op).__name__} is not allowed (+ - * / ^)")
    elif isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, ast.USub | ast.UAdd):
            raise FormulaError(f"operator {type(node.op).__name__} is not allowed")
    elif isinstance(node, ast.Call):
        _check_call(node)
    elif not isinstance(node, ast.operator | ast.unaryop | ast.expr_context):
        raise FormulaError(f"{ast.unparse(node)!r} is not allowed in a formula")


def _check_call(node: ast.Call) -> None:
    if not isinstance(node.func, ast.Name) or node.func.id not in FORMULA_FUNCTIONS:
        called = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
        raise FormulaError(f"unknown function {called!r} ({', '.join(FORMULA_FUNCTIONS)})")
    if node.keywords:
        raise FormulaError(f"{node.func.id}() takes no keywords")
    arity = FORMULA_FUNCTIONS[node.func.id][1]
    count = len(node.args)
    if (arity is None and count < 1) or (arity is not None and count != arity):
        raise FormulaError(f"{node.func.id}() takes {arity or 'one or more'} arguments")


def _evaluate(node: ast.expr, scores: Mapping[str, float]) -> float:
    if isinstance(node, ast.Constant):
        return float(node.value)
    if isinstance(node, ast.Name):
        return float(scores[node.id])
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left, scores), _evaluate(node.right, scores)
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        value = _evaluate(node.operand, scores)
        return -value if isinstance(node.op, ast.USub) else value
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    function = FORMULA_FUNCTIONS[node.func.id][0]
    return float(function(*(_evaluate(arg, scores) for arg in node.args)))


# -- the grader objects --------------------------------------------------------------------


class _Grader(BaseModel):
    """What every grader object has."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
    #: Whether a model answers (score_model, label_model).
    MODEL: ClassVar[bool] = False

    type: str
    name: str = Field(min_length=1)
    """The grader's name (in a multi grader, the formula reads its graders by their keys)."""


class StringCheckGrader(_Grader):
    """``string_check``: 1 when the input and the reference compare as ``operation`` says
    (``eq`` equal, ``ne`` not equal, ``like`` the input contains the reference, ``ilike`` the
    same in any case), else 0."""

    type: Literal["string_check"]
    input: str
    """The text checked (a template string)."""
    reference: str
    """The text it is checked against (a template string)."""
    operation: Literal["eq", "ne", "like", "ilike"]
    """eq, ne, like (contains) or ilike (contains, any case)."""

    @field_validator("input", "reference")
    @classmethod
    def _templates(cls, value: str) -> str:
        return _template(value)


class TextSimilarityGrader(_Grader):
    """``text_similarity``: the ``evaluation_metric`` between the input and the reference,
    from 0 to 1 (:mod:`reward_server.verifiers.graders.similarity` says how each is computed)."""

    type: Literal["text_similarity"]
    input: str
    """The text graded (a template string)."""
    reference: str
    """The text it is graded against (a template string)."""
    evaluation_metric: SimilarityMetric
    """fuzzy_match, bleu, gleu, meteor, cosine, rouge_1 .. rouge_5 or rouge_l."""
    pass_threshold: StrictFloat | None = None
    """The score at or above which the item passes (OpenAI's evals; reported, the reward is the score)."""

    @field_validator("input", "reference")
    @classmethod
    def _templates(cls, value: str) -> str:
        return _template(value)


class PythonGrader(_Grader):
    """``python``: ``grade(sample, item) -> float`` of the ``source``, run in a sandbox."""

    type: Literal["python"]
    source: str
    """The Python source defining grade(sample, item) (at most 256 KiB)."""
    image_tag: str | None = None
    """OpenAI's image of the grader; accepted and ignored (one image here: see the graders guide)."""

    @field_validator("source")
    @classmethod
    def _defines_grade(cls, value: str) -> str:
        if len(value.encode("utf-8")) > MAX_SOURCE_BYTES:
            raise ValueError(f"longer than {MAX_SOURCE_BYTES // 1024} KiB")
        try:
            tree = ast.parse(value)
        except SyntaxError as exc:
            raise ValueError(f"does not compile: line {exc.lineno}: {exc.msg}") from None
        defined = {
            node.name
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        if "grade" not in defined:
            raise ValueError("defines no function grade(sample, item)")
        return value


class SamplingParams(BaseModel):
    """How the grader model samples its answer."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    temperature: StrictFloat | None = Field(default=None, ge=0, le=2)
    """Sampling temperature (0: greedy)."""
    top_p: StrictFloat | None = Field(default=None, gt=0, le=1)
    """Nucleus sampling."""
    seed: StrictInt | None = None
    """The seed of the sampling."""
    max_completions_tokens: StrictInt | None = Field(default=None, ge=1)
    """Most tokens of the answer."""
    reasoning_effort: str | None = None
    """OpenAI's reasoning models' effort; passed to a remote endpoint, ignored by a served judge."""


class ModelMessage(BaseModel):
    """One input message of a model grader: a role and content (a template string, or a list
    of parts whose text is templated)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[dict[str, Any]]
    type: Literal["message"] | None = None

    @field_validator("content")
    @classmethod
    def _text_parts(cls, value: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        if isinstance(value, str):
            return _template(value)
        for part in value:
            kind = part.get("type")
            if kind not in ("input_text", "output_text", "text"):
                raise ValueError(f"content part of type {kind!r}: only text parts are served here")
            text = part.get("text")
            if not isinstance(text, str):
                raise ValueError(f"a {kind} part needs 'text' (a string)")
            _template(text)
        return value


class _ModelGrader(_Grader):
    MODEL: ClassVar[bool] = True

    model: str = Field(min_length=1)
    """The grader model: a kind: judge (mode: generate) or kind: remote (protocol: openai-chat) entry of the models file, by name or through the entry's models map."""
    input: list[ModelMessage] = Field(min_length=1)
    """The messages the model reads (templated)."""


class ScoreModelGrader(_ModelGrader):
    """``score_model``: the model answers ``{"result": float, "steps": [...]}``; the result,
    clipped to ``range``, is the score."""

    type: Literal["score_model"]
    range: tuple[StrictFloat, StrictFloat] = (0.0, 1.0)
    """The lowest and the highest score (default [0, 1]); results outside are clipped."""
    sampling_params: SamplingParams | None = None
    """How the model samples (temperature, top_p, seed, max_completions_tokens)."""
    pass_threshold: StrictFloat | None = None
    """The score at or above which the item passes (reported; the reward is the score)."""

    @field_validator("range")
    @classmethod
    def _ordered(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(math.isfinite(v) for v in value) or not value[0] < value[1]:
            raise ValueError(f"two finite numbers, the first below the second, not {value}")
        return value


class LabelModelGrader(_ModelGrader):
    """``label_model``: the model answers one of ``labels``; 1 when it is one of
    ``passing_labels``, else 0."""

    type: Literal["label_model"]
    labels: list[str] = Field(min_length=1)
    """The labels the model chooses from."""
    passing_labels: list[str] = Field(min_length=1)
    """The labels that pass (a subset of labels)."""

    @model_validator(mode="after")
    def _subset(self) -> LabelModelGrader:
        unknown = [label for label in self.passing_labels if label not in self.labels]
        if unknown:
            raise ValueError(f"passing_labels {unknown} are not in labels")
        return self


def _type_tag(value: Any, known: tuple[str, ...]) -> str | None:
    """The union's tag of a grader object by its ``type`` (None: not one of ``known``)."""
    found = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return f"<type: {found}>" if found in known else None


def _tagged_union(classes: tuple[type[_Grader], ...], message: str) -> Any:
    """The union of ``classes`` told apart by ``type`` (``message`` when it is none of them)."""
    types = tuple(str(get_args(cls.model_fields["type"].annotation)[0]) for cls in classes)
    members = tuple(
        Annotated[cls, pydantic.Tag(f"<type: {t}>")] for cls, t in zip(classes, types, strict=True)
    )
    return Annotated[
        Union[members],  # noqa: UP007
        pydantic.Discriminator(
            lambda v: _type_tag(v, types),
            custom_error_type="grader_type",
            custom_error_message=message,
        ),
    ]


_LEAVES = (
    StringCheckGrader,
    TextSimilarityGrader,
    PythonGrader,
    ScoreModelGrader,
    LabelModelGrader,
)
#: A grader a multi grader may hold: any but multi.
LeafGrader = _tagged_union(
    _LEAVES, "type: string_check, text_similarity, python, score_model or label_model"
)


class MultiGrader(_Grader):
    """``multi``: several graders by name, their scores combined by ``calculate_output``."""

    type: Literal["multi"]
    graders: dict[str, LeafGrader] = Field(min_length=1)
    """The graders, by the names the formula reads (letters, digits and _)."""
    calculate_output: str = Field(min_length=1)
    """The formula: + - * / ^, parentheses, numbers, the graders' names, min max abs floor ceil exp sqrt log."""

    @field_validator("graders")
    @classmethod
    def _names(cls, value: dict[str, Any]) -> dict[str, Any]:
        bad = [name for name in value if not name.isidentifier()]
        if bad:
            raise ValueError(f"grader names must be identifiers (letters, digits, _): {bad}")
        return value

    @model_validator(mode="after")
    def _formula(self) -> MultiGrader:
        try:
            Formula.parse(self.calculate_output, set(self.graders))
        except FormulaError as exc:
            raise ValueError(f"calculate_output: {exc}") from None
        return self

    @property
    def formula(self) -> Formula:
        """The parsed ``calculate_output``."""
        return Formula.parse(self.calculate_output, set(self.graders))


#: Any grader object.
GraderObject = _tagged_union((*_LEAVES, MultiGrader), f"type: {', '.join(GRADER_TYPES)}")
_GRADER: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(GraderObject)


def grader_problem(exc: ValidationError, where: str = "grader") -> str:
    """One line naming every problem of a grader object, each at its field
    (``grader.graders.a.operation: ...``)."""
    problems = []
    for err in exc.errors():
        problem = validation_problem(err)
        if problem.startswith("top level"):
            problems.append(where + problem.removeprefix("top level"))
        else:
            problems.append(f"{where}.{problem}")
    return "; ".join(problems)


def parse_grader(data: Any) -> GraderObject:
    """A grader object as its class; ValidationError when it is not valid."""
    return _GRADER.validate_python(data)  # type: ignore[no-any-return]
