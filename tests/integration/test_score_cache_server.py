"""The score cache in a real server: identical items scored once, repeated ones answered from
the cache exactly as fresh, the per-request and per-server ways to turn it off, and a models
file's entries keyed apart. The cache itself is tested in test_score_cache.py."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers.posting import score
from helpers.servers import serve
from server_proc import ServerProcess, metric, running_server

import tiny_models
from reward_client import RewardClient

HITS = "reward_server_score_cache_hits_total"
MISSES = "reward_server_score_cache_misses_total"
DUPLICATES = "reward_server_score_cache_duplicates_total"
#: Rows run through the model, every model together (the histogram's sum).
ROWS = "reward_server_batch_rows_sum"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A plain --model server of a tiny BERT (default cache), 16 tokens at most."""
    path = tiny_models.save_bert_reward_model(tmp_path_factory.mktemp("bert"))
    with running_server(path, "--max-length", "16", "--max-wait-ms", "1") as proc:
        yield proc


def counts(server: ServerProcess, model: str) -> tuple[float, float, float, float]:
    """Hits, misses and duplicates of ``model``, and rows run, so far."""
    url = server.url
    return (
        metric(url, HITS, model=model),
        metric(url, MISSES, model=model),
        metric(url, DUPLICATES, model=model),
        metric(url, ROWS),
    )


def delta(after: tuple[float, ...], before: tuple[float, ...]) -> tuple[float, ...]:
    return tuple(a - b for a, b in zip(after, before, strict=True))


def test_identical_items_of_a_request_are_scored_once(server: ServerProcess) -> None:
    texts = ["the cat sat", "a dog ran", "the cat sat", "the cat sat", "birds sing"]
    name = score(server, texts=["warm up"])["model"]
    before = counts(server, name)
    body = score(server, texts=texts)
    # Three distinct texts: three rows run, the two repeats copied from the first.
    assert delta(counts(server, name), before) == (0, 3, 2, 3)
    assert body["scores"][0] == body["scores"][2] == body["scores"][3]
    assert body["tokens"][0] == body["tokens"][2] and len(set(body["scores"])) == 3


def test_a_repeated_request_is_answered_from_the_cache_exactly(server: ServerProcess) -> None:
    texts = ["once", "there was a very long text that the server cuts to its limit", "hi"]
    first = score(server, texts=texts)
    assert first["truncated"] == [False, True, False]
    name = first["model"]
    before = counts(server, name)
    again = httpx.post(f"{server.url}/score", json={"texts": texts}, timeout=60)
    # No row ran; the answer is the first one, byte for byte (floats, tokens, flags).
    assert delta(counts(server, name), before) == (3, 0, 0, 0)
    assert again.json() == first
    assert [struct.pack("<d", s) for s in again.json()["scores"]] == [
        struct.pack("<d", s) for s in first["scores"]
    ]
    # A fresh pass of the same request (same batch) gives the same floats.
    fresh = score(server, texts=texts, cache=False)
    assert fresh == first
    assert metric(server.url, "reward_server_score_cache_entries") >= 3
    assert metric(server.url, "reward_server_score_cache_bytes") > 0


def test_cache_false_scores_afresh_and_leaves_the_cache(server: ServerProcess) -> None:
    texts = ["fresh every time", "fresh every time", "and this"]
    name = score(server, texts=["warm up"])["model"]
    before = counts(server, name)
    off = score(server, texts=texts, cache=False)
    # Every item runs, the duplicate too, and the cache is neither read nor filled.
    assert delta(counts(server, name), before) == (0, 0, 0, 3)
    assert score(server, texts=texts[:1])["scores"][0] == pytest.approx(off["scores"][0], abs=1e-5)
    assert delta(counts(server, name), before) == (0, 1, 0, 4)  # that was a miss


def test_the_client_can_bypass_the_cache(server: ServerProcess) -> None:
    texts = ["the client asks", "for fresh scores"]
    name = score(server, texts=texts)["model"]
    before = counts(server, name)
    with RewardClient(server.url) as client:
        cached = client.score_detailed(texts=texts)
        fresh = client.score_detailed(texts=texts, cache=False)
    assert delta(counts(server, name), before) == (2, 0, 0, 2)
    assert fresh.scores == cached.scores


def test_malformed_cache_option_is_a_422_and_the_schema_documents_it(
    server: ServerProcess,
) -> None:
    r = httpx.post(f"{server.url}/score", json={"texts": ["x"], "cache": "no"}, timeout=60)
    assert r.status_code == 422 and "cache" in r.json()["error"]
    schema = httpx.get(f"{server.url}/openapi.json", timeout=60).json()
    cache = schema["components"]["schemas"]["ScoreRequest"]["properties"]["cache"]
    assert cache["type"] == "boolean" and cache["default"] is True
    assert "score cache" in cache["description"]


def test_size_zero_turns_it_off(tmp_path: Path) -> None:
    path = tiny_models.save_bert_reward_model(tmp_path / "bert")
    env = {"REWARD_SERVER_SCORE_CACHE_SIZE": "0"}
    with running_server(path, "--max-wait-ms", "1", env=env) as proc:
        name = score(proc, texts=["warm up"])["model"]
        before = counts(proc, name)
        score(proc, texts=["same", "same"])
        score(proc, texts=["same"])
        assert delta(counts(proc, name), before) == (0, 0, 0, 3)
        assert metric(proc.url, "reward_server_score_cache_entries") == 0


@pytest.fixture(scope="module")
def models_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One tiny BERT served twice (max length 32 and 64) beside a process model."""
    folder = tmp_path_factory.mktemp("models")
    bert = tiny_models.save_bert_reward_model(folder / "bert")
    prm = tiny_models.save_process_reward_model(folder / "prm")
    entries = [
        {"name": "short", "model": str(bert), "max_length": 32},
        {"name": "long", "model": str(bert), "max_length": 64},
        {"name": "prm", "model": str(prm), "kind": "process"},
    ]
    with serve(None, "--max-wait-ms", "1", models=entries, folder=folder) as proc:
        yield proc


def test_another_max_length_misses_and_process_steps_come_back_equal(
    models_server: ServerProcess,
) -> None:
    pairs = {
        "queries": ["what did you think?", "and the film?"],
        "responses": ["it was good\n\nthe end was bad\n\nso: fine", "short\n\nanswer"],
    }
    url = models_server.url
    first = score(models_server, **pairs)
    # The two entries read the same token ids (nothing is cut at 32 tokens), yet each
    # missed: its max length is part of its identity.
    assert set(first["components"]) == {"short", "long", "prm"}
    for name in ("short", "long", "prm"):
        assert (metric(url, HITS, model=name), metric(url, MISSES, model=name)) == (0, 2)
    again = score(models_server, **pairs)
    for name in ("short", "long", "prm"):
        assert (metric(url, HITS, model=name), metric(url, MISSES, model=name)) == (2, 2)
    # Every field, the step scores and their ends included, is the first answer's.
    assert again == first
    assert first["step_scores"] and all(first["step_scores"])
    fresh = score(models_server, **{**pairs, "cache": False})
    assert fresh["step_ends"] == first["step_ends"]
    for got, want in zip(fresh["step_scores"], first["step_scores"], strict=True):
        assert got == pytest.approx(want, abs=1e-6)
    assert fresh["components"]["short"] == pytest.approx(first["components"]["short"], abs=1e-6)
    assert (metric(url, HITS, model="prm"), metric(url, MISSES, model="prm")) == (2, 2)
