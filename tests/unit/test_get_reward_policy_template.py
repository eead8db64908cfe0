"""``--policy-tokenizer``: /get_reward undoes the policy's chat template (OpenRLHF's queries).

A ChatML policy (Qwen2.5's template, default system message included) is scored by a reward
model whose own template uses Llama-3-style headers. Each OpenRLHF-shaped query must score
exactly as ``/score`` with the clean conversation would.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import chat_templates
import pytest
from fastapi.testclient import TestClient
from transformers import AutoTokenizer

import tiny_models
from reward_server.config import ServerSettings
from reward_server.http.app import create_app

TOL = 1e-5

CONVERSATIONS: dict[str, list[dict[str, str]]] = {
    "single-turn": [
        {"role": "user", "content": "Write a line about the sea."},
        {"role": "assistant", "content": "The sea is wide and grey tonight."},
    ],
    "multi-turn": [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello. What shall we write?"},
        {"role": "user", "content": "A review of a film,\nshort please."},
        {"role": "assistant", "content": " A fine film: warm, funny and brief."},
    ],
    "system": [
        {"role": "system", "content": "You are a terse critic."},
        {"role": "user", "content": "Rate the film."},
        {"role": "assistant", "content": "Dull.\nTwo stars."},
    ],
}


@pytest.fixture(scope="module")
def policy_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chat_templates.save_policy_tokenizer(tmp_path_factory.mktemp("qwen_policy"), "qwen25")


@pytest.fixture(scope="module")
def llama3_rm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny decoder reward model whose own template has Llama-3-style headers."""
    return tiny_models.save_llama_reward_model(
        tmp_path_factory.mktemp("llama3_rm"), chat_template=chat_templates.LLAMA3
    )


@pytest.fixture(scope="module")
def client(llama3_rm: Path, policy_tokenizer: Path) -> Iterator[TestClient]:
    settings = ServerSettings(model=str(llama3_rm), policy_tokenizer=str(policy_tokenizer))
    with TestClient(create_app(settings)) as c:
        yield c


def openrlhf_query(tokenizer: Any, messages: list[dict[str, str]], *, eot: bool) -> tuple[str, str]:
    """(query, prompt) as OpenRLHF builds them: the policy's templated prompt is tokenized, the
    generated ids (ending in the end-of-turn token, or cut off without it) appended, and the
    whole decoded with special tokens kept."""
    prompt = tokenizer.apply_chat_template(
        messages[:-1], tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    response_ids = tokenizer(messages[-1]["content"], add_special_tokens=False)["input_ids"]
    if eot:
        response_ids.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    query = tokenizer.decode(prompt_ids + response_ids, skip_special_tokens=False)
    return query, tokenizer.decode(prompt_ids, skip_special_tokens=False)


def clean_scores(client: TestClient, conversations: list[list[dict[str, str]]]) -> list[float]:
    answer = client.post("/score", json={"conversations": conversations})
    assert answer.status_code == 200, answer.text
    return answer.json()["scores"]


@pytest.mark.parametrize("with_prompts", [True, False])
@pytest.mark.parametrize("eot", [True, False])
def test_get_reward_scores_the_recovered_conversation(
    client: TestClient, policy_tokenizer: Path, eot: bool, with_prompts: bool
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(policy_tokenizer)
    names = list(CONVERSATIONS)
    built = [openrlhf_query(tokenizer, CONVERSATIONS[n], eot=eot) for n in names]
    body: dict[str, Any] = {"query": [q for q, _ in built]}
    if with_prompts:
        body["prompts"] = [p for _, p in built]
    answer = client.post("/get_reward", json=body)
    assert answer.status_code == 200, answer.text
    # Qwen's template adds a default system message when a conversation has none: that is
    # the policy template's markup, not the user's conversation, so it is not scored.
    expected = [CONVERSATIONS[n] for n in names]
    reference = clean_scores(client, expected)
    assert answer.json()["rewards"] == pytest.approx(reference, abs=TOL)
    assert answer.json()["scores"] == answer.json()["rewards"]
    # ... and not the score of the policy's markup read as plain text.
    raw = client.post("/score", json={"texts": body["query"]}).json()["scores"]
    assert any(abs(a - b) > TOL for a, b in zip(raw, reference, strict=True))


def test_text_not_in_the_policy_template_is_a_422_naming_the_item(
    client: TestClient, policy_tokenizer: Path
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(policy_tokenizer)
    good, _ = openrlhf_query(tokenizer, CONVERSATIONS["single-turn"], eot=True)
    answer = client.post("/get_reward", json={"query": [good, "just some text, no template"]})
    assert answer.status_code == 422
    error = answer.json()
    assert error["type"] == "policy_template"
    assert error["error"].startswith("query 1 is not in the policy's chat template")


def test_prompts_of_another_length_are_a_422(client: TestClient, policy_tokenizer: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(policy_tokenizer)
    query, prompt = openrlhf_query(tokenizer, CONVERSATIONS["single-turn"], eot=True)
    answer = client.post("/get_reward", json={"query": [query, query], "prompts": [prompt]})
    assert answer.status_code == 422
    assert "1 prompts for 2 queries" in answer.json()["error"]


def test_info_names_the_policy_tokenizer(client: TestClient, policy_tokenizer: Path) -> None:
    assert client.get("/info").json()["policy_tokenizer"] == str(policy_tokenizer)


def test_without_the_flag_queries_are_scored_as_given(llama3_rm: Path) -> None:
    with TestClient(create_app(ServerSettings(model=str(llama3_rm)))) as c:
        text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>"
        rewards = c.post("/get_reward", json={"query": [text]}).json()["rewards"]
        assert rewards == pytest.approx(
            c.post("/score", json={"texts": [text]}).json()["scores"], abs=TOL
        )
        assert c.get("/info").json()["policy_tokenizer"] is None


def test_a_policy_tokenizer_without_a_template_stops_the_start(
    llama3_rm: Path, tmp_path: Path
) -> None:
    bare = tmp_path / "bare"
    AutoTokenizer.from_pretrained(llama3_rm).save_pretrained(bare)
    config = bare / "tokenizer_config.json"
    config.write_text(config.read_text().replace('"chat_template"', '"unused_template"'))
    for leftover in bare.glob("chat_template.*"):
        leftover.unlink()
    settings = ServerSettings(model=str(llama3_rm), policy_tokenizer=str(bare))
    with pytest.raises(Exception, match="policy tokenizer"), TestClient(create_app(settings)):
        pass
