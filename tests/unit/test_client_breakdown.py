"""The clients and a composite server's breakdown: request fields, parsing, merging chunks."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from reward_client import (
    AsyncRewardClient,
    RewardClient,
    RewardClientError,
    RewardServerError,
    ScoreResult,
)

URL = "http://rm:8000"
MODELS = ("helpful", "safe")


def texts_of(body: dict[str, Any]) -> list[str]:
    if "texts" in body:
        return body["texts"]
    if "queries" in body:
        return [q + r for q, r in zip(body["queries"], body["responses"], strict=True)]
    return [json.dumps(c) for c in body["conversations"]]


def composite_answer(body: dict[str, Any]) -> dict[str, Any]:
    """A composite server's answer: two models, a two-label head and a process model whose
    steps end at each space of the item."""
    items = texts_of(body)
    helpful = [float(len(t)) for t in items]
    safe = [-float(t.count("a")) for t in items]
    ends = [[i + 1 for i, ch in enumerate(t) if ch == " "] + [len(t)] for t in items]
    return {
        "scores": [h + s for h, s in zip(helpful, safe, strict=True)],
        "tokens": [len(t) for t in items],
        "truncated": [False] * len(items),
        "model": "helpful+safe",
        "components": {"helpful": helpful, "safe": safe},
        "objectives": {"helpful/x": helpful, "helpful/y": [h / 2 for h in helpful]},
        "step_scores": [[k / 10 for k in range(len(e))] for e in ends],
        "step_ends": ends,
        "steps_dropped": [0] * len(items),
        "outcome_scores": helpful,
    }


class Server:
    """Mock transport: records /score bodies; ``edit`` may spoil an answer."""

    def __init__(self, edit: Any = None) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.edit = edit

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        answer = composite_answer(body)
        if self.edit is not None:
            self.edit(answer, len(self.bodies))
        return httpx.Response(200, json=answer)


def client(server: Server, **options: Any) -> RewardClient:
    http = httpx.Client(transport=httpx.MockTransport(server))
    return RewardClient(URL, http_client=http, max_client_batch=2, **options)


TEXTS = ["a b", "abc def g", "x", "a a a", "long one here"]


def test_breakdown_of_chunks_merges_in_input_order() -> None:
    server = Server()
    result = client(server).score_detailed(texts=TEXTS, model="helpful", components=True)
    whole = composite_answer({"texts": TEXTS})  # what one answer for all items would say
    assert result.scores == whole["scores"]
    assert result.components == whole["components"]
    assert result.objectives == whole["objectives"]
    assert result.step_scores == whole["step_scores"]
    assert result.step_ends == whole["step_ends"]
    assert result.steps_dropped == whole["steps_dropped"]
    assert result.outcome_scores == whole["outcome_scores"]
    # Three chunks of at most 2 items, each asking for the model and the components.
    assert [b["texts"] for b in server.bodies] == [TEXTS[:2], TEXTS[2:4], TEXTS[4:]]
    assert all(b["model"] == "helpful" and b["components"] is True for b in server.bodies)


def test_plain_answers_leave_the_breakdown_none_and_send_no_fields() -> None:
    def plain(answer: dict[str, Any], _: int) -> None:
        for key in list(answer):
            if key not in ("scores", "tokens", "truncated"):
                del answer[key]

    server = Server(plain)
    result = client(server).score_pairs_detailed(["q1", "q2", "q3"], ["r1", "r2", "r3"])
    assert result.components is None and result.objectives is None
    assert result.step_scores is None and result.step_ends is None
    assert result.steps_dropped is None and result.outcome_scores is None
    assert all(set(b) == {"queries", "responses"} for b in server.bodies)
    # Null counts as absent.
    server = Server(lambda a, _: a.update(components=None, step_scores=None, step_ends=None))
    result = client(server).score_detailed(texts=TEXTS)
    assert result.components is None and result.step_scores is None
    assert result.objectives is not None


def test_pairs_with_model_and_components() -> None:
    server = Server()
    result = client(server).score_pairs_detailed(["q"], [" a b"], model="safe", components=True)
    assert server.bodies == [
        {"queries": ["q"], "responses": [" a b"], "model": "safe", "components": True}
    ]
    assert result.components == {"helpful": [5.0], "safe": [-1.0]}  # "q a b"


@pytest.mark.parametrize(
    ("spoil", "complaint"),
    [
        (lambda a: a["components"].update(safe=[1.0]), "components['safe'] is not a list of 2"),
        (lambda a: a["components"].update(safe=[1.0, True]), "components['safe'][1] is True"),
        (lambda a: a.update(components=[1.0, 2.0]), "components is not an object"),
        (lambda a: a["objectives"].update(z="x"), "objectives['z'] is not a list"),
        (lambda a: a.update(step_scores=[[0.1]]), "step_scores is not a list of 2 lists"),
        (lambda a: a["step_ends"][0].append(99), "1 step_scores but 2 step_ends"),
        (lambda a: a.update(step_scores=[[0, 1], [0]], step_ends=[[2, 1], [1]]), "not in order"),
        (lambda a: a["step_ends"].__setitem__(1, [-1]), "step_ends[1][0] is -1, not a count"),
        (lambda a: a.pop("step_ends"), "step_scores and step_ends come together"),
        (lambda a: a.update(steps_dropped=[0, True]), "steps_dropped[1] is True"),
        (lambda a: a.update(outcome_scores=[1.0]), "outcome_scores is not a list of 2"),
    ],
)
def test_malformed_breakdowns_are_invalid_responses(spoil: Any, complaint: str) -> None:
    def edit(answer: dict[str, Any], _: int) -> None:
        answer["step_scores"] = [[0.5], [0.25]]
        answer["step_ends"] = [[1], [1]]
        spoil(answer)

    with pytest.raises(RewardServerError, match="invalid response") as info:
        client(Server(edit)).score_detailed(texts=["a", "b"])
    assert complaint in str(info.value)


def test_chunks_that_disagree_on_the_breakdown_are_an_error() -> None:
    def second_without(answer: dict[str, Any], n: int) -> None:
        if n == 2:
            del answer["components"]

    with pytest.raises(RewardClientError, match="some chunks' answers have components"):
        client(Server(second_without)).score_detailed(texts=TEXTS)

    def renamed(answer: dict[str, Any], n: int) -> None:
        if n == 2:
            answer["components"] = {"other": answer["components"]["safe"]}

    with pytest.raises(RewardClientError, match="name different components"):
        client(Server(renamed)).score_detailed(texts=TEXTS)


def test_request_fields_are_checked() -> None:
    c = client(Server())
    with pytest.raises(TypeError, match="model must be a model name"):
        c.score_detailed(texts=["a"], model="")
    with pytest.raises(TypeError, match="components must be a bool"):
        c.score_detailed(texts=["a"], components="yes")  # type: ignore[typeddict-item]


def test_async_client_carries_the_breakdown() -> None:
    server = Server()

    async def run() -> ScoreResult:
        http = httpx.AsyncClient(transport=httpx.MockTransport(server))
        async with AsyncRewardClient(URL, http_client=http, max_client_batch=2) as c:
            return await c.score_detailed(
                conversations=[[{"role": "user", "content": "hi a"}]] * 3, components=True
            )

    result = asyncio.run(run())
    assert result.components is not None and len(result.components["safe"]) == 3
    assert result.step_ends is not None and len(result.step_ends) == 3
    assert [b.get("components") for b in server.bodies] == [True, True]


def test_other_protocols_take_no_model_and_give_no_breakdown() -> None:
    def tei(request: httpx.Request) -> httpx.Response:
        inputs = json.loads(request.content)["inputs"]
        return httpx.Response(200, json=[[{"score": 1.0, "label": "LABEL_0"}] for _ in inputs])

    http = httpx.Client(transport=httpx.MockTransport(tei))
    with RewardClient(URL, http_client=http, protocol="tei", max_client_batch=4) as c:
        result = c.score_detailed(texts=["a", "b"])
        assert result.scores == [1.0, 1.0]
        assert result.components is None and result.step_scores is None
        with pytest.raises(ValueError, match="protocol 'tei' cannot take model="):
            c.score_detailed(texts=["a"], model="helpful")
