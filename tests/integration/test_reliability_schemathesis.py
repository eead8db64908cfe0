"""Hostile input, generated: schemathesis against the live server's ``/openapi.json``.

The server serves several kinds at once: a reward model whose chat template renders tool
calls, tools and thinking (Hermes style), and the ``exact``, ``tool_call``, ``format``,
``math`` and ``python`` verifiers, behind an API key. Every operation of the app gets
:data:`MAX_EXAMPLES` schema-valid (positive) and schema-violating (negative) requests, and
every one of schemathesis' checks runs on every answer: no 5xx, every status code
documented for its route, every body and header as the schema says, schema-violating
requests refused (``negative_data_rejection``), a route that needs the key refusing a
request without it or with a wrong one (``ignored_auth``, which sends each accepted
request again so), and schema-valid requests accepted (``positive_data_acceptance``) on
every route but :data:`SEMANTIC`'s. All findings of a run are reported together.

On :data:`SEMANTIC`'s routes a request the schema allows can still be refused (422) by a
rule JSON Schema cannot state, named in the request body's description and in the route's
422 description:

* ``POST /score``: queries and responses of equal length; labels one per item; groups
  naming items of the request, each in one group at most, whose prompts are equal
  (``invalid_request``); ``model`` the name of a served model (``unknown_model``).
* ``POST /get_reward``: labels, and prompts when given, one per query.
* ``POST /v1/fine_tuning/alpha/graders/run`` and ``/validate``: a grader object whose
  template variables read item or sample, whose multi formula parses and names its
  graders, whose python source compiles and defines grade, whose label_model's passing
  labels are among its labels (``invalid_request``).
* ``POST /v1/graders/{name}``: ``name`` a ``kind: grader`` entry (``unknown_model``: none
  is served here).

Every other 422 a served model can give is out of reach here: this template renders every
conversation and no served model scores in groups or by steps. ``POST /run_code`` answers
404 (no code verifier is served: a generated language would be refused anyway).

Random generation rarely lands on a schema's edges (a bare string where a list is allowed
too, 3.0 as an integer, "5" as a number, a falsy non-list): :data:`EDGES` holds such
bodies, and the schema and the server must agree on each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from chat_templates import TOOL_FAMILIES
from helpers.servers import serve
from hypothesis import HealthCheck, given, settings
from jsonschema import Draft202012Validator
from schemathesis import GenerationMode
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import positive_data_acceptance
from server_proc import ServerProcess

import tiny_models

#: Generated requests per operation and mode (``make test`` budget: about a minute).
MAX_EXAMPLES = 40
API_KEY = "schemathesis-key-0123456789"

#: A python verifier that reads the tool calls and tools: two objectives.
FUNCTION = """
def count_calls(prompt, response, label, *, tools, tool_calls):
    return {"score": float(len(tool_calls or [])), "tools": float(len(tools or []))}
"""

#: Every operation of the app.
OPERATIONS = {
    "POST /score",
    "POST /get_reward",
    "GET /health",
    "GET /info",
    "GET /metrics",
    "POST /classify",
    "POST /v1/classify",
    "POST /pooling",
    "GET /v1/models",
    "POST /predict",
    "POST /slime/reward",
    "POST /run_code",
    "POST /verify",
    "POST /seed_session",
    "POST /v1/fine_tuning/alpha/graders/run",
    "POST /v1/fine_tuning/alpha/graders/validate",
    "POST /v1/graders/{name}",
}

#: Routes where a schema-valid request may be refused by a rule JSON Schema cannot state
#: (the module's docstring names them): positive_data_acceptance is not checked there.
SEMANTIC = {
    "POST /score",
    "POST /get_reward",
    "POST /v1/fine_tuning/alpha/graders/run",
    "POST /v1/fine_tuning/alpha/graders/validate",
    "POST /v1/graders/{name}",
}

#: Bodies at the edges of the schemas (path, body): the schema and the server must agree on
#: each, the server refusing it (422) exactly when the schema does. Random generation rarely
#: lands on these.
USER = {"role": "user", "content": "Weather in Paris?"}
CALL = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
ASKED = {"input": [{"role": "user", "content": "Weather?"}]}


def verify(*output: Any, **params: Any) -> dict[str, Any]:
    """A /verify body: ``params`` of the prompt, ``output`` items of the response."""
    return {"responses_create_params": {**ASKED, **params}, "response": {"output": list(output)}}


EDGES: list[tuple[str, Any]] = [
    # vLLM: input a text or texts, exactly one of input and messages; integers as JSON's.
    ("/classify", {"input": "a text"}),
    ("/classify", {"input": "a text", "messages": None}),
    ("/classify", {"input": "a text", "messages": [USER]}),
    ("/classify", {}),
    ("/pooling", {"input": ["a"], "truncate_prompt_tokens": 3.0}),
    ("/pooling", {"input": ["a"], "truncate_prompt_tokens": "3"}),
    ("/pooling", {"input": ["a"], "truncate_prompt_tokens": True}),
    # /score: one input form, null is none; tools and groups need turns; numbers as JSON's.
    ("/score", {"texts": ["a"], "queries": None, "responses": None}),
    ("/score", {"texts": ["a"], "queries": ["q"]}),
    ("/score", {"texts": ["a"], "tools": []}),
    ("/score", {"texts": ["a"], "tools": [TOOL]}),
    ("/score", {"texts": ["a"], "groups": [[0]]}),
    ("/score", {"queries": ["q", "q"], "responses": ["a", "b"], "groups": [[0, 1.0]]}),
    ("/score", {"queries": ["q"], "responses": ["a"], "groups": [[]]}),
    ("/score", {"queries": ["q", "q"], "responses": ["a", "b"], "groups": [[0, 0]]}),
    ("/score", {"texts": ["a"], "timeout_ms": 5000}),
    ("/score", {"texts": ["a"], "timeout_ms": "5000"}),
    ("/score", {"texts": ["a"], "timeout_ms": True}),
    # Messages: only the assistant may leave out content or call tools.
    ("/score", {"conversations": [[USER, {"role": "assistant", "tool_calls": [CALL]}]]}),
    ("/score", {"conversations": [[{"role": "user", "content": None}]]}),
    ("/score", {"conversations": [[{**USER, "tool_calls": [CALL]}]]}),
    ("/slime/reward", {"prompt": [{"role": "system"}], "response": "a"}),
    # TEI: a sequence is one or two texts.
    ("/predict", {"inputs": []}),
    ("/predict", {"inputs": ["a", "b", "c"]}),
    ("/predict", {"inputs": [["a"], ["b", "c"]]}),
    ("/predict", {"inputs": [[]]}),
    # OpenRLHF: prompts one per query, or none.
    ("/get_reward", {"query": ["a"], "prompts": []}),
    # SandboxFusion: numbers as JSON's (404: this server runs no code).
    ("/run_code", {"code": "print(1)", "language": "python", "memory_limit_MB": 64.0}),
    ("/run_code", {"code": "print(1)", "language": "python", "run_timeout": "5"}),
    # NeMo Gym: the items and tools that have a chat form.
    ("/verify", verify({"type": "function_call", "name": "f", "call_id": "c", "arguments": {}})),
    ("/verify", verify({"type": "function_call", "name": "f", "call_id": "c"})),
    ("/verify", verify({"role": "assistant", "content": None, "tool_calls": [CALL]})),
    ("/verify", verify({"role": "assistant", "content": "a", "tool_calls": 5})),
    ("/verify", verify({"role": "assistant", "content": "a", "tool_calls": ""})),
    ("/verify", verify({"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}]})),
    ("/verify", verify({"type": "reasoning", "content": 5})),
    ("/verify", verify({"type": "reasoning", "content": [{"text": 5}]})),
    ("/verify", verify({"type": "function_call_output", "call_id": "c"})),
    ("/verify", verify({"type": "web_search_call", "id": "w"})),
    ("/verify", verify({"content": "no role, no type"})),
    ("/verify", verify({"role": "tool", "content": "18C"})),
    ("/verify", verify(tools=[{"type": "function", "name": "f"}])),
    ("/verify", verify(tools=[{"type": "function", "function": {"name": "f"}}])),
    ("/verify", verify(tools=[{"type": "function", "description": "no name"}])),
    ("/verify", verify(tools=[{"type": "web_search"}])),
]

#: Operation -> status -> how many answers had it.
Statuses = dict[str, Counter[int]]


@dataclass
class Finding:
    """Answers that failed one check the same way: the first request, and each answer."""

    request: Any
    answers: Counter[str] = field(default_factory=Counter)


#: (operation, the check's title, status) -> what failed.
Findings = dict[tuple[str, str, int], Finding]


@pytest.fixture(scope="module")
def fuzzed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("schemathesis")
    hermes = TOOL_FAMILIES["hermes"].template
    model = tiny_models.save_llama_reward_model(folder / "rm", seed=3, chat_template=hermes)
    functions = folder / "fuzzed_functions.py"
    functions.write_text(FUNCTION, encoding="utf-8")
    entries: list[dict[str, Any]] = [
        {"name": "rm", "model": str(model)},
        {"name": "exact", "kind": "verifier", "verifier": "exact"},
        {"name": "calls", "kind": "verifier", "verifier": "tool_call"},
        {
            "name": "shape",
            "kind": "verifier",
            "verifier": "format",
            "answer_tags": ["<answer>", "</answer>"],
        },
        {"name": "math", "kind": "verifier", "verifier": "math"},
        {
            "name": "counts",
            "kind": "verifier",
            "verifier": "python",
            "function": f"{functions}:count_calls",
        },
    ]
    env = {"REWARD_SERVER_API_KEY": API_KEY}
    with serve(
        None, "--max-body-bytes", "200000", models=entries, folder=folder, env=env
    ) as server:
        yield server


def fuzz(
    operation: schemathesis.APIOperation,
    mode: GenerationMode,
    session: requests.Session,
    statuses: Statuses,
    findings: Findings,
) -> None:
    """``MAX_EXAMPLES`` generated requests to one operation, every check on every answer;
    each failure is noted in ``findings`` (nothing is shrunk: the run goes on)."""
    auth = {"Authorization": f"Bearer {API_KEY}"}
    label = operation.label
    excluded = [positive_data_acceptance] if label in SEMANTIC else []
    seen = statuses.setdefault(label, Counter())

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: schemathesis.Case) -> None:
        response = case.call(session=session, headers=auth)
        seen[response.status_code] += 1
        try:
            case.validate_response(
                response,
                headers=auth,
                excluded_checks=excluded,
                transport_kwargs={"session": session, "headers": auth},
            )
        except FailureGroup as group:
            for failure in group.exceptions:
                key = (label, failure.title, response.status_code)
                found = findings.setdefault(key, Finding(case.body))
                found.answers[response.text[:160]] += 1

    check()


def report(findings: Findings) -> str:
    """Each kind of failure: its first request and its answers, most frequent first."""
    lines = []
    for (label, title, status), found in sorted(findings.items()):
        lines.append(f"{label}: {title} ({status}) x{found.answers.total()}")
        lines.append(f"  first request: {found.request!r:.300}")
        lines += [f"  {n} x {answer}" for answer, n in found.answers.most_common()]
    return "\n".join(lines)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_schemathesis_finds_no_response_the_schema_does_not_state(
    fuzzed_server: ServerProcess, mode: GenerationMode
) -> None:
    auth = {"Authorization": f"Bearer {API_KEY}"}
    schema = schemathesis.openapi.from_url(f"{fuzzed_server.url}/openapi.json", headers=auth)
    # Every request carries the key: negative requests violate their bodies, not their auth
    # (ignored_auth probes each accepted request again without the key and with a wrong one).
    schema.config.generation.update(with_security_parameters=False)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} == OPERATIONS
    statuses: Statuses = {}
    findings: Findings = {}
    with requests.Session() as session:
        for operation in operations:
            if mode is GenerationMode.NEGATIVE and operation.method.upper() == "GET":
                continue  # nothing to violate in a GET without parameters
            fuzz(operation, mode, session, statuses, findings)

    assert not findings, f"{len(findings)} kinds of failure:\n{report(findings)}\n{statuses}"
    for label, seen in statuses.items():
        assert seen, label
    if mode is GenerationMode.POSITIVE:
        # Schema-valid requests reach the models and are scored on every scoring route.
        # (/v1/graders/{name}: a generated name is no kind: grader entry, and none is served)
        scoring = OPERATIONS - {
            "GET /health",
            "GET /metrics",
            "POST /run_code",
            "POST /v1/graders/{name}",
        }
        for label in scoring:
            assert statuses[label][200] > 0, (label, statuses[label])
    else:
        # Schema-violating bodies are refused (schemathesis' negative_data_rejection checks
        # each one).
        for label in {op.label for op in operations if op.method.upper() == "POST"}:
            assert statuses[label][422] > 0, (label, statuses[label])
    assert fuzzed_server.proc.poll() is None
    assert httpx.get(f"{fuzzed_server.url}/health").status_code == 200
    assert "Traceback" not in fuzzed_server.log()


def test_the_schema_and_the_server_agree_at_the_edges(fuzzed_server: ServerProcess) -> None:
    auth = {"Authorization": f"Bearer {API_KEY}"}
    document = httpx.get(f"{fuzzed_server.url}/openapi.json", headers=auth).json()
    disagree = []
    with httpx.Client(base_url=fuzzed_server.url, headers=auth, timeout=60) as client:
        for path, body in EDGES:
            content = document["paths"][path]["post"]["requestBody"]["content"]
            schema = content["application/json"]["schema"]
            valid = Draft202012Validator({**schema, "components": document["components"]})
            answer = client.post(path, json=body)
            assert answer.status_code < 500, (path, body, answer.text)
            if valid.is_valid(body) == (answer.status_code == 422):
                said = "allows" if valid.is_valid(body) else "refuses"
                disagree.append(
                    f"{path} {body}: the schema {said} it, the server answers "
                    f"{answer.status_code} {answer.text[:200]}"
                )
    assert not disagree, "\n".join(disagree)
