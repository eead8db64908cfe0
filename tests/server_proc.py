"""Run the real ``reward-server`` console script in a subprocess for end-to-end tests.

The implementation lives in :mod:`reward_server.launcher` (the demo and the benchmarks use
it too); this module keeps the tests' import path short, and reads what a running server
counted from its /metrics.
"""

import os

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reward_server.launcher import (
    REWARD_SERVER,
    ServerProcess,
    free_port,
    running_server,
    start_server,
)

__all__ = [
    "REWARD_SERVER",
    "ServerProcess",
    "free_port",
    "metric",
    "running_server",
    "score_requests",
    "start_server",
]


def metric(url: str, name: str, **labels: str) -> float:
    """The server's sample ``name`` with exactly ``labels`` from its /metrics (0 if absent)."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def score_requests(url: str) -> float:
    """/score requests the server at ``url`` answered 200 so far."""
    return metric(url, "reward_server_requests_total", endpoint="/score", status="200")


def require_counterpart(present: bool, env: str, what: str) -> None:
    """Skip the calling test module when a real counterpart (vLLM, kubectl, Ray) is missing,
    or fail it where ``make test`` set ``env`` to 1: CI must run those tests, not skip them."""
    if present:
        return
    if os.environ.get(env) == "1":
        pytest.fail(f"{what} is not installed: run `make setup`", pytrace=False)
    pytest.skip(f"{what} is not installed", allow_module_level=True)
