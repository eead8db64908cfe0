"""This server's vLLM shapes checked against the installed vLLM's own response models, field for
field (importing vLLM starts processes: its platform probe). The shapes themselves, the
numbers and the errors are in test_protocols_server.py."""

from __future__ import annotations

import importlib.util
from typing import Any

from fastapi.testclient import TestClient
from helpers.posting import post
from helpers.protocols import TEXTS
from pydantic import BaseModel
from server_proc import require_counterpart


def same_fields(body: Any, parsed: Any, where: str = "body") -> None:
    if isinstance(parsed, BaseModel):
        assert isinstance(body, dict), where
        assert set(body) == set(type(parsed).model_fields), (where, sorted(body))
        assert not parsed.model_extra, (where, parsed.model_extra)
        for name, value in body.items():
            same_fields(value, getattr(parsed, name), f"{where}.{name}")
    elif isinstance(parsed, list) and isinstance(body, list):
        for i, (b, p) in enumerate(zip(body, parsed, strict=True)):
            same_fields(b, p, f"{where}[{i}]")


def vllm_protocol() -> Any:
    """vLLM's own response models (pydantic), from the installed vLLM; a skip without vLLM
    unless ``REWARD_SERVER_TEST_VLLM=1`` (``make test``) makes its absence a failure."""
    require_counterpart(
        importlib.util.find_spec("vllm") is not None, "REWARD_SERVER_TEST_VLLM", "vLLM"
    )
    from vllm.entrypoints.pooling.classify.protocol import ClassificationResponse
    from vllm.entrypoints.pooling.pooling.protocol import PoolingResponse
    from vllm.entrypoints.serve.engine.protocol import ErrorResponse

    return ClassificationResponse, PoolingResponse, ErrorResponse


def assert_vllm_body(body: Any, model_cls: type[BaseModel]) -> None:
    """``body`` is what vLLM's ``model_cls`` sends: it validates, every object has exactly
    the model's fields (vLLM's models allow extra keys, so validation alone would not say),
    and dumping the parsed model gives the body back (same values and JSON types)."""
    parsed = model_cls.model_validate(body)
    same_fields(body, parsed)
    assert parsed.model_dump(mode="json") == body


def test_bodies_are_vllms_own_response_models(
    gpt2_app: TestClient,
) -> None:
    classification, pooling_response, error_response = vllm_protocol()
    classify = post(gpt2_app, "/classify", {"input": TEXTS[:2]})
    assert_vllm_body(classify, classification)
    assert classify["object"] == "list" and classify["id"].startswith("classify-")
    pooling = post(gpt2_app, "/pooling", {"input": TEXTS[:2]})
    assert_vllm_body(pooling, pooling_response)
    assert pooling["data"][0]["object"] == "pooling" and pooling["id"].startswith("pool-")
    tokens = post(gpt2_app, "/score", {"texts": TEXTS[:2]})["tokens"]
    assert classify["usage"]["prompt_tokens"] == classify["usage"]["total_tokens"] == sum(tokens)
    missing = gpt2_app.post("/classify", json={"model": "not-served", "input": "a"})
    assert missing.status_code == 404
    assert_vllm_body(missing.json(), error_response)
    assert missing.json()["error"]["param"] == "model"
