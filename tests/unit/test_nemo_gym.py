"""NeMo Gym's /verify on this server, in process: the rollout's conversion to one chat
conversation against the fixtures in tests/data/nemo_gym (written in the shapes of NeMo Gym's
own example rows and rollouts), the label rule, and the answer in NeMo Gym's shape. The app,
the pipeline and the routes are real; the reward model is a fake at the scorer seam, and the
answer's failure fields are checked on results built by hand (masked items need verifiers:
tests/integration/test_nemo_gym_server.py runs them in a real server)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from reward_server.config import ServerSettings
from reward_server.http.app import create_app
from reward_server.http.compat.nemo_gym import (
    FAILURE_KINDS,
    NemoGymVerifyRequest,
    chat_of,
    label_of,
    verify_answer,
)
from reward_server.scoring.item_result import ItemResult
from reward_server.scoring.scored import Scored
from reward_server.text.rendering import Encoded

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "nemo_gym"


def _cases() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(FIXTURES.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        assert data["_source"]["repository"] == "NVIDIA-NeMo/Gym", path
        out += [(f"{path.stem}:{case['name']}", case) for case in data["cases"]]
    return out


CASES = _cases()
CHATS = [(name, case) for name, case in CASES if "chat" in case]
ERRORS = [(name, case) for name, case in CASES if "error" in case]


class FakeScorer:
    """A reward model at the scorer seam: renders a conversation (and its tools) as JSON,
    one token per character, a position-weighted score."""

    name = "fake-rm"
    adapter = None
    architecture = "FakeForSequenceClassification"
    num_labels = 1
    label_index = 0
    truncation_side = "left"
    dtype = "float32"
    device = "cpu"
    is_decoder = True
    has_chat_template = True
    max_length = 100_000

    def render_pairs(
        self, queries: Sequence[str], responses: Sequence[str], tools: Any = None
    ) -> list[str]:
        return [f"{q}>{r}" for q, r in zip(queries, responses, strict=True)]

    def render_conversations(
        self, conversations: Sequence[Sequence[Mapping[str, Any]]], tools: Any = None
    ) -> list[str]:
        every = list(tools) if tools is not None else [None] * len(conversations)
        return [
            json.dumps({"messages": list(c), "tools": t}, sort_keys=True)
            for c, t in zip(conversations, every, strict=True)
        ]

    def encode(self, texts: Sequence[str], *, truncate: bool, **_: Any) -> list[Encoded]:
        return [
            Encoded(input_ids=[ord(c) for c in t], truncated=False, num_tokens=len(t))
            for t in texts
        ]

    def score_batch(self, batch: Sequence[Sequence[int]]) -> list[float]:
        return [sum((i % 97 + 1) * t for i, t in enumerate(row)) / 1e6 for row in batch]

    def info(self) -> dict[str, object]:
        return {
            "model": self.name,
            "adapter": None,
            "architecture": self.architecture,
            "num_labels": 1,
            "label_index": 0,
            "max_length": self.max_length,
            "truncation_side": self.truncation_side,
            "dtype": self.dtype,
            "device": self.device,
            "chat_template": True,
        }


def _settings(**overrides: Any) -> ServerSettings:
    return ServerSettings(**{"model": "fake-rm", "max_wait_ms": 1.0, **overrides})


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with TestClient(create_app(_settings(), model=FakeScorer())) as c:
        yield c


# --- the conversion -------------------------------------------------------------------


@pytest.mark.parametrize(("name", "case"), CHATS, ids=[n for n, _ in CHATS])
def test_fixture_becomes_its_chat_conversation(name: str, case: dict[str, Any]) -> None:
    items = NemoGymVerifyRequest.model_validate(case["request"]).items()
    assert items.count == 1
    assert items.conversations[0] == case["chat"]["messages"]
    assert (None if items.tools is None else items.tools[0]) == case["chat"]["tools"]
    assert items.labels == (case["chat"]["label"],)


@pytest.mark.parametrize(("name", "case"), ERRORS, ids=[n for n, _ in ERRORS])
def test_items_without_a_chat_form_are_a_422_naming_them(
    client: TestClient, name: str, case: dict[str, Any]
) -> None:
    r = client.post("/verify", json=case["request"])
    assert r.status_code == 422, r.text
    assert r.json()["type"] == "invalid_request"
    assert case["error"] in r.json()["error"], r.json()


def test_instructions_fold_the_leading_system_and_developer_messages() -> None:
    # As NeMo Gym's responses_converter: one system message, instructions first.
    params = {
        "input": [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]},
            {"role": "user", "content": "Hi"},
            {"role": "developer", "content": "Later rule."},
        ],
        "instructions": "You are a helpful assistant.",
    }
    messages, tools = chat_of(params, {"output": []})
    assert messages == [
        {"role": "system", "content": "You are a helpful assistant.\n\nBe brief.\n\nUse tools."},
        {"role": "user", "content": "Hi"},
        {"role": "system", "content": "Later rule."},
        {"role": "assistant", "content": ""},
    ]
    assert tools is None


def test_chat_shaped_items_and_refusals_are_read() -> None:
    # NeMo Gym's converter also reads chat-shaped turns: inline tool_calls, role tool.
    spec = {"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}
    params = {
        "tools": [spec],
        "input": [
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "rain"},
        ],
    }
    output = [
        {
            "type": "message",
            "role": "assistant",
            "content": [
                {"type": "output_text", "text": "It rains. "},
                {"type": "refusal", "refusal": "No more."},
            ],
        }
    ]
    messages, tools = chat_of(params, {"output": output})
    assert tools == [spec]
    assert messages[1]["tool_calls"][0]["function"] == {"name": "w", "arguments": "{}"}
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "rain", "name": "w"}
    assert messages[3] == {"role": "assistant", "content": "It rains. No more."}


def test_the_prompt_and_the_response_never_share_a_turn() -> None:
    # An input ending with assistant items was a finished turn when the policy answered.
    params = {
        "input": [
            {"role": "user", "content": "Go on."},
            {"type": "reasoning", "id": "r", "summary": [{"type": "summary_text", "text": "T"}]},
        ]
    }
    answer = {"type": "message", "role": "assistant", "content": "Done."}
    messages, _ = chat_of(params, {"output": [answer]})
    assert messages[1:] == [
        {"role": "assistant", "content": "", "reasoning_content": "T"},
        {"role": "assistant", "content": "Done."},
    ]
    # An empty output: the policy answered nothing.
    assert chat_of(params, {"output": []})[0][-1] == {"role": "assistant", "content": ""}


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ({"type": "function_call", "call_id": "c", "arguments": "{}"}, ".name: expected"),
        ({"type": "function_call", "call_id": "c", "name": "f", "arguments": 3}, ".arguments"),
        ({"type": "function_call_output", "output": "x"}, ".call_id: expected"),
        ({"role": "critic", "content": "x"}, ".role: 'critic' is not"),
        ({"role": "user", "content": None}, ".content: expected a string"),
        (
            {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f"}}]},
            ".tool_calls[0].arguments: expected",
        ),
        ("text", ": Input should be a valid dictionary"),
    ],
)
def test_malformed_items_are_named(client: TestClient, item: Any, message: str) -> None:
    body = {"responses_create_params": {"input": "Hi"}, "response": {"output": [item]}}
    r = client.post("/verify", json=body)
    assert r.status_code == 422, r.text
    assert f"response.output[0]{message}" in r.json()["error"], r.json()


def test_lone_surrogates_are_a_422_naming_where(client: TestClient) -> None:
    # JSON allows "\\ud800" alone; no tokenizer encodes it and no answer could echo it.
    bodies = {
        '"input": "hi \\ud800"': "responses_create_params.input: invalid Unicode",
        '"input": "hi", "x\\udc00": 1': "responses_create_params: the key",
    }
    for params, where in bodies.items():
        body = f'{{"responses_create_params": {{{params}}}, "response": {{"output": []}}}}'
        r = client.post("/verify", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 422, r.text
        assert r.json()["error"].startswith(where), r.json()


def test_missing_parts_of_the_contract_are_a_422(client: TestClient) -> None:
    for body in ({"response": {"output": []}}, {"responses_create_params": {"input": "Hi"}}):
        r = client.post("/verify", json=body)
        assert r.status_code == 422 and r.json()["type"] == "invalid_request", r.text


# --- the label ------------------------------------------------------------------------


def test_label_is_expected_answer_else_the_only_expected_field_else_the_row() -> None:
    assert label_of({"expected_answer": "7", "question": "3 + 4?", "expected_x": 1}) == "7"
    assert label_of({"expected_answer": None}) is None
    call = {"name": "get_weather", "arguments": {"city": "Oslo"}}
    assert label_of({"expected_call": call, "id": 3, "_ng_task_index": 3}) == call
    assert label_of({"expected_answers": [], "agent_ref": {"name": "a"}}) == []
    row = {
        "expected_synonyms": ["Blazing"],
        "expected_synonym_values": [711],
        "category": "x",
        "agent_ref": {"name": "agent"},
        "_ng_task_index": 3,
        "_ng_rollout_index": 0,
        "instance_config": {"mask_sample": False},
        "reward": 1.0,
        "mask_sample": False,
        "failure_kind": None,
    }
    assert label_of(row) == {
        "expected_synonyms": ["Blazing"],
        "expected_synonym_values": [711],
        "category": "x",
    }
    assert label_of({"agent_ref": {"name": "agent"}, "_ng_task_index": 0}) is None


# --- the answer -----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "case"), CHATS, ids=[n for n, _ in CHATS])
def test_answer_echoes_the_request_with_the_reward_of_its_conversation(
    client: TestClient, name: str, case: dict[str, Any]
) -> None:
    r = client.post("/verify", json=case["request"])
    assert r.status_code == 200, r.text
    answer = r.json()
    chat = case["chat"]
    item = {"messages": chat["messages"], **({"tools": chat["tools"]} if chat["tools"] else {})}
    scores = client.post("/score", json={"conversations": [item]})
    assert scores.status_code == 200, scores.text
    assert answer["reward"] == pytest.approx(scores.json()["scores"][0], abs=1e-9)
    assert {k: v for k, v in answer.items() if k in case["request"]} == case["request"]
    assert set(answer) - set(case["request"]) == {
        "reward",
        "mask_sample",
        "failure_kind",
        "failure_reason",
        "instance_config",
    }
    assert answer["mask_sample"] is False
    assert answer["failure_kind"] is None and answer["failure_reason"] is None
    assert answer["instance_config"] == {"mask_sample": False}
    assert r.headers["X-Reward-Truncated"] == "0"
    assert "X-Reward-Masked" not in r.headers


def test_seed_session_answers_an_empty_object(client: TestClient) -> None:
    # simple_agent seeds a session before each rollout, with the row as the body.
    _, case = CHATS[0]
    r = client.post("/seed_session", json=case["request"])
    assert (r.status_code, r.json()) == (200, {})


def test_api_key_guards_verify_and_seed_session() -> None:
    _, case = CHATS[0]
    with TestClient(create_app(_settings(api_key="k3y"), model=FakeScorer())) as c:
        for path in ("/verify", "/seed_session"):
            r = c.post(path, json=case["request"])
            assert r.status_code == 401 and r.json()["type"] == "unauthorized", r.text
            r = c.post(path, json=case["request"], headers={"Authorization": "Bearer k3y"})
            assert r.status_code == 200, r.text


def test_openapi_documents_the_routes(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    verify = spec["paths"]["/verify"]["post"]
    assert {"401", "413", "422", "429", "500", "503"} <= set(verify["responses"])
    answer = verify["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    fields = spec["components"]["schemas"][answer.rsplit("/", 1)[-1]]["properties"]
    assert {"reward", "mask_sample", "failure_kind", "failure_reason"} <= set(fields)
    assert {"401", "422"} <= set(spec["paths"]["/seed_session"]["post"]["responses"])


def _scored(
    *results: tuple[str, ItemResult], score: float | None, reason: str | None = None
) -> Scored:
    return Scored(
        name="+".join(name for name, _ in results),
        scores=[score],
        results={name: [result] for name, result in results},
        labels={name: ["score"] for name, _ in results},
        reasons=(reason,),
    )


REQUEST = {
    "responses_create_params": {"input": "Hi"},
    "response": {"output": []},
    "expected_answer": "7",
    "instance_config": {"problem_id": "p1", "mask_sample": False},
    "reward": 1.0,
    "reward_components": {"old": 1.0},
}


def test_a_masked_item_is_mask_sample_with_its_failure() -> None:
    masked = ItemResult(score=0.0, num_tokens=0, truncated=False, error="timeout", masked=True)
    fine = ItemResult(score=0.5, num_tokens=3, truncated=False)
    answer = verify_answer(
        REQUEST, _scored(("rm", fine), ("math", masked), score=None, reason="timeout")
    )
    assert answer["reward"] == 0.0 and answer["mask_sample"] is True
    assert answer["failure_kind"] == "verifier_error"
    assert answer["failure_reason"].startswith("timeout (model 'math')")
    assert answer["instance_config"] == {"problem_id": "p1", "mask_sample": True}
    assert answer["components"] == {"rm": 0.5, "math": None}
    assert answer["verifier_errors"] == {"math": "timeout"}
    assert "reward_components" not in answer
    assert answer["expected_answer"] == "7"


def test_a_failure_scored_with_on_error_names_its_kind_unmasked() -> None:
    failed = ItemResult(score=-1.0, num_tokens=0, truncated=False, error="parse_failure")
    answer = verify_answer(REQUEST, _scored(("judge", failed), score=-1.0))
    assert (answer["reward"], answer["mask_sample"]) == (-1.0, False)
    assert answer["failure_kind"] == "judge_unparseable"
    assert "on_error" in answer["failure_reason"]
    assert "components" not in answer


def test_a_verifiers_reason_for_a_low_score_is_not_a_failure() -> None:
    wrong = ItemResult(score=0.0, num_tokens=0, truncated=False, error="wrong_function")
    answer = verify_answer(REQUEST, _scored(("calls", wrong), score=0.0))
    assert answer["failure_kind"] is None and answer["failure_reason"] is None
    assert answer["verifier_errors"] == {"calls": "wrong_function"}


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("deadline", "reward_server:deadline"),
        ("remote_error", "judge_failed"),
        ("no_opponent", "reward_server:no_opponent"),
        ("unclosed_reasoning", "reward_server:unclosed_reasoning"),
        ("a remote server's own reason", "verifier_error"),
    ],
)
def test_masked_reasons_map_to_nemo_gyms_failure_kinds(reason: str, kind: str) -> None:
    masked = ItemResult(score=0.0, num_tokens=0, truncated=False, error=reason, masked=True)
    answer = verify_answer(REQUEST, _scored(("m", masked), score=None, reason=reason))
    assert answer["failure_kind"] == kind
    assert answer["mask_sample"] is True


def test_failure_kinds_are_registered_or_namespaced() -> None:
    # NeMo Gym's nemo_gym/failure_kinds.py: a registered name, or "<server>:<kind>".
    registered = {"verifier_error", "judge_failed", "judge_unparseable"}
    for kind in FAILURE_KINDS.values():
        assert kind in registered or kind.startswith("reward_server:"), kind
