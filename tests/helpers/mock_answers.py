"""Answers of a server behind ``httpx.MockTransport`` (a handler: request -> response)."""

from __future__ import annotations

import json
from typing import Any

import httpx


def mock_answer(request: httpx.Request) -> httpx.Response:
    """A well-formed /info or /score answer (every score 1.0)."""
    if request.url.path == "/info":
        return httpx.Response(200, json={"max_client_batch": 2})
    body = json.loads(request.content)
    n = len(body.get("texts") or body.get("queries") or body["conversations"])
    return httpx.Response(
        200, json={"scores": [1.0] * n, "tokens": [1] * n, "truncated": [False] * n}
    )


def tei_answer(request: httpx.Request) -> httpx.Response:
    """TEI's /predict answer, to a request that must hold no labels."""
    body = json.loads(request.content)
    assert "labels" not in body
    return httpx.Response(200, json=[[{"score": 0.5, "label": "LABEL_0"}] for _ in body["inputs"]])


def item_score(item: Any) -> float:
    """Deterministic score of one item of any form."""
    return float(len(json.dumps(item))) / 10


def score_answer(body: dict[str, Any]) -> dict[str, Any]:
    """A /score answer: one score per item, every other item truncated."""
    if "texts" in body:
        items: list[Any] = body["texts"]
    elif "queries" in body:
        items = list(zip(body["queries"], body["responses"], strict=True))
    else:
        items = body["conversations"]
    return {
        "scores": [item_score(i) for i in items],
        "tokens": [7] * len(items),
        "truncated": [i % 2 == 1 for i in range(len(items))],
    }
