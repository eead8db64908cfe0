"""A model grader answered by a remote OpenAI-compatible chat endpoint (issue 50, item 1: a
``kind: remote`` entry with ``protocol: openai-chat``), against a fake endpoint at the HTTP
seam (an httpx MockTransport behind the remote entry's real client, seats and admission):
the request carries the templated messages, the JSON instruction and the leaf's
``sampling_params``; the reply is parsed and clipped, a reply that is not the JSON is a
``model_grader_parse_error``, a failing endpoint a ``model_grader_server_error``.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from reward_server.config import ServerSettings
from reward_server.config.graders import parse_grader
from reward_server.config.models_file import parse_models_file
from reward_server.scoring.grader_judges import GraderJudges
from reward_server.scoring.metrics import Metrics
from reward_server.scoring.remote_model import RemoteModel, load_remote
from reward_server.scoring.served import ServingContext
from reward_server.verifiers.graders.errors import GradeFailure
from reward_server.verifiers.graders.templates import build_sample

ENTRY = {
    "name": "remote-judge",
    "kind": "remote",
    "url": "http://judge.test",
    "protocol": "openai-chat",
    "remote_model": "judge-lm",
    "template": "unused: {{ response }}",
    "score_pattern": r"(\d+)",
    "max_new_tokens": 16,
    "call_timeout_s": 1,
}
LEAF = {
    "type": "score_model",
    "name": "tone",
    "model": "o3-mini",
    "input": [{"role": "developer", "content": "Rate {{ sample.output_text }} for {{ item.who }}"}],
    "range": [1, 7],
    "sampling_params": {"temperature": 0.5, "seed": 3, "max_completions_tokens": 40},
}


def test_a_remote_chat_endpoint_answers_a_score_model() -> None:
    requests: list[dict[str, Any]] = []

    def endpoint(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        requests.append(body)
        text = body["messages"][0]["content"]
        if "fails" in text:
            return httpx.Response(500, json={"error": "boom"})
        reply = "no idea" if "odd" in text else '{"result": 9, "steps": []}'
        usage = {"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25}
        choice = {"index": 0, "message": {"role": "assistant", "content": reply}}
        return httpx.Response(200, json={"choices": [choice], "usage": usage})

    spec = parse_models_file({"models": [ENTRY]}).models[0]
    remote = RemoteModel(spec, load_remote(spec).template, transport=httpx.MockTransport(endpoint))
    leaf = parse_grader(LEAF)
    pairs = [(build_sample(text), {"who": "kids"}) for text in ("fine", "odd", "fails")]

    async def run() -> Any:
        with ThreadPoolExecutor(1) as pool:
            await remote.start(
                ServingContext(pool, pool, ServerSettings(model="unused"), Metrics())
            )
            try:
                judges = GraderJudges({"remote-judge": remote}, {"o3-mini": "remote-judge"})
                return await judges.grade(leaf, pairs)  # type: ignore[arg-type]
            finally:
                await remote.stop()

    graded = asyncio.run(run())
    fine, odd, failed = graded.grades
    assert fine == 7.0  # 9, clipped to the range [1, 7]
    assert isinstance(odd, GradeFailure) and odd.flag == "model_grader_parse_error"
    assert isinstance(failed, GradeFailure) and failed.flag == "model_grader_server_error"
    assert graded.tokens == 50  # the two answers' usage
    asked = next(body for body in requests if "fine" in body["messages"][0]["content"])
    assert asked["model"] == "judge-lm"
    assert asked["messages"][0] == {"role": "system", "content": "Rate fine for kids"}
    assert '"result"' in asked["messages"][-1]["content"]
    assert (asked["max_tokens"], asked["temperature"], asked["seed"]) == (40, 0.5, 3)
