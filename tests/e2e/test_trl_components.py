"""RemoteReward(...).components(): one TRL reward function per model of a composite server,
one request per batch, trained with TRL's GRPOTrainer.

The server is the real ``reward-server --models`` (uvicorn in a subprocess) serving two tiny
reward models with different tokenizers: ``helpful``, a BERT WordPiece model, and ``safe``, a
GPT-2 byte-level BPE model. Expected scores are the server's own answers; requests are
counted from its /metrics.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from counterparts import Counterpart, serving
from datasets import Dataset
from fastapi import FastAPI
from helpers.servers import serve
from helpers.training import ScoreCapture, grpo_config, grpo_trainer
from server_proc import ServerProcess, metric, score_requests
from transformers import AutoModelForCausalLM, AutoTokenizer

import tiny_models
from reward_client import RewardClientError, ScoreResult
from reward_client.integrations.trl import RemoteReward, RewardComponent

NAMES = ("helpful", "safe")
PROMPTS = ["p1", "p2", "p3"]
COMPLETIONS = [" nice one", " eh", " three e's"]


@pytest.fixture(scope="module")
def composite_server(
    bert_rm: Path, gpt2_rm: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """``reward-server --models`` with ``helpful`` (BERT) and ``safe`` (GPT-2, weight 0.5)."""
    models = [
        {"name": "helpful", "model": str(bert_rm)},
        {"name": "safe", "model": str(gpt2_rm), "weight": 0.5},
    ]
    folder = tmp_path_factory.mktemp("composite")
    top = {"aggregate": "weighted_sum"}
    with serve(None, "--max-wait-ms", "1", models=models, top=top, folder=folder) as server:
        yield server


def items_by_model(server: ServerProcess) -> dict[str, float]:
    """Items each model scored so far (``reward_server_model_items_total``)."""
    return {n: metric(server.url, "reward_server_model_items_total", model=n) for n in NAMES}


def breakdown(server: ServerProcess, prompts: list[str], completions: list[str]) -> ScoreResult:
    """The server's own answer with components, asked directly."""

    async def ask() -> ScoreResult:
        reward = RemoteReward(server.url)
        try:
            return await reward.score_detailed(prompts, completions, components=True)
        finally:
            await reward.aclose()

    return asyncio.run(ask())


def columns(answer: ScoreResult) -> list[Any]:
    """The answer's component columns in NAMES order, to compare within 1e-5."""
    assert answer.components is not None
    return [pytest.approx(answer.components[n], abs=1e-5) for n in NAMES]


async def call_together(
    funcs: Sequence[RewardComponent], prompts: list[str], completions: list[str]
) -> list[list[float]]:
    """Await the component functions together, as TRL does with async reward functions."""
    return list(await asyncio.gather(*(f(prompts, completions) for f in funcs)))


# ------------------------------------------------------------------- without TRL


def test_components_share_one_request_per_batch(composite_server: ServerProcess) -> None:
    second = [c + "!" for c in COMPLETIONS]
    expected = [breakdown(composite_server, PROMPTS, c) for c in (COMPLETIONS, second)]
    for answer in expected:
        assert answer.components is not None and set(answer.components) == set(NAMES)
        # The server's aggregate is its weighted sum; the components are each model's own.
        helpful, safe = (answer.components[n] for n in NAMES)
        combined = [h + 0.5 * s for h, s in zip(helpful, safe, strict=True)]
        assert answer.scores == pytest.approx(combined, abs=1e-5)
    capture = ScoreCapture()
    http = httpx.AsyncClient(timeout=60, event_hooks={"response": [capture.on_response]})
    funcs = RemoteReward(composite_server.url, http_client=http).components(names=NAMES)
    assert [f.__name__ for f in funcs] == list(NAMES)

    async def run() -> None:
        try:
            first = await call_together(funcs, PROMPTS, COMPLETIONS)
            assert first == columns(expected[0])
            assert len(capture.exchanges) == 1
            assert capture.exchanges[0][0]["components"] is True
            # The next batch is a new request; one component called after the other too.
            again = await call_together(funcs, PROMPTS, second)
            assert again == columns(expected[1])
            assert len(capture.exchanges) == 2
            for f in funcs:
                await f(PROMPTS, COMPLETIONS)
            assert len(capture.exchanges) == 3
        finally:
            await http.aclose()

    before = score_requests(composite_server.url)
    asyncio.run(run())
    assert score_requests(composite_server.url) - before == 3


def test_an_unknown_component_names_the_known_ones(composite_server: ServerProcess) -> None:
    reward = RemoteReward(composite_server.url)
    (func,) = reward.components(names=["honest"])

    async def run() -> list[float]:
        try:
            return await func(PROMPTS, COMPLETIONS)
        finally:
            await reward.aclose()

    with pytest.raises(
        RewardClientError, match=r"no component 'honest' \(components: helpful, safe\)"
    ):
        asyncio.run(run())


def test_component_names_come_from_the_server_info(composite_server: ServerProcess) -> None:
    reward = RemoteReward(composite_server.url)
    funcs = reward.components()
    assert [f.__name__ for f in funcs] == list(NAMES)
    assert reward.component_names() == list(NAMES)
    expected = breakdown(composite_server, PROMPTS, COMPLETIONS)
    before, items = score_requests(composite_server.url), items_by_model(composite_server)

    async def run() -> list[list[float]]:
        try:
            return await call_together(funcs, PROMPTS, COMPLETIONS)
        finally:
            await reward.aclose()

    outputs = asyncio.run(run())
    assert score_requests(composite_server.url) == before + 1
    # Each model scored the batch once.
    after = items_by_model(composite_server)
    assert {n: after[n] - items[n] for n in NAMES} == {n: len(PROMPTS) for n in NAMES}
    assert outputs == columns(expected)


def test_a_server_without_a_models_list_asks_for_names() -> None:
    # A server from before composite rewards: its /info has no "models" (the real server
    # always lists them, so this one is a stand-in).
    app = FastAPI()

    @app.get("/info")
    def info() -> dict[str, Any]:
        return {"max_client_batch": 8}

    server = Counterpart()
    no_names = pytest.raises(RewardClientError, match=r"lists no models .* pass names=")
    with serving(app, server), no_names:
        RemoteReward(server.url).components()
    assert [f.__name__ for f in RemoteReward(server.url).components(names=["a"])] == ["a"]


# ----------------------------------------------------------------------- with TRL


def test_grpo_trains_with_one_reward_function_per_component(
    gpt2_policy: Path, composite_server: ServerProcess, tmp_path: Path
) -> None:
    capture = ScoreCapture()
    http = httpx.AsyncClient(timeout=60, event_hooks={"response": [capture.on_response]})
    funcs = RemoteReward(composite_server.url, http_client=http).components()
    names = [f.__name__ for f in funcs]
    assert names == list(NAMES)
    # TRL's own weights, not the server's (helpful 1.0, safe 0.5): TRL gets raw components.
    weights = [1.0, 0.25]
    config = grpo_config(tmp_path, reward_weights=weights)
    trainer = grpo_trainer(
        model=AutoModelForCausalLM.from_pretrained(gpt2_policy),
        reward_funcs=funcs,
        args=config,
        train_dataset=Dataset.from_dict(
            {"prompt": tiny_models.make_corpus(8, seed=11, min_words=2, max_words=5)}
        ),
        processing_class=AutoTokenizer.from_pretrained(gpt2_policy),
    )
    before, items = score_requests(composite_server.url), items_by_model(composite_server)
    trainer.train()

    # The server saw one /score request per generation batch (one batch of 4 per step),
    # each asking for the components, and each model scored every completion once.
    assert score_requests(composite_server.url) - before == 2
    after = items_by_model(composite_server)
    assert {n: after[n] - items[n] for n in NAMES} == {n: 8 for n in NAMES}
    assert len(capture.exchanges) == 2
    assert all(body["components"] is True for body, _ in capture.exchanges)
    # TRL logged each component under its name, as the server scored that step's batch,
    # and its reward as its weighted sum of them.
    steps = [h for h in trainer.state.log_history if f"rewards/{names[0]}/mean" in h]
    assert [h["step"] for h in steps] == [1, 2]
    for logged, (_, answer) in zip(steps, capture.exchanges, strict=True):
        columns = answer["components"]
        assert set(columns) == set(names) and len(columns[names[0]]) == 4
        for name in names:
            mean = sum(columns[name]) / 4
            assert logged[f"rewards/{name}/mean"] == pytest.approx(mean, rel=1e-5, abs=1e-5)
        total = sum(w * sum(columns[n]) for n, w in zip(names, weights, strict=True)) / 4
        assert logged["reward"] == pytest.approx(total, rel=1e-5, abs=1e-5)
