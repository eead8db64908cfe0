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
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from datasets import Dataset
from fastapi import FastAPI, Request
from server_proc import free_port
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

import tiny_models
from ppo_client.client import RewardClientError
from ppo_client.trl import RemoteReward

NAMES = ("helpful", "safe")


def component_scores(response: str) -> dict[str, float]:
    """The counterpart's models: deterministic functions of the response text."""
    return {"helpful": len(response) / 10, "safe": -float(response.count("e"))}


@dataclass
class CompositeServer:
    """A composite reward server as the tests see it."""

    url: str
    names: tuple[str, ...]
    bodies: list[dict[str, Any]] = field(default_factory=list)

    def score_requests(self) -> int:
        """How many /score requests the server has answered."""
        return len(self.bodies)


def counterpart_app(server: CompositeServer) -> FastAPI:
    """/info and /score of a two-model composite server (weights 1 and 1)."""
    app = FastAPI()

    @app.get("/info")
    def info() -> dict[str, Any]:
        models = [{"name": n, "kind": "sequence", "weight": 1.0} for n in server.names]
        return {"max_client_batch": 64, "models": models, "aggregate": "weighted_sum"}

    @app.post("/score")
    async def score(request: Request) -> dict[str, Any]:
        body = await request.json()
        server.bodies.append(body)
        responses = body.get("responses") or [c[-1]["content"] for c in body["conversations"]]
        each = [component_scores(r) for r in responses]
        answer: dict[str, Any] = {
            "scores": [sum(e.values()) for e in each],
            "tokens": [len(r) for r in responses],
            "truncated": [False] * len(responses),
            "model": "+".join(server.names),
            "components": {n: [e[n] for e in each] for n in server.names},
        }
        return answer

    return app


@pytest.fixture(scope="module")
def composite_server() -> Iterator[CompositeServer]:
    """The counterpart server on a free port, in a thread of this process."""
    port = free_port()
    server = CompositeServer(f"http://127.0.0.1:{port}", NAMES)
    config = uvicorn.Config(counterpart_app(server), port=port, log_level="warning")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        assert time.monotonic() < deadline, "the counterpart server did not start"
        time.sleep(0.02)
    yield server
    uv.should_exit = True
    thread.join(timeout=10)


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


def test_component_names_come_from_the_server_info(composite_server: CompositeServer) -> None:
    reward = RemoteReward(composite_server.url)
    funcs = reward.components()
    assert [f.__name__ for f in funcs] == list(composite_server.names)
    assert reward.component_names() == list(composite_server.names)
    before = composite_server.score_requests()

    async def run() -> list[list[float]]:
        try:
            return list(await asyncio.gather(*(f(PROMPTS, COMPLETIONS) for f in funcs)))
        finally:
            await reward.aclose()

    outputs = asyncio.run(run())
    assert composite_server.score_requests() == before + 1
    assert outputs[0] == [component_scores(c)["helpful"] for c in COMPLETIONS]


# ----------------------------------------------------------------------- with TRL


def test_grpo_trains_with_one_reward_function_per_component(
    gpt2_policy: Path, composite_server: CompositeServer, tmp_path: Path
) -> None:
    funcs = RemoteReward(composite_server.url).components()
    weights = [1.0, 0.5]
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

    # One /score request per generation batch (one batch per step), asking for components.
    bodies = composite_server.bodies[before:]
    assert len(bodies) == 2 == composite_server.score_requests() - before
    assert all(b["components"] is True and len(b["responses"]) == 4 for b in bodies)
    # TRL logged each component under its name, as the server scored that step's batch.
    steps = [h for h in trainer.state.log_history if "rewards/helpful/mean" in h]
    assert [h["step"] for h in steps] == [1, 2]
    for logged, body in zip(steps, bodies, strict=True):
        each = [component_scores(r) for r in body["responses"]]
        for name in NAMES:
            mean = sum(e[name] for e in each) / len(each)
            assert logged[f"rewards/{name}/mean"] == pytest.approx(mean, abs=1e-5)
        # TRL's reward is its weighted sum of the components.
        total = sum(sum(w * e[n] for n, w in zip(NAMES, weights, strict=True)) for e in each)
        assert logged["reward"] == pytest.approx(total / len(each), abs=1e-5)
