"""The score cache (issue 23): the LRU's bounds and exact values, the identity its keys
carry, the coalescing of rows in flight (a real server that scores identical items once,
answers repeated ones from the cache exactly as it answered them fresh, and scores afresh
when a request says ``"cache": false``: test_score_cache_server.py)."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from helpers.judges import TEMPLATE, YES_NO, save_judge
from helpers.models_files import write_models

from reward_server.config import ServerSettings
from reward_server.config.models_file import parse_entry
from reward_server.http.app import create_app
from reward_server.scoring.items import Texts
from reward_server.scoring.metrics import Metrics
from reward_server.scoring.score_cache import (
    ENTRY_OVERHEAD_BYTES,
    MISS,
    ModelIdentity,
    ScoreCache,
    caches_kind,
    local_fingerprint,
    model_identity,
)
from reward_server.scoring.served import ServingContext, served_model_for
from reward_server.text.rendering import Encoded

DIGEST = b"m" * 32


def entry(**keys: Any) -> Any:
    """One models-file entry, as the class of its kind."""
    return parse_entry(keys)


def size_of(ids: list[int], payload: int) -> int:
    """What the cache counts for an entry of ``ids`` (4 bytes each) with ``payload`` bytes."""
    return len(ScoreCache.key(DIGEST, ids)) + payload + ENTRY_OVERHEAD_BYTES


# ---------------------------------------------------------------------- the LRU


def test_the_entry_bound_evicts_the_least_recently_used() -> None:
    cache = ScoreCache(max_entries=2, max_bytes=10**6)
    a, b, c = (ScoreCache.key(DIGEST, [n]) for n in (1, 2, 3))
    cache.put(a, 1.0)
    cache.put(b, 2.0)
    assert cache.get(a) == 1.0  # a is now the most recently used: b goes first
    cache.put(c, 3.0)
    assert cache.get(b) is MISS
    assert (cache.get(a), cache.get(c), cache.entries) == (1.0, 3.0, 2)
    cache.put(a, 4.0)  # a replaced in place: still two entries, its new value
    assert (cache.get(a), cache.entries) == (4.0, 2)


def test_the_byte_bound_counts_ids_values_and_overhead() -> None:
    ids = [[7] * 10, [8] * 10, [9] * 10]
    row = [0.5] * 4
    one = size_of(ids[0], 8 * len(row))
    cache = ScoreCache(max_entries=100, max_bytes=2 * one + one // 2)
    cache.put(ScoreCache.key(DIGEST, ids[0]), row)
    cache.put(ScoreCache.key(DIGEST, ids[1]), row)
    assert (cache.entries, cache.bytes) == (2, 2 * one)
    cache.put(ScoreCache.key(DIGEST, ids[2]), row)  # a third would pass the bound
    assert (cache.entries, cache.bytes) == (2, 2 * one)
    assert cache.get(ScoreCache.key(DIGEST, ids[0])) is MISS
    assert cache.get(ScoreCache.key(DIGEST, ids[2])) == row
    # A value larger than the whole bound is not kept, and evicts nothing.
    assert not cache.put(ScoreCache.key(DIGEST, [1]), [0.0] * 1000)
    assert cache.entries == 2
    cache.clear()
    assert (cache.entries, cache.bytes) == (0, 0)


def test_values_come_back_bit_for_bit_and_cannot_be_changed_from_outside() -> None:
    cache = ScoreCache(max_entries=10, max_bytes=10**6)
    odd = [0.1 + 0.2, 5e-324, -0.0, 1.7976931348623157e308, -3.4028234663852886e38]
    for i, value in enumerate(odd):
        cache.put(ScoreCache.key(DIGEST, [i]), value)
        got = cache.get(ScoreCache.key(DIGEST, [i]))
        assert type(got) is float and struct.pack("<d", got) == struct.pack("<d", value)
    key = ScoreCache.key(DIGEST, [99])
    cache.put(key, list(odd))
    row = cache.get(key)
    assert [struct.pack("<d", v) for v in row] == [struct.pack("<d", v) for v in odd]
    row[0] = 42.0  # the caller's list, not the cache's
    assert cache.get(key) == odd
    cache.put(ScoreCache.key(DIGEST, [100]), "Score: 7")
    assert cache.get(ScoreCache.key(DIGEST, [100])) == "Score: 7"


def test_what_is_not_kept() -> None:
    off = ScoreCache(max_entries=0, max_bytes=10**6)
    assert not off.enabled and not off.put(ScoreCache.key(DIGEST, [1]), 1.0)
    cache = ScoreCache(max_entries=10, max_bytes=10**6)
    # Other types would come back changed (an int as a float): scored afresh instead.
    assert not cache.put(ScoreCache.key(DIGEST, [1]), 1)  # type: ignore[arg-type]
    assert not cache.put(ScoreCache.key(DIGEST, [2]), [1.0, 2])  # type: ignore[list-item]
    assert cache.entries == 0
    with pytest.raises(ValueError, match="non-negative"):
        ScoreCache(max_entries=-1, max_bytes=1)


def test_keys_are_the_exact_ids_of_one_model() -> None:
    assert ScoreCache.key(DIGEST, [1, 2]) != ScoreCache.key(DIGEST, [2, 1])
    assert ScoreCache.key(DIGEST, [1, 2]) != ScoreCache.key(b"n" * 32, [1, 2])
    assert ScoreCache.key(DIGEST, [1, 2]) != ScoreCache.key(DIGEST, [1, 2, 0])
    # Ids beyond 32 bits take 8 bytes each, under another type code.
    assert ScoreCache.key(DIGEST, [2**40]) != ScoreCache.key(DIGEST, [0, 256])


# ---------------------------------------------------------------------- identity


def identity(**changes: Any) -> ModelIdentity:
    base: dict[str, Any] = {
        "model": "org/rm",
        "revision": "commit:" + "a" * 40,
        "adapter": None,
        "adapter_revision": None,
        "engine": "reward_server.engines.transformers.RewardModel",
        "facts": json.dumps({"scorer": {"max_length": 512, "dtype": "float32"}}),
    }
    return ModelIdentity(**{**base, **changes})


def test_another_revision_engine_or_max_length_misses() -> None:
    cache = ScoreCache(max_entries=10, max_bytes=10**6)
    ids = [101, 7, 102]
    cache.put(ScoreCache.key(identity().digest(), ids), 0.25)
    assert cache.get(ScoreCache.key(identity().digest(), ids)) == 0.25
    others = [
        identity(revision="commit:" + "b" * 40),
        identity(adapter="my/lora", adapter_revision="commit:" + "c" * 40),
        identity(engine="reward_server.engines.vllm.VllmScorer"),
        identity(facts=json.dumps({"scorer": {"max_length": 256, "dtype": "float32"}})),
        identity(facts=json.dumps({"scorer": {"max_length": 512, "dtype": "bfloat16"}})),
    ]
    for other in others:
        assert cache.get(ScoreCache.key(other.digest(), ids)) is MISS, other


def test_a_local_folder_is_told_by_its_files(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "config.json").write_text("{}")
    before = local_fingerprint(tmp_path)
    assert before.startswith("files:") and local_fingerprint(tmp_path) == before
    (tmp_path / "model.safetensors").write_bytes(b"weights, retrained")
    assert local_fingerprint(tmp_path) != before

    spec = entry(name="rm", model=str(tmp_path))
    info = {"model": str(tmp_path), "max_length": 512, "label_index": 0}
    one = model_identity(spec, info, "engine")
    assert one.revision == local_fingerprint(tmp_path) and one.model == str(tmp_path.resolve())
    assert model_identity(spec, info, "engine").digest() == one.digest()
    # Presentation does not count; what changes a score does.
    renamed = spec.model_copy(update={"name": "other", "weight": 2.0})
    assert model_identity(renamed, info, "engine").digest() == one.digest()
    for changed_info in ({**info, "max_length": 256}, {**info, "label_index": 1}):
        assert model_identity(spec, changed_info, "engine").digest() != one.digest()
    steps = entry(name="rm", model=str(tmp_path), kind="process", step_aggregate="mean")
    assert model_identity(steps, info, "engine").digest() != one.digest()


def test_which_kinds_are_cached() -> None:
    judge = {"kind": "judge", "model": "m", "template": "{{ response }}"}
    generate = {**judge, "mode": "generate", "score_pattern": r"(\d+)"}
    assert caches_kind(entry(name="a", model="m"))
    assert caches_kind(entry(name="a", model="m", kind="process"))
    assert caches_kind(entry(name="a", **judge, score_tokens={"Yes": 1.0, "No": 0.0}))
    assert caches_kind(entry(name="a", **generate))  # greedy: one answer per prompt
    assert not caches_kind(entry(name="a", **generate, temperature=0.7))
    assert not caches_kind(entry(name="a", kind="verifier", verifier="exact"))
    assert not caches_kind(entry(name="a", kind="remote", url="http://x:1"))


# ---------------------------------------------------------------------- requests in flight


class HeldRows:
    """The engine's rows (the seam): records each request's rows and holds them until
    released; a row's score is the sum of its ids."""

    def __init__(self) -> None:
        self.calls: list[list[list[int]]] = []
        self.release = asyncio.Event()

    async def run_rows(self, rows: Sequence[Sequence[int]]) -> tuple[list[float], int]:
        self.calls.append([list(row) for row in rows])
        await self.release.wait()
        return [float(sum(row)) for row in rows], 0


class CharScorer:
    """A scorer that batches by itself (a RowRunner, held by :class:`HeldRows`); one token
    per character."""

    name = "chars"
    device = "cpu"
    max_length = 64

    def __init__(self) -> None:
        self.held = HeldRows()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.errored = False

    def check_rows(self, rows: Sequence[Sequence[int]]) -> None:
        pass

    async def run_rows(self, rows: Sequence[Sequence[int]]) -> tuple[list[float], int]:
        return await self.held.run_rows(rows)

    def encode(
        self, texts: Sequence[str], *, truncate: bool, max_length: int | None = None
    ) -> list[Encoded]:
        return [Encoded([ord(c) for c in text], False, len(text)) for text in texts]

    def info(self) -> dict[str, object]:
        return {"model": "chars", "max_length": self.max_length}

    def close(self) -> None:
        pass


def ids(text: str) -> list[int]:
    return [ord(c) for c in text]


async def _until(condition: Callable[[], bool]) -> None:
    """Let the other tasks run until ``condition()`` holds (bounded by the caller)."""
    while not condition():
        await asyncio.sleep(0.001)


def _coalescing(cancel_owner: bool) -> tuple[list[list[list[int]]], dict[str, float], list[Any]]:
    """Request A scores x and y; while its pass is held, B asks for y and z. Returns the
    submits, B's counters and B's results (A's too unless cancelled)."""

    async def scenario() -> tuple[list[list[list[int]]], dict[str, float], list[Any]]:
        scorer = CharScorer()
        model = served_model_for(entry(name="chars", model="chars"), scorer)  # type: ignore[arg-type]
        with ThreadPoolExecutor(1) as pool:
            metrics = Metrics()
            cache = ScoreCache(max_entries=100, max_bytes=10**6)
            ctx = ServingContext(pool, pool, ServerSettings(model="m"), metrics, score_cache=cache)
            await model.start(ctx)
            calls = scorer.held.calls
            a = asyncio.create_task(
                model.score(Texts(("xx", "yy")), truncate=True, max_tokens=None)
            )
            await asyncio.wait_for(_until(lambda: len(calls) == 1), 30)
            b = asyncio.create_task(
                model.score(Texts(("yy", "zz")), truncate=True, max_tokens=None)
            )
            await asyncio.wait_for(_until(lambda: len(calls) == 2), 30)
            if cancel_owner:
                a.cancel()
            scorer.held.release.set()
            results = list(await asyncio.wait_for(b, 30))
            if not cancel_owner:
                results = list(await a) + results
            counts = {
                what: metrics.registry.get_sample_value(
                    f"reward_server_score_cache_{what}_total", {"model": "chars"}
                )
                or 0.0
                for what in ("hits", "misses", "duplicates")
            }
            return calls, counts, results

    return asyncio.run(scenario())


def test_a_row_in_flight_is_scored_once_for_every_request() -> None:
    calls, counts, results = _coalescing(cancel_owner=False)
    # B did not send y again: it waited for A's pass.
    assert calls == [[ids("xx"), ids("yy")], [ids("zz")]]
    assert [r.score for r in results] == [240.0, 242.0, 242.0, 244.0]
    assert counts == {"hits": 0.0, "misses": 3.0, "duplicates": 1.0}


def test_when_the_owner_goes_away_the_waiter_scores_the_row_itself() -> None:
    calls, counts, results = _coalescing(cancel_owner=True)
    assert calls == [[ids("xx"), ids("yy")], [ids("zz")], [ids("yy")]]
    assert [r.score for r in results] == [242.0, 244.0]
    assert counts == {"hits": 0.0, "misses": 2.0, "duplicates": 0.0}


# ---------------------------------------------------------------------- a real server


def test_the_env_vars_reach_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REWARD_SERVER_SCORE_CACHE_BYTES", "1234")
    settings = ServerSettings(model="m")
    assert settings.score_cache_bytes == 1234 and settings.score_cache_size == 65536
    monkeypatch.setenv("REWARD_SERVER_SCORE_CACHE_BYTES", "0")
    with pytest.raises(ValueError, match="score_cache_bytes"):
        ServerSettings(model="m")


def test_a_logprobs_judge_is_cached_and_a_sampling_judge_is_not(tmp_path: Path) -> None:
    folder = save_judge(tmp_path / "judge", "gpt2")
    judge = {"kind": "judge", "model": str(folder), "template": TEMPLATE}
    entries = [
        {"name": "logprobs", **judge, "score_tokens": YES_NO},
        {**judge, "name": "sampled", "mode": "generate", "score_pattern": r"(\d)"}
        | {"max_new_tokens": 2, "temperature": 0.7, "on_error": 0.0},
    ]
    path = write_models(tmp_path, entries)
    body = {"queries": ["2+2?", "2+2?"], "responses": ["4", "4"], "labels": ["4", "4"]}

    def rows(client: TestClient, name: str) -> float:
        text = client.get("/metrics").text
        line = f'reward_server_model_batch_rows_sum{{model="{name}"}} '
        return float(next(s for s in text.splitlines() if s.startswith(line)).split()[-1])

    with TestClient(create_app(ServerSettings(models=str(path), max_wait_ms=1.0))) as client:
        first = client.post("/score", json=body)
        assert first.status_code == 200, first.text
        again = client.post("/score", json=body).json()
        # The logprobs judge ran one row for the two identical items, then none; the
        # sampling judge drew a sample for each item of each request.
        assert (rows(client, "logprobs"), rows(client, "sampled")) == (1.0, 4.0)
        assert again["components"]["logprobs"] == first.json()["components"]["logprobs"]
        metrics = client.get("/metrics").text
        assert 'reward_server_score_cache_hits_total{model="logprobs"} 2.0' in metrics
        assert 'model="sampled"' not in "".join(
            line for line in metrics.splitlines() if line.startswith("reward_server_score_cache")
        )
