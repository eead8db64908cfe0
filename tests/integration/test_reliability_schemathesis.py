"""Hostile input, generated: schemathesis against the live server's ``/openapi.json``.

Every operation gets a bounded number of schema-valid (positive) and schema-violating
(negative) requests. All of schemathesis' checks run except ``positive_data_acceptance``:
requests the schema allows can still be refused by design (queries and responses of unequal
length, several input forms at once, an item that encodes to no token), which JSON Schema
cannot express. So: no 5xx, every status code documented, every response body and header
as the schema says, schema-violating requests refused, and a server started with an API key
refuses requests without it (``ignored_auth``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance
from server_proc import ServerProcess, running_server

#: Generated requests per operation and mode (``make test`` budget: seconds, not minutes).
MAX_EXAMPLES = 40
API_KEY = "schemathesis-key-0123456789"


@pytest.fixture(scope="module")
def fuzzed_server(llama_rm: Path) -> Iterator[ServerProcess]:
    # The Llama-like model has a chat template, so conversations are valid input too.
    with running_server(
        llama_rm, "--max-body-bytes", "200000", env={"REWARD_SERVER_API_KEY": API_KEY}
    ) as server:
        yield server


def fuzz(
    operation: schemathesis.APIOperation,
    mode: GenerationMode,
    session: requests.Session,
    headers: dict[str, str],
    seen: Counter[int],
) -> None:
    """Run ``MAX_EXAMPLES`` generated requests against one operation with every check."""

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case: schemathesis.Case) -> None:
        response = case.call_and_validate(
            session=session, headers=headers, excluded_checks=[positive_data_acceptance]
        )
        seen[response.status_code] += 1

    check()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_schemathesis_finds_no_server_error_and_no_schema_violation(
    fuzzed_server: ServerProcess, mode: GenerationMode
) -> None:
    auth = {"Authorization": f"Bearer {API_KEY}"}
    schema = schemathesis.openapi.from_url(f"{fuzzed_server.url}/openapi.json", headers=auth)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} == {
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
    }
    statuses: dict[str, Counter[int]] = {}
    with requests.Session() as session:
        for operation in operations:
            if mode is GenerationMode.NEGATIVE and operation.method.upper() == "GET":
                continue  # nothing to violate in a GET without parameters
            seen = statuses.setdefault(operation.label, Counter())
            fuzz(operation, mode, session, auth, seen)

    for label, seen in statuses.items():
        assert seen, label
        assert all(status < 500 for status in seen), (label, seen)
    if mode is GenerationMode.POSITIVE:
        # Some schema-valid requests are scored (the fuzzing reaches the model).
        assert statuses["POST /score"][200] > 0, statuses
        assert statuses["POST /get_reward"][200] > 0, statuses
        for label in ("POST /classify", "POST /pooling", "POST /predict"):
            assert statuses[label][200] > 0, (label, statuses[label])
    else:
        # Schema-violating bodies are refused (schemathesis' negative_data_rejection checks
        # each one; the mutations it makes to the Authorization header are overridden here).
        for label in ("POST /score", "POST /get_reward", "POST /classify", "POST /predict"):
            assert statuses[label][422] > 0, (label, statuses[label])
    assert fuzzed_server.proc.poll() is None
    assert httpx.get(f"{fuzzed_server.url}/health").status_code == 200
    assert "Traceback" not in fuzzed_server.log()
