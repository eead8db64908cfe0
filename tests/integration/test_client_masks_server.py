"""The reward client against a real server that masks items (issue 35): what the server
sends, the client reads.

One server process holds a python verifier (tests/verifier_functions.py:by_label, one
behaviour per label) with no model: ``/score`` answers null and a reason for the items it
could not score, ``/get_reward`` a fill value and ``extra_logs["masked"]``. The client gives
None for them in both protocols, and its deadline reaches the server as
``X-Request-Timeout-Ms``: a hanging item is masked ``deadline`` and the call returns in time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.models_files import python_verifier, verifier_function
from helpers.servers import serve
from server_proc import ServerProcess

from reward_client import AsyncRewardClient, RewardClient

ROOT = Path(__file__).resolve().parents[2]
BY_LABEL = verifier_function("by_label")

LABELS = ["ok", "raise", "nan", "string"]
REASONS = [None, "error", "non_finite", "bad_result"]
TEXTS = ["fine", "b", "c", "d"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    check = python_verifier("check", BY_LABEL, workers=2, timeout_s=30)
    with serve(models=[check], folder=tmp_path_factory.mktemp("client-masks")) as srv:
        yield srv


def test_masked_items_are_none_with_the_servers_reasons(server: ServerProcess) -> None:
    with RewardClient(server.url, retry_timeout=0) as client:
        result = client.score_detailed(texts=TEXTS, labels=LABELS)
        assert client.score(texts=TEXTS[:1], labels=LABELS[:1]) == [4.0]
    assert result.scores == [4.0, None, None, None]
    assert result.masked == REASONS
    assert result.masked_reasons() == {"error": 1, "non_finite": 1, "bad_result": 1}


def test_chunks_merge_their_masks(server: ServerProcess) -> None:
    texts, labels = TEXTS * 2, ["ok", "ok", "ok", "ok", *LABELS]
    with RewardClient(server.url, retry_timeout=0, max_client_batch=4) as client:
        result = client.score_detailed(texts=texts, labels=labels)
    assert result.scores == [4.0, 1.0, 1.0, 1.0, 4.0, None, None, None]
    assert result.masked == [None] * 5 + REASONS[1:]


def test_openrlhf_protocol_masks_from_get_reward(server: ServerProcess) -> None:
    with RewardClient(server.url, protocol="openrlhf", retry_timeout=0) as client:
        result = client.score_detailed(texts=TEXTS, labels=LABELS)
    assert result.scores == [4.0, None, None, None]
    assert result.masked == [None, "unknown", "unknown", "unknown"]


def test_the_clients_deadline_masks_a_hanging_item(server: ServerProcess) -> None:
    """The verifier's own timeout is 30 s; the call's deadline of 2 s reaches the server in
    the header, which answers at it with the hanging item masked ``deadline``."""
    deadline = 2.0

    async def call() -> tuple[list[float | None], list[str | None] | None, float]:
        async with AsyncRewardClient(server.url, deadline=deadline) as client:
            started = time.monotonic()
            result = await client.score_detailed(texts=["x", "fine"], labels=["sleep", "ok"])
            return result.scores, result.masked, time.monotonic() - started

    scores, masked, took = asyncio.run(call())
    assert scores == [None, 4.0] and masked == ["deadline", None]
    assert took < deadline + 0.5, took
    with RewardClient(server.url) as client:  # a per-call deadline does the same
        started = time.monotonic()
        result = client.score_detailed(texts=["x"], labels=["sleep"], deadline=1.0)
        assert time.monotonic() - started < 1.5
    assert result.masked == ["deadline"]
