"""The ``tool_call`` verifier: a response's tool calls against the calls its label expects.

Pure logic (no I/O): the verifier worker processes call :func:`score_tool_calls`.

**The response's calls** are the message's OpenAI ``tool_calls`` (each ``{"id"?, "type":
"function", "function": {"name", "arguments"}}``, arguments a JSON string or an object); a
message without any (None or an empty list) has its calls parsed from its text instead, in
the ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` form (several blocks are
parallel calls; a block may also hold a JSON list of calls; ``parameters`` is read as
``arguments``; the tags are :attr:`ToolCallOptions.tags`, None to never parse the text).

**The label** holds the expected calls, in either form:

- the Berkeley Function Calling Leaderboard's possible answers: a list of ``{function:
  {parameter: [allowed values...]}}``, or a dict holding that list as ``ground_truth``
  (BFCL's own files); ``""`` among a parameter's allowed values makes it optional;
- plain calls ``[{"name": ..., "arguments": {...}}]`` (or OpenAI ``tool_calls``): each
  value is the one allowed value, and every parameter is required;
- ``[]``: no call expected (BFCL's irrelevance category).

A single call's object stands for a list of one, and a JSON string holding any of these is
read as what it holds. An unusable label raises ValueError.

**The rules** are those of BFCL's AST checker (``bfcl_eval/eval_checker/ast_eval/
ast_checker.py``), for calls whose arguments are JSON:

- the number of calls equals the number expected, and the calls match the expected ones in
  any order (a maximum matching: one response call per expected call);
- a call matches when it names the expected function (``a.b`` is also matched by ``a_b``,
  the name OpenAI-style APIs require, as BFCL allows for such models), every parameter the
  tool requires is present, every parameter it passes is both in the tool's ``properties``
  and in the label, each value has the tool's type (an integer passes for ``number``; a
  value of another type passes when the label's allowed values have its type, BFCL's rule
  for variables), each value is one of the allowed ones, and every parameter of the label
  that is not optional is present;
- strings compare after BFCL's normalisation: spaces and ``,./-_*^`` removed, lower case,
  ``'`` read as ``"`` (``"April 1, 2024"`` equals ``"april 1 2024"``); an object parameter
  matches an allowed object whose keys map to lists of allowed values (keys the value
  lacks must allow ``""``); a list of objects matches an allowed list of such objects in
  order; other lists and nested values compare element by element.

With ``tools`` given and :attr:`ToolCallOptions.check_schema`, a call that passes those
rules must also validate against its tool's JSON schema (``jsonschema``): ``enum``,
``minimum``, ``pattern``, ``additionalProperties`` and the rest. Tools may be OpenAI specs
(``{"type": "function", "function": {...}}``) or BFCL's function docs, whose types
(``dict``, ``float``, ``tuple``, ``any``) are read as JSON Schema's.

**Where this differs from BFCL** (each case is in ``tests/tool_call_cases.py``'s
``DIVERGENCES`` and checked against BFCL itself): parallel calls are matched by a maximum
matching, where BFCL gives each expected call the first response call that fits and can
then miss a matching that exists; strings inside nested lists and objects are normalised
too (BFCL normalises one level only); an integer passes for a ``number`` item of an array
(BFCL only accepts it for a ``number`` parameter).

**Score and reason.** ``credit="all"``: 1.0 when every rule holds, else 0.0.
``credit="partial"``: ``matched / max(expected, made)``, where ``matched`` is the largest
number of expected calls paired with distinct response calls that match them, ``expected``
and ``made`` the numbers of calls (so a missing and a surplus call both cost their share;
a call that cannot be read matches nothing); 1.0 when neither side has a call. The reason
is None at full marks, else the first failure, one of :data:`REASONS`: the response's
unreadable calls first, then the count, then the first expected call left unmatched (its
failure against the first unmatched call naming its function, else ``wrong_function``).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["REASONS", "Expected", "ToolCallOptions", "expected_calls", "score_tool_calls"]

#: Why a response scores below full marks, in the order they are looked for.
REASONS = (
    "invalid_json",  # a call's arguments, or a text block, are not valid JSON
    "malformed_call",  # JSON, but not a call (no name, arguments not an object), or a text
    #                    block whose closing tag is missing
    "unexpected_call",  # calls where the label expects none
    "no_call",  # no call where the label expects some
    "wrong_count",  # another number of calls than expected
    "wrong_function",  # a call names another function
    "missing_argument",  # a required or non-optional parameter is absent
    "unexpected_argument",  # a parameter neither the tool nor the label has
    "wrong_type",  # a value of another type than the tool's
    "wrong_value",  # a value none of the allowed ones
    "schema_violation",  # arguments the tool's JSON schema rejects
)

Credit = Literal["all", "partial"]


@dataclass(frozen=True, slots=True)
class ToolCallOptions:
    """How a ``tool_call`` verifier scores (plain picklable data for the worker processes).

    ``credit``: ``"all"`` (1.0 or 0.0) or ``"partial"`` (the share of calls matched, see the
    module's docstring). ``tags``: the opening and closing tags around a call in the text
    of a message without ``tool_calls``; None never reads calls from the text.
    ``check_schema``: validate the arguments against the tool's JSON schema when the item
    has ``tools``.
    """

    credit: Credit = "all"
    tags: tuple[str, str] | None = ("<tool_call>", "</tool_call>")
    check_schema: bool = True

    def __post_init__(self) -> None:
        if self.credit not in ("all", "partial"):
            raise ValueError(f"credit must be 'all' or 'partial', not {self.credit!r}")
        if self.tags is not None and (
            len(self.tags) != 2 or not all(isinstance(t, str) and t for t in self.tags)
        ):
            raise ValueError(f"tags must be two non-empty strings or None, not {self.tags!r}")


@dataclass(frozen=True, slots=True)
class Expected:
    """One expected call: the function's name and each parameter's allowed values."""

    name: str
    params: dict[str, list[Any]]


@dataclass(frozen=True, slots=True)
class _Call:
    """One call of the response; ``problem`` (a reason) when it could not be read."""

    name: str = ""
    arguments: dict[str, Any] | None = None
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class _Tool:
    """A tool's parameters: ``properties`` None when its schema does not list them."""

    properties: dict[str, Any] | None
    required: tuple[str, ...]
    schema_json: str  # the JSON schema as text: the key of its cached validator


def score_tool_calls(
    calls: Sequence[Any] | None,
    text: str | None,
    label: Any,
    tools: Sequence[Any] | None,
    options: ToolCallOptions | None = None,
) -> tuple[float, str | None]:
    """(score, reason) of a response's tool calls against the calls ``label`` expects.

    ``calls``: the message's ``tool_calls`` as given, or None (then read from ``text``);
    ``tools``: the item's function specs or None. Raises ValueError for an unusable label
    or tool list.
    """
    options = options or ToolCallOptions()
    expected = expected_calls(label)
    specs = _tool_index(tools, options.check_schema)
    made = _response_calls(calls, text, options.tags)
    fits = [[_verdict(e, c, specs, options.check_schema) for c in made] for e in expected]
    match = _max_matching([[v is None for v in row] for row in fits])
    reason = _first_reason(made, fits, match)
    if options.credit == "all":
        return (1.0 if reason is None else 0.0), reason
    if not expected and not made:
        return 1.0, None
    matched = sum(j is not None for j in match)
    return matched / max(len(expected), len(made)), reason


# --- the label -----------------------------------------------------------------------------


def expected_calls(label: Any) -> list[Expected]:
    """The calls ``label`` expects (either form of the module's docstring); ValueError if none."""
    if isinstance(label, str):
        label = _json(label, "the label")
    if isinstance(label, dict) and "ground_truth" in label:
        label = label["ground_truth"]
        if isinstance(label, str):
            label = _json(label, "the label's ground_truth")
    if isinstance(label, dict):
        label = [label]
    if not isinstance(label, list):
        raise ValueError(
            "a tool_call label is a list of expected calls (or a dict with 'ground_truth'), "
            f"not {type(label).__name__}"
        )
    return [_expected(entry, i) for i, entry in enumerate(label)]


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what} is not valid JSON: {exc}") from exc


def _expected(entry: Any, index: int) -> Expected:
    where = f"the label's call {index}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where} is {type(entry).__name__}, not an object")
    if isinstance(entry.get("function"), dict) and "name" in entry["function"]:
        entry = entry["function"]  # an OpenAI tool call
    if isinstance(entry.get("name"), str) and ("arguments" in entry or "parameters" in entry):
        arguments = entry.get("arguments", entry.get("parameters"))
        if isinstance(arguments, str):
            arguments = _json(arguments, f"{where}'s arguments")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise ValueError(f"{where}'s arguments are not an object")
        return Expected(entry["name"], {k: _exactly(v) for k, v in arguments.items()})
    if len(entry) != 1:
        raise ValueError(
            f"{where} is neither {{function: {{parameter: [allowed values]}}}} "
            "nor {'name': ..., 'arguments': {...}}"
        )
    (name, params), *_ = entry.items()
    if not isinstance(params, dict):
        raise ValueError(f"{where}: the parameters of {name!r} are not an object")
    for param, allowed in params.items():
        if not isinstance(allowed, list):
            raise ValueError(
                f"{where}: {name}.{param} must be a list of allowed values, "
                f"not {type(allowed).__name__}"
            )
    return Expected(name, dict(params))


def _exactly(value: Any) -> list[Any]:
    """A plain label's value as BFCL's allowed values (objects as key -> [value])."""
    if isinstance(value, dict):
        return [{k: [v] for k, v in value.items()}]
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [[{k: [v] for k, v in item.items()} for item in value]]
    return [value]


# --- the tools -----------------------------------------------------------------------------


def _tool_index(tools: Sequence[Any] | None, check_schema: bool) -> dict[str, _Tool]:
    """The tools by name (OpenAI specs or BFCL's function docs); ValueError if unusable
    (with ``check_schema``, a schema that is not valid JSON Schema too)."""
    if tools is None:
        return {}
    if not isinstance(tools, list | tuple):
        raise ValueError(f"tools must be a list of function specs, not {type(tools).__name__}")
    index: dict[str, _Tool] = {}
    for i, spec in enumerate(tools):
        function = spec.get("function", spec) if isinstance(spec, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(f"tools[{i}] is not a function spec with a name")
        parameters = function.get("parameters")
        schema = _json_schema(parameters if isinstance(parameters, dict) else {})
        schema_json = json.dumps(schema, sort_keys=True)
        if check_schema:
            _validator(schema_json)  # a broken schema fails here, before any call
        properties = schema.get("properties")
        required = schema.get("required", [])
        index[function["name"]] = _Tool(
            properties if isinstance(properties, dict) else None,
            tuple(r for r in required if isinstance(r, str)) if isinstance(required, list) else (),
            schema_json,
        )
    return index


#: BFCL's function-doc types as JSON Schema's (``any``: no type).
_BFCL_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}
_SUBSCHEMA_KEYS = ("items", "additionalProperties", "not")
_SCHEMA_LIST_KEYS = ("anyOf", "oneOf", "allOf", "prefixItems")


def _json_schema(node: Any) -> Any:
    """``node`` with BFCL's type names made JSON Schema's, at every depth."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    kind = out.get("type")
    if isinstance(kind, str) and kind in _BFCL_TYPES:
        if _BFCL_TYPES[kind] is None:
            del out["type"]
        else:
            out["type"] = _BFCL_TYPES[kind]
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _json_schema(v) for k, v in out["properties"].items()}
    for key in _SUBSCHEMA_KEYS:
        if isinstance(out.get(key), dict):
            out[key] = _json_schema(out[key])
    for key in _SCHEMA_LIST_KEYS:
        if isinstance(out.get(key), list):
            out[key] = [_json_schema(v) for v in out[key]]
    return out


@functools.lru_cache(maxsize=512)
def _validator(schema_json: str) -> Any:
    """A validator of the schema (cached by its JSON text); ValueError for a broken schema."""
    import jsonschema  # only where tools are checked: the workers

    schema = json.loads(schema_json)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ValueError(f"a tool's parameters are not a valid JSON schema: {exc.message}") from exc
    return cls(schema)


def _tool_for(name: str, specs: dict[str, _Tool]) -> _Tool | None:
    return specs.get(name) or specs.get(name.replace(".", "_"))


# --- the response's calls ------------------------------------------------------------------


def _response_calls(
    calls: Sequence[Any] | None, text: str | None, tags: tuple[str, str] | None
) -> list[_Call]:
    if calls:
        return [_call(item) for item in calls]
    if tags is None or not text:
        return []
    return [call for block in _blocks(text, tags) for call in _block_calls(block)]


def _blocks(text: str, tags: tuple[str, str]) -> Iterator[str | None]:
    """The text between each pair of tags; None for an opening tag that never closes."""
    start, end = tags
    at = text.find(start)
    while at >= 0:
        stop = text.find(end, at + len(start))
        if stop < 0:
            yield None
            return
        yield text[at + len(start) : stop]
        at = text.find(start, stop + len(end))


def _block_calls(block: str | None) -> list[_Call]:
    if block is None:
        return [_Call(problem="malformed_call")]
    try:
        value = json.loads(block)
    except json.JSONDecodeError:
        return [_Call(problem="invalid_json")]
    if isinstance(value, list) and value:
        return [_call(item) for item in value]
    return [_call(value)]


def _call(item: Any) -> _Call:
    """One call from an OpenAI tool call, a ``{"name", "arguments"}`` object or a text block."""
    if isinstance(item, dict) and isinstance(item.get("function"), dict):
        item = item["function"]
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
        return _Call(problem="malformed_call")
    arguments = item.get("arguments", item.get("parameters"))
    if isinstance(arguments, str):
        if not arguments.strip():
            arguments = {}
        else:
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                return _Call(problem="invalid_json")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return _Call(problem="malformed_call")
    return _Call(item["name"], arguments)


# --- one call against one expected call ----------------------------------------------------


def _verdict(
    expected: Expected, call: _Call, specs: dict[str, _Tool], check_schema: bool
) -> str | None:
    """None when ``call`` matches ``expected``, else the first rule it breaks."""
    if call.problem is not None or call.arguments is None:
        return call.problem or "malformed_call"
    if call.name not in (expected.name, expected.name.replace(".", "_")):
        return "wrong_function"
    arguments = call.arguments
    tool = _tool_for(expected.name, specs)
    if tool is not None and any(p not in arguments for p in tool.required):
        return "missing_argument"
    for param, value in arguments.items():
        reason = _argument_verdict(param, value, expected.params, tool)
        if reason is not None:
            return reason
    if any(p not in arguments and "" not in allowed for p, allowed in expected.params.items()):
        return "missing_argument"
    if tool is not None and check_schema and not _validator(tool.schema_json).is_valid(arguments):
        return "schema_violation"
    return None


def _argument_verdict(
    param: str, value: Any, params: dict[str, list[Any]], tool: _Tool | None
) -> str | None:
    properties = tool.properties if tool is not None else None
    if param not in params or (properties is not None and param not in properties):
        return "unexpected_argument"
    allowed = params[param]
    exact = False
    schema = properties.get(param) if properties is not None else None
    if isinstance(schema, dict) and not _has_type(value, schema):
        # BFCL's variables: a value of the label's own type passes, compared as it is.
        label_type = next((type(a) for a in allowed if a != ""), None)
        if label_type is None or type(value) is not label_type:
            return "wrong_type"
        exact = True
    elif isinstance(schema, dict) and not _items_have_type(value, schema):
        return "wrong_type"
    return None if _allowed(value, allowed, exact) else "wrong_value"


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
    "null": (type(None),),
}


def _has_type(value: Any, schema: dict[str, Any]) -> bool:
    """Whether ``value`` has the schema's type (any of them for a list of types)."""
    kind = schema.get("type")
    kinds = [kind] if isinstance(kind, str) else kind
    return not isinstance(kinds, list) or any(_is(value, k) for k in kinds)


def _items_have_type(value: Any, schema: dict[str, Any]) -> bool:
    """Whether the items of an array have the type its schema gives them, at every depth."""
    items = schema.get("items")
    if not isinstance(value, list | tuple) or not isinstance(items, dict):
        return True
    return all(_has_type(v, items) and _items_have_type(v, items) for v in value)


def _is(value: Any, kind: Any) -> bool:
    if kind not in _JSON_TYPES:
        return True  # a type this checker does not know: the schema's validation decides
    if isinstance(value, bool) and kind != "boolean":
        return False
    return isinstance(value, _JSON_TYPES[kind])


# --- values --------------------------------------------------------------------------------

#: What BFCL's string normalisation removes: spaces and ``,./-_*^``.
_IGNORED = re.compile(r"[ ,./\-_*^]")


def _normal(text: str) -> str:
    return _IGNORED.sub("", text).lower().replace("'", '"')


def _allowed(value: Any, allowed: list[Any], exact: bool) -> bool:
    """Whether ``value`` is one of a parameter's allowed values."""
    if exact:
        return any(_same(value, a, exact=True) for a in allowed)
    if isinstance(value, dict):
        return any(_object_fits(value, a) for a in allowed if isinstance(a, dict))
    if isinstance(value, list | tuple):
        return any(_list_fits(value, a) for a in allowed if isinstance(a, list | tuple))
    return any(_same(value, a) for a in allowed)


def _object_fits(value: dict[str, Any], option: dict[str, Any]) -> bool:
    """BFCL's objects: each key of the option maps to its allowed values (``""``: optional)."""
    for key, item in value.items():
        if key not in option or not any(_same(item, a) for a in _choices(option[key])):
            return False
    return all(key in value or "" in _choices(c) for key, c in option.items())


def _choices(allowed: Any) -> list[Any]:
    return allowed if isinstance(allowed, list) else [allowed]


def _list_fits(value: Sequence[Any], option: Sequence[Any]) -> bool:
    """Element by element; an object element against an option's object as BFCL's objects."""
    if len(value) != len(option):
        return False
    return all(
        _object_fits(v, o) if isinstance(v, dict) and isinstance(o, dict) else _same(v, o)
        for v, o in zip(value, option, strict=True)
    )


def _same(a: Any, b: Any, exact: bool = False) -> bool:
    """Equal JSON values, strings normalised (unless ``exact``) at every depth."""
    if isinstance(a, str) or isinstance(b, str):
        if not (isinstance(a, str) and isinstance(b, str)):
            return False
        return a == b if exact else _normal(a) == _normal(b)
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y, exact) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], exact) for k in a)
    if isinstance(a, list | tuple | dict) or isinstance(b, list | tuple | dict):
        return False
    return bool(a == b)


# --- matching and the reason ---------------------------------------------------------------


def _max_matching(fits: list[list[bool]]) -> list[int | None]:
    """For each expected call, the response call it is paired with in a maximum matching."""
    owner: dict[int, int] = {}  # response call -> expected call

    def augment(i: int, seen: set[int]) -> bool:
        for j, ok in enumerate(fits[i]):
            if ok and j not in seen:
                seen.add(j)
                if j not in owner or augment(owner[j], seen):
                    owner[j] = i
                    return True
        return False

    for i in range(len(fits)):
        augment(i, set())
    match: list[int | None] = [None] * len(fits)
    for j, i in owner.items():
        match[i] = j
    return match


def _first_reason(
    made: list[_Call], fits: list[list[str | None]], match: list[int | None]
) -> str | None:
    problem = next((c.problem for c in made if c.problem is not None), None)
    if problem is not None:
        return problem
    if not fits and made:
        return "unexpected_call"
    if fits and not made:
        return "no_call"
    if len(fits) != len(made):
        return "wrong_count"
    free = [j for j in range(len(made)) if j not in match]
    for i, j in enumerate(match):
        if j is None:
            reasons = [fits[i][k] for k in free]
            return next((r for r in reasons if r != "wrong_function"), "wrong_function")
    return None
