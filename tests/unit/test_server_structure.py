"""The server's module seams: what imports torch (checked in a fresh interpreter:
test_server_structure_imports.py), which threads live how long, the engine seam (an engine
that batches by itself needs no edit of the server)."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import get_args

import pytest
from fastapi.testclient import TestClient

from reward_server import errors as core_errors
from reward_server.config import ServerSettings
from reward_server.engines import available_engines, engine_module
from reward_server.http import errors as http_errors
from reward_server.http.app import create_app
from reward_server.scheduling import AdmissionScheduler, Batcher
from reward_server.scoring import items as items_module
from reward_server.scoring.pipeline import ScoringPipeline
from reward_server.scoring.registry import THREAD_PREFIX
from reward_server.text.rendering import Encoded


def test_every_service_error_answers_through_the_table() -> None:
    # One hierarchy in the core, one table at the edge: a new error class without a status
    # of its own would answer as an anonymous 500 "internal_error".
    kinds = [
        cls
        for cls in vars(core_errors).values()
        if isinstance(cls, type) and issubclass(cls, core_errors.ServiceError)
    ]
    assert len(kinds) > 15
    for cls in kinds:
        if cls is core_errors.ServiceError:
            continue
        assert cls in http_errors.ERRORS, f"{cls.__name__} has no status in the error table"
        _status, kind = http_errors.classify(cls.__new__(cls))
        assert kind != "internal_error", cls


def test_items_cross_into_the_pipeline_as_plain_data() -> None:
    # The HTTP layer hands the pipeline values, never callables that run later elsewhere.
    shapes = get_args(items_module.Items)
    assert len(shapes) == 5
    for shape in shapes:
        assert dataclasses.is_dataclass(shape) and shape.__dataclass_params__.frozen
        for field in dataclasses.fields(shape):
            assert "Callable" not in str(field.type), (shape.__name__, field.name, field.type)
    score = inspect.signature(ScoringPipeline.score).parameters["items"]
    assert score.annotation == "Items"


def reward_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


def test_app_started_and_stopped_twice_leaves_no_thread(gpt2_rm: Path) -> None:
    settings = ServerSettings(model=str(gpt2_rm), max_wait_ms=1.0)
    assert reward_threads() == []
    for _ in range(2):  # two apps, each loading the model in its lifespan
        with TestClient(create_app(settings)) as client:
            assert client.post("/score", json={"texts": ["hello there"]}).status_code == 200
            assert any(name.startswith(f"{THREAD_PREFIX}compute") for name in reward_threads())
        assert reward_threads() == []
    app = create_app(settings)
    for _ in range(2):  # one app, restarted
        with TestClient(app) as client:
            assert client.get("/health").status_code == 200
            assert client.post("/score", json={"texts": ["hello again"]}).status_code == 200
        assert reward_threads() == []


def test_engines_are_found_by_name() -> None:
    assert available_engines() == ["transformers", "vllm"]
    assert callable(engine_module("transformers").load)
    with pytest.raises(ValueError, match="unknown engine 'nope'; choose transformers"):
        engine_module("nope")


class SelfBatchingScorer:
    """A scorer that batches by itself (a RowRunner, as an async engine is): the service must
    not wrap it in a Batcher; it gets every request's rows as they come."""

    name = "self-batching"
    device = "cpu"
    max_length = 32

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.submits: list[int] = []

    @property
    def errored(self) -> bool:
        return False

    def check_rows(self, rows: Sequence[Sequence[int]]) -> None:
        pass

    async def run_rows(self, rows: Sequence[Sequence[int]]) -> tuple[list[float], int]:
        self.submits.append(len(rows))
        return [float(sum(row)) for row in rows], 0

    def render_pairs(self, queries: Sequence[str], responses: Sequence[str]) -> list[str]:
        return [q + r for q, r in zip(queries, responses, strict=True)]

    def render_conversations(
        self, conversations: Sequence[Sequence[Mapping[str, str]]]
    ) -> list[str]:
        return ["".join(m["content"] for m in conv) for conv in conversations]

    def encode(self, texts: Sequence[str], *, truncate: bool) -> list[Encoded]:
        return [
            Encoded(input_ids=[ord(c) for c in t], truncated=False, num_tokens=len(t))
            for t in texts
        ]

    def score_batch(self, batch: Sequence[Sequence[int]]) -> list[float]:
        raise AssertionError("a self-scheduling scorer is never called through the batcher")

    def info(self) -> dict[str, object]:
        return {}

    def close(self) -> None:
        pass


def test_an_engine_with_its_own_scheduler_gets_the_rows() -> None:
    scorer = SelfBatchingScorer()
    settings = ServerSettings(model="self-batching", max_queue=100, max_batch_size=8)
    with TestClient(create_app(settings, model=scorer)) as client:
        r = client.post("/score", json={"texts": ["ab", "c"]})
        assert r.status_code == 200, r.text
        assert r.json()["scores"] == [float(ord("a") + ord("b")), float(ord("c"))]
        (served,) = client.app.state.registry.served  # type: ignore[attr-defined]
        own = served.scheduler
        assert isinstance(own, AdmissionScheduler)
        assert not isinstance(own, Batcher)
    assert scorer.submits == [2]
    assert own.limits.max_queue == 100 and own.limits.max_batch_size == 8
    assert reward_threads() == []
