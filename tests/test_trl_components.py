"""RemoteReward(...).components(): one TRL reward function per model of a composite server,
one request per batch, trained with TRL's GRPOTrainer.

The server here is a counterpart at the seam (a small FastAPI app answering the composite
contract of issue 14: /info ``models``, ``components`` in /score). The ``composite_server``
fixture is the only place that knows it: swap it for the real ``reward-server --models``
(counting /score requests from its /metrics) and the tests stay as they are.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from counterparts import Counterpart, responses_of, serving
from datasets import Dataset
from fastapi import FastAPI, Request
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

import tiny_models
from ppo_client.client import RewardClientError
from ppo_client.trl import RemoteReward

NAMES = ("helpful", "safe")


def component_scores(response: str) -> dict[str, float]:
    """The counterpart's models: deterministic functions of the response text."""
    return {"helpful": len(response) / 10, "safe": -float(response.count("e"))}


def composite_app(server: Counterpart) -> FastAPI:
    """/info and /score of a two-model composite server (weights 1 and 1)."""
    app = FastAPI()

    @app.get("/info")
    def info() -> dict[str, Any]:
        models = [{"name": n, "kind": "sequence", "weight": 1.0} for n in NAMES]
        return {"max_client_batch": 64, "models": models, "aggregate": "weighted_sum"}

    @app.post("/score")
    async def score(request: Request) -> dict[str, Any]:
        body = await request.json()
        server.bodies.append(body)
        each = [component_scores(r) for r in responses_of(body)]
        return {
            "scores": [sum(e.values()) for e in each],
            "tokens": [1] * len(each),
            "truncated": [False] * len(each),
            "model": "+".join(NAMES),
            "components": {n: [e[n] for e in each] for n in NAMES},
        }

    return app


@pytest.fixture(scope="module")
def composite_server() -> Iterator[Counterpart]:
    """A composite server of the models NAMES (here the counterpart, in a thread)."""
    server = Counterpart()
    with serving(composite_app(server), server):
        yield server


# ------------------------------------------------------------------- without TRL


class Recorder:
    """Mock transport answering /score like the counterpart, recording bodies."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        each = [component_scores(r) for r in body["responses"]]
        return httpx.Response(
            200,
            json={
                "scores": [sum(e.values()) for e in each],
                "tokens": [1] * len(each),
                "truncated": [False] * len(each),
                "components": {n: [e[n] for e in each] for n in NAMES},
            },
        )


def mocked(recorder: Recorder) -> RemoteReward:
    http = httpx.AsyncClient(transport=httpx.MockTransport(recorder))
    return RemoteReward("http://rm:8000", http_client=http, max_client_batch=64)


PROMPTS = ["p1", "p2", "p3"]
COMPLETIONS = [" nice one", " eh", " three e's"]


def test_components_share_one_request_per_batch() -> None:
    recorder = Recorder()
    funcs = mocked(recorder).components(names=NAMES)
    assert [f.__name__ for f in funcs] == list(NAMES)

    async def batch(completions: list[str]) -> list[list[float]]:
        # TRL awaits its async reward functions together with asyncio.gather.
        return list(await asyncio.gather(*(f(PROMPTS, completions) for f in funcs)))

    async def run() -> None:
        helpful, safe = await batch(COMPLETIONS)
        assert helpful == [component_scores(c)["helpful"] for c in COMPLETIONS]
        assert safe == [component_scores(c)["safe"] for c in COMPLETIONS]
        assert len(recorder.bodies) == 1
        assert recorder.bodies[0]["components"] is True
        # The next batch is a new request; one component called after the other too.
        await batch([c + "!" for c in COMPLETIONS])
        assert len(recorder.bodies) == 2
        for f in funcs:
            await f(PROMPTS, COMPLETIONS)
        assert len(recorder.bodies) == 3

    asyncio.run(run())


def test_an_unknown_component_names_the_known_ones() -> None:
    (func,) = mocked(Recorder()).components(names=["honest"])
    with pytest.raises(RewardClientError, match=r"no component 'honest' \(components: helpful"):
        asyncio.run(func(PROMPTS, COMPLETIONS))


def test_component_names_come_from_the_server_info(composite_server: Counterpart) -> None:
    reward = RemoteReward(composite_server.url)
    funcs = reward.components()
    assert [f.__name__ for f in funcs] == list(NAMES)
    assert reward.component_names() == list(NAMES)
    before = composite_server.score_requests()

    async def run() -> list[list[float]]:
        try:
            return list(await asyncio.gather(*(f(PROMPTS, COMPLETIONS) for f in funcs)))
        finally:
            await reward.aclose()

    outputs = asyncio.run(run())
    assert composite_server.score_requests() == before + 1
    assert outputs[0] == [component_scores(c)["helpful"] for c in COMPLETIONS]


def test_a_server_without_a_models_list_asks_for_names() -> None:
    app = FastAPI()

    @app.get("/info")
    def info() -> dict[str, Any]:
        return {"max_client_batch": 8}  # a server from before composite rewards

    server = Counterpart()
    no_names = pytest.raises(RewardClientError, match=r"lists no models .* pass names=")
    with serving(app, server), no_names:
        RemoteReward(server.url).components()
    assert [f.__name__ for f in RemoteReward(server.url).components(names=["a"])] == ["a"]


# ----------------------------------------------------------------------- with TRL


class Capture:
    """Records each /score request body and answer the reward functions exchange."""

    def __init__(self) -> None:
        self.exchanges: list[tuple[dict[str, Any], dict[str, Any]]] = []

    async def on_response(self, response: httpx.Response) -> None:
        await response.aread()
        if response.request.url.path == "/score" and response.status_code == 200:
            self.exchanges.append((json.loads(response.request.content), response.json()))


def test_grpo_trains_with_one_reward_function_per_component(
    gpt2_policy: Path, composite_server: Counterpart, tmp_path: Path
) -> None:
    capture = Capture()
    http = httpx.AsyncClient(timeout=60, event_hooks={"response": [capture.on_response]})
    funcs = RemoteReward(composite_server.url, http_client=http).components()
    names = [f.__name__ for f in funcs]
    assert len(names) >= 2
    weights = [1.0, 0.5, 0.25][: len(names)]
    config = GRPOConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
        reward_weights=weights,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(gpt2_policy),
        reward_funcs=funcs,
        args=config,
        train_dataset=Dataset.from_dict(
            {"prompt": tiny_models.make_corpus(8, seed=11, min_words=2, max_words=5)}
        ),
        processing_class=AutoTokenizer.from_pretrained(gpt2_policy),
    )
    before = composite_server.score_requests()
    trainer.train()

    # The server saw one /score request per generation batch (one batch per step), each
    # asking for the components.
    assert composite_server.score_requests() - before == 2
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
