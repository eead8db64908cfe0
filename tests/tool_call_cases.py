"""Hand-written cases of the ``tool_call`` verifier, with the verdict each must get.

One table for two tests: tests/unit/test_tool_call_verifier.py scores every case with
``reward_server.verifiers.tool_calls`` and tests/integration/test_bfcl_agreement.py gives the
cases the leaderboard's own checker can decide to ``bfcl-eval``'s ``ast_checker``, which
must agree. They cover BFCL's categories (simple, multiple, parallel, parallel-multiple,
irrelevance) and its rules (types, optional parameters, string normalisation), plus what
happens before and after its checker (JSON that cannot be read, calls in the text, the
tools' JSON schemas).

``bfcl`` is False where BFCL's ``ast_checker`` cannot decide a case, with the reason in
``note``: arguments that are not JSON (BFCL's decoder fails before its checker runs), items
without tools (its checker needs the function docs), JSON Schema keywords its function-doc
dialect lacks, options of this verifier.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CASES", "DIVERGENCES", "Case", "block", "call", "tool"]


def tool(name: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An OpenAI function spec."""
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def call(name: str, arguments: Any, *, as_text: bool = True) -> dict[str, Any]:
    """An OpenAI tool call; its arguments a JSON string unless ``as_text`` is False."""
    args = json.dumps(arguments) if as_text and not isinstance(arguments, str) else arguments
    return {"id": f"call_{name}", "type": "function", "function": {"name": name, "arguments": args}}


def block(name: str, arguments: dict[str, Any]) -> str:
    """A call in the text form the verifier parses."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@dataclass(frozen=True)
class Case:
    """One response's calls (``calls``, or ``text``), its label and tools, and the verdict.

    ``reason`` None means full marks; ``partial`` is the score under ``credit: partial``
    (by default 1.0 for full marks, else 0.0); ``options`` are ToolCallOptions' fields.
    """

    name: str
    category: str
    label: Any
    tools: list[dict[str, Any]] | None
    calls: list[dict[str, Any]] | None = None
    text: str | None = None
    reason: str | None = None
    partial: float | None = None
    options: dict[str, Any] = field(default_factory=dict)
    bfcl: bool = True
    note: str = ""

    @property
    def valid(self) -> bool:
        return self.reason is None

    @property
    def partial_score(self) -> float:
        if self.partial is not None:
            return self.partial
        return 1.0 if self.valid else 0.0


STRING = {"type": "string"}
INTEGER = {"type": "integer"}
NUMBER = {"type": "number"}

WEATHER = tool(
    "get_weather",
    {"city": STRING, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    ["city"],
)
TIME = tool("get_time", {"timezone": STRING}, ["timezone"])
CURRENCY = tool(
    "convert_currency", {"amount": NUMBER, "source": STRING, "target": STRING}, ["amount"]
)
#: BFCL's simple_python_0, its possible answer as BFCL's files hold it.
TRIANGLE = tool(
    "calculate_triangle_area",
    {"base": INTEGER, "height": INTEGER, "unit": STRING},
    ["base", "height"],
)
TRIANGLE_ANSWER = {
    "id": "simple_python_0",
    "ground_truth": [
        {"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}
    ],
}
#: BFCL's own function-doc dialect (type "dict"), as in its data files.
FACTORIAL_DOC = {
    "name": "math.factorial",
    "description": "Calculate the factorial of a given number.",
    "parameters": {
        "type": "dict",
        "properties": {"number": {"type": "integer", "description": "The number."}},
        "required": ["number"],
    },
}
DENSITY = tool("calculate_density", {"mass": NUMBER, "volume": NUMBER}, ["mass", "volume"])
RESTAURANTS = tool(
    "find_restaurants",
    {"city": STRING, "cuisines": {"type": "array", "items": STRING}},
    ["city", "cuisines"],
)
SUM = tool("sum_numbers", {"numbers": {"type": "array", "items": INTEGER}}, ["numbers"])
PASSENGER = {"type": "object", "properties": {"name": STRING, "age": INTEGER}}
FLIGHT = tool("book_flight", {"flight": STRING, "passenger": PASSENGER}, ["flight", "passenger"])
ORDER = tool(
    "place_order",
    {
        "items": {
            "type": "array",
            "items": {"type": "object", "properties": {"sku": STRING, "qty": INTEGER}},
        }
    },
    ["items"],
)
EVENT = tool("find_events", {"date": STRING, "name": STRING}, ["date"])
BOOKING = tool(
    "book_table",
    {"date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"}, "people": INTEGER},
    ["date", "people"],
)
STRICT_WEATHER = tool(
    "get_weather", {"city": STRING, "unit": {"type": ["string", "null"]}}, ["city", "unit"]
)

PARIS = {"get_weather": {"city": ["Paris"], "unit": ["", "celsius"]}}
LONDON = {"get_weather": {"city": ["London"], "unit": ["", "celsius"]}}
PARIS_TIME = {"get_time": {"timezone": ["Europe/Paris"]}}
EUROS = {"convert_currency": {"amount": [100.0], "source": ["USD"], "target": ["EUR"]}}
TOOLS3 = [WEATHER, TIME, CURRENCY]

NOT_JSON = "BFCL's decoder fails before its ast_checker runs"
NO_DOCS = "BFCL's ast_checker needs the function docs"
SCHEMA = "a JSON Schema keyword BFCL's function-doc dialect lacks"
OPTION = "an option of this verifier"

# One case a line or a few: a table, kept out of the formatter.
# fmt: off
CASES: list[Case] = [
    # --- simple: one function offered, one call expected
    Case("simple_exact", "simple", [PARIS], [WEATHER], calls=[call("get_weather", {"city": "Paris"})]),
    Case("simple_arguments_as_object", "simple", [PARIS], [WEATHER],
         calls=[call("get_weather", {"city": "Paris", "unit": "celsius"}, as_text=False)]),
    Case("simple_bfcl_record", "simple", TRIANGLE_ANSWER, [TRIANGLE],
         calls=[call("calculate_triangle_area", {"base": 10, "height": 5})]),
    Case("simple_wrong_function", "simple", [PARIS], [WEATHER],
         calls=[call("get_forecast", {"city": "Paris"})], reason="wrong_function"),
    Case("simple_wrong_value", "simple", [PARIS], [WEATHER],
         calls=[call("get_weather", {"city": "London"})], reason="wrong_value"),
    Case("simple_missing_required", "simple", [PARIS], [WEATHER],
         calls=[call("get_weather", {"unit": "celsius"})], reason="missing_argument"),
    Case("simple_unexpected_argument", "simple", [PARIS], [WEATHER],
         calls=[call("get_weather", {"city": "Paris", "country": "FR"})],
         reason="unexpected_argument"),
    Case("simple_argument_the_label_lacks", "simple",
         [{"get_weather": {"city": ["Paris"]}}], [WEATHER],
         calls=[call("get_weather", {"city": "Paris", "unit": "celsius"})],
         reason="unexpected_argument", note="in the tool's schema, not in the label"),
    Case("simple_plain_label", "simple",
         [{"name": "get_weather", "arguments": {"city": "Paris"}}], [WEATHER],
         calls=[call("get_weather", {"city": "paris"})]),
    Case("simple_dotted_name_as_underscores", "simple",
         [{"math.factorial": {"number": [5]}}], [FACTORIAL_DOC],
         calls=[call("math_factorial", {"number": 5})],
         note="tools in BFCL's own dialect; OpenAI-style names have no dots"),
    Case("simple_without_tools", "simple", [PARIS], None,
         calls=[call("get_weather", {"city": "Paris"})], bfcl=False, note=NO_DOCS),
    Case("simple_without_tools_wrong_value", "simple", [PARIS], None,
         calls=[call("get_weather", {"city": "Lyon"})], reason="wrong_value", bfcl=False,
         note=NO_DOCS),
    # --- multiple: several functions offered, one call expected
    Case("multiple_right_function", "multiple", [PARIS_TIME], TOOLS3,
         calls=[call("get_time", {"timezone": "Europe/Paris"})]),
    Case("multiple_wrong_function", "multiple", [PARIS_TIME], TOOLS3,
         calls=[call("get_weather", {"city": "Paris"})], reason="wrong_function"),
    Case("multiple_two_calls_for_one", "multiple", [PARIS_TIME], TOOLS3,
         calls=[call("get_time", {"timezone": "Europe/Paris"}), call("get_weather", {"city": "Paris"})],
         reason="wrong_count", partial=0.5),
    # --- parallel: one function called several times, in any order
    Case("parallel_any_order", "parallel", [PARIS, LONDON], [WEATHER],
         calls=[call("get_weather", {"city": "London"}), call("get_weather", {"city": "Paris"})]),
    Case("parallel_one_missing", "parallel", [PARIS, LONDON], [WEATHER],
         calls=[call("get_weather", {"city": "London"})], reason="wrong_count", partial=0.5),
    Case("parallel_one_wrong", "parallel", [PARIS, LONDON], [WEATHER],
         calls=[call("get_weather", {"city": "Paris"}), call("get_weather", {"city": "Berlin"})],
         reason="wrong_value", partial=0.5),
    Case("parallel_one_extra", "parallel", [PARIS, LONDON], [WEATHER],
         calls=[call("get_weather", {"city": c}) for c in ("Paris", "London", "Rome")],
         reason="wrong_count", partial=2 / 3),
    Case("parallel_text_blocks", "parallel", [PARIS, LONDON], [WEATHER],
         text="I'll check both.\n" + block("get_weather", {"city": "London"}) + "\n"
         + block("get_weather", {"city": "Paris", "unit": "celsius"})),
    Case("parallel_list_in_one_block", "parallel", [PARIS, LONDON], [WEATHER],
         text="<tool_call>" + json.dumps([{"name": "get_weather", "arguments": {"city": c}}
                                          for c in ("Paris", "London")]) + "</tool_call>"),
    # --- parallel-multiple: several functions, several calls
    Case("parallel_multiple_any_order", "parallel_multiple", [PARIS, EUROS], TOOLS3,
         calls=[call("convert_currency", {"amount": 100, "source": "usd", "target": "eur"}),
                call("get_weather", {"city": "Paris"})]),
    Case("parallel_multiple_wrong_function", "parallel_multiple", [PARIS, EUROS], TOOLS3,
         calls=[call("get_weather", {"city": "Paris"}), call("get_time", {"timezone": "UTC"})],
         reason="wrong_function", partial=0.5),
    Case("parallel_multiple_same_function_twice", "parallel_multiple", [PARIS, EUROS], TOOLS3,
         calls=[call("get_weather", {"city": "Paris"}), call("get_weather", {"city": "Paris"})],
         reason="wrong_function", partial=0.5),
    # --- irrelevance: no call expected
    Case("irrelevance_no_call", "irrelevance", [], [WEATHER],
         text="I cannot book flights, I can only look up the weather."),
    Case("irrelevance_empty_tool_calls", "irrelevance", [], TOOLS3, calls=[], text="No tool fits."),
    Case("irrelevance_called", "irrelevance", [], [WEATHER],
         calls=[call("get_weather", {"city": "Paris"})], reason="unexpected_call"),
    Case("no_call_when_expected", "simple", [PARIS], [WEATHER],
         text="The weather in Paris is usually mild.", reason="no_call"),
    # --- types
    Case("types_integer_for_number", "types",
         [{"calculate_density": {"mass": [10.0], "volume": [2.0]}}], [DENSITY],
         calls=[call("calculate_density", {"mass": 10, "volume": 2})]),
    Case("types_float_for_integer", "types", TRIANGLE_ANSWER, [TRIANGLE],
         calls=[call("calculate_triangle_area", {"base": 10.0, "height": 5})], reason="wrong_type"),
    Case("types_string_for_integer", "types", TRIANGLE_ANSWER, [TRIANGLE],
         calls=[call("calculate_triangle_area", {"base": "10", "height": 5})], reason="wrong_type"),
    Case("types_boolean_for_integer", "types", TRIANGLE_ANSWER, [TRIANGLE],
         calls=[call("calculate_triangle_area", {"base": True, "height": 5})], reason="wrong_type"),
    Case("types_array_of_strings", "types",
         [{"find_restaurants": {"city": ["Rome"], "cuisines": [["Italian", "Thai"]]}}],
         [RESTAURANTS],
         calls=[call("find_restaurants", {"city": "rome", "cuisines": ["italian", "THAI"]})]),
    Case("types_array_in_another_order", "types",
         [{"find_restaurants": {"city": ["Rome"], "cuisines": [["Italian", "Thai"]]}}],
         [RESTAURANTS],
         calls=[call("find_restaurants", {"city": "Rome", "cuisines": ["Thai", "Italian"]})],
         reason="wrong_value"),
    Case("types_array_item_type", "types", [{"sum_numbers": {"numbers": [[1, 2]]}}], [SUM],
         calls=[call("sum_numbers", {"numbers": [1, "2"]})], reason="wrong_type"),
    Case("types_object", "types",
         [{"book_flight": {"flight": ["AF 123"], "passenger": [{"name": ["Ann Lee"], "age": [30]}]}}],
         [FLIGHT],
         calls=[call("book_flight", {"flight": "af123", "passenger": {"name": "ann lee", "age": 30}})]),
    Case("types_object_missing_key", "types",
         [{"book_flight": {"flight": ["AF 123"], "passenger": [{"name": ["Ann Lee"], "age": [30]}]}}],
         [FLIGHT],
         calls=[call("book_flight", {"flight": "AF 123", "passenger": {"name": "Ann Lee"}})],
         reason="wrong_value"),
    Case("types_object_optional_key", "types",
         [{"book_flight": {"flight": ["AF 123"], "passenger": [{"name": ["Ann Lee"], "age": ["", 30]}]}}],
         [FLIGHT],
         calls=[call("book_flight", {"flight": "AF 123", "passenger": {"name": "Ann Lee"}})]),
    Case("types_list_of_objects", "types",
         [{"place_order": {"items": [[{"sku": ["A1"], "qty": [2]}, {"sku": ["B2"], "qty": [1]}]]}}],
         [ORDER],
         calls=[call("place_order", {"items": [{"sku": "a1", "qty": 2}, {"sku": "B2", "qty": 1}]})]),
    Case("types_list_of_objects_wrong_quantity", "types",
         [{"place_order": {"items": [[{"sku": ["A1"], "qty": [2]}, {"sku": ["B2"], "qty": [1]}]]}}],
         [ORDER],
         calls=[call("place_order", {"items": [{"sku": "A1", "qty": 2}, {"sku": "B2", "qty": 3}]})],
         reason="wrong_value"),
    Case("types_nullable", "types", [{"get_weather": {"city": ["Paris"], "unit": [None]}}],
         [STRICT_WEATHER], calls=[call("get_weather", {"city": "Paris", "unit": None})],
         bfcl=False, note="a list of types: " + SCHEMA),
    # --- optional parameters
    Case("optional_omitted", "optional", TRIANGLE_ANSWER, [TRIANGLE],
         calls=[call("calculate_triangle_area", {"base": 10, "height": 5})]),
    Case("optional_given_allowed", "optional", TRIANGLE_ANSWER, [TRIANGLE],
         calls=[call("calculate_triangle_area", {"base": 10, "height": 5, "unit": "units"})]),
    Case("optional_given_another_value", "optional", TRIANGLE_ANSWER, [TRIANGLE],
         calls=[call("calculate_triangle_area", {"base": 10, "height": 5, "unit": "cm"})],
         reason="wrong_value"),
    Case("optional_in_schema_not_in_label", "optional",
         [{"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units"]}}],
         [TRIANGLE], calls=[call("calculate_triangle_area", {"base": 10, "height": 5})],
         reason="missing_argument", note="the label does not allow leaving 'unit' out"),
    # --- string normalisation
    Case("strings_punctuation_and_case", "strings",
         [{"find_events": {"date": ["April 1, 2024"], "name": ["", "Jazz Night"]}}], [EVENT],
         calls=[call("find_events", {"date": "april 1 2024", "name": "jazz-night"})]),
    Case("strings_quotes", "strings", [{"find_events": {"date": ["today"], "name": ["O'Brien's"]}}],
         [EVENT], calls=[call("find_events", {"date": "Today", "name": 'o"brien"s'})]),
    Case("strings_several_allowed", "strings",
         [{"get_weather": {"city": ["New York City", "NYC"], "unit": [""]}}], [WEATHER],
         calls=[call("get_weather", {"city": "nyc"})]),
    Case("strings_different_word", "strings",
         [{"get_weather": {"city": ["New York"], "unit": [""]}}], [WEATHER],
         calls=[call("get_weather", {"city": "Newark"})], reason="wrong_value"),
    # --- JSON that cannot be read
    Case("invalid_json_arguments", "invalid_json", [PARIS], [WEATHER],
         calls=[call("get_weather", '{"city": "Paris"')], reason="invalid_json", bfcl=False,
         note=NOT_JSON),
    Case("invalid_json_text_block", "invalid_json", [PARIS], [WEATHER],
         text="<tool_call>{name: get_weather, arguments: {city: Paris}}</tool_call>",
         reason="invalid_json", bfcl=False, note=NOT_JSON),
    Case("invalid_json_one_of_two", "invalid_json", [PARIS, LONDON], [WEATHER],
         calls=[call("get_weather", {"city": "Paris"}), call("get_weather", "{'city': 'London'}")],
         reason="invalid_json", partial=0.5, bfcl=False, note=NOT_JSON),
    Case("malformed_unclosed_block", "invalid_json", [PARIS], [WEATHER],
         text='<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}',
         reason="malformed_call", bfcl=False, note=NOT_JSON),
    Case("malformed_arguments_not_an_object", "invalid_json", [PARIS], [WEATHER],
         calls=[call("get_weather", '"Paris"')], reason="malformed_call", bfcl=False,
         note=NOT_JSON),
    # --- the tools' JSON schemas
    Case("schema_enum", "schema", [{"get_weather": {"city": ["Paris"], "unit": ["", "Celsius"]}}],
         [WEATHER], calls=[call("get_weather", {"city": "Paris", "unit": "Celsius"})],
         reason="schema_violation", bfcl=False, note="enum: " + SCHEMA),
    Case("schema_pattern", "schema", [{"book_table": {"date": ["2024-04-01"], "people": [4]}}],
         [BOOKING], calls=[call("book_table", {"date": "2024/04/01", "people": 4})],
         reason="schema_violation", bfcl=False, note="pattern: " + SCHEMA),
    Case("schema_check_off", "schema", [{"get_weather": {"city": ["Paris"], "unit": ["", "Celsius"]}}],
         [WEATHER], calls=[call("get_weather", {"city": "Paris", "unit": "Celsius"})],
         options={"check_schema": False}),
    # --- calls in the text
    Case("text_after_prose", "text", [PARIS], [WEATHER],
         text="Let me look that up.\n" + block("get_weather", {"city": "Paris"})),
    Case("text_tags_off", "text", [PARIS], [WEATHER],
         text=block("get_weather", {"city": "Paris"}), options={"tags": None},
         reason="no_call", bfcl=False, note=OPTION),
    Case("text_custom_tags", "text", [PARIS], [WEATHER],
         text='<function_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</function_call>',
         options={"tags": ("<function_call>", "</function_call>")}),
]

#: Where this verifier decides otherwise than BFCL's ast_checker, on purpose (the
#: tool_calls module's docstring says why): BFCL's verdict here is invalid, this verifier's
#: is full marks; tests/integration/test_bfcl_agreement.py checks that BFCL does disagree.
DIVERGENCES: list[Case] = [
    Case("greedy_parallel_matching", "parallel",
         [{"pick": {"x": [1, 2]}}, {"pick": {"x": [1]}}], [tool("pick", {"x": INTEGER}, ["x"])],
         calls=[call("pick", {"x": 1}), call("pick", {"x": 2})],
         note="BFCL gives the first expected call the first response call that fits"),
    Case("nested_strings_normalised", "types",
         [{"plan_routes": {"routes": [[["New York", "Paris"]]]}}],
         [tool("plan_routes", {"routes": {"type": "array", "items": {"type": "array", "items": STRING}}}, ["routes"])],
         calls=[call("plan_routes", {"routes": [["new york", "paris"]]})],
         note="BFCL normalises the strings of one level only"),
    Case("integer_items_for_number", "types", [{"average": {"values": [[1.0, 2.5]]}}],
         [tool("average", {"values": {"type": "array", "items": NUMBER}}, ["values"])],
         calls=[call("average", {"values": [1, 2.5]})],
         note="BFCL accepts an integer for a number parameter, not for a number item"),
]
# fmt: on
