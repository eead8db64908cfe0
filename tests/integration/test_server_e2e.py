"""The real ``reward-server`` script on tiny BERT, GPT-2 (pad == eos) and Llama models.

Scores over HTTP are compared with an independent per-text reference computed here with
transformers: one text, no padding, the score head applied to the last token's hidden
state for decoders (which is right even when the text ends in EOS and pad == eos), and the
model's own pooled logits for the BERT encoder.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest
import torch
from server_proc import ServerProcess, start_server
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from reward_server.config import CPU_BATCH_TOKENS
from tiny_models import CHAT_TEMPLATE, make_corpus

MODELS = ("bert", "gpt2", "llama")
TOL = 1e-5


def reference_scores(path: Path, texts: Sequence[str], label: int = 0) -> list[float]:
    """Per-text float32 scores without padding: last-token head for decoders."""
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path).float().eval()
    decoder = hasattr(model, "score")
    out = []
    with torch.inference_mode():
        for text in texts:
            bos = tok.bos_token
            add = not (bos and decoder and text.startswith(bos))
            ids = torch.tensor([tok(text, add_special_tokens=add)["input_ids"]])
            if decoder:
                hidden = model.base_model(input_ids=ids).last_hidden_state  # (1, T, H)
                out.append(float(model.score(hidden[0, -1])[label]))
            else:
                out.append(float(model(input_ids=ids).logits[0, label]))
    return out


def texts_of_lengths(path: Path, lengths: Sequence[int], seed: int = 0) -> list[str]:
    """Distinct texts of about ``lengths`` tokens each, cut from a seeded corpus."""
    tok = AutoTokenizer.from_pretrained(path)
    corpus = make_corpus(len(lengths), seed=seed, min_words=250, max_words=300)
    texts = []
    for n, source in zip(lengths, corpus, strict=True):
        ids = tok(source, add_special_tokens=False)["input_ids"][:n]
        texts.append(tok.decode(ids, skip_special_tokens=True).strip() or "a")
    return texts


@pytest.fixture(scope="module")
def servers(
    bert_rm: Path, gpt2_rm: Path, llama_rm: Path
) -> Iterator[dict[str, tuple[Path, ServerProcess]]]:
    """One real server per tiny model, shared by the module; the three start side by side
    (each start is mostly imports, which overlap)."""
    paths = {"bert": bert_rm, "gpt2": gpt2_rm, "llama": llama_rm}
    started: dict[str, ServerProcess] = {}
    try:
        for name, path in paths.items():
            started[name] = start_server(path, "--max-wait-ms", "5")
        for server in started.values():
            server.wait_ready(180)
        yield {name: (paths[name], server) for name, server in started.items()}
    finally:
        for server in started.values():
            server.stop()
            server.log_path.unlink(missing_ok=True)


def score(server: ServerProcess, texts: Sequence[str], **extra: object) -> list[float]:
    """POST /score with texts and return the scores (asserting 200)."""
    r = httpx.post(f"{server.url}/score", json={"texts": list(texts), **extra}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["scores"]


async def score_concurrently(
    server: ServerProcess, chunks: Sequence[Sequence[str]]
) -> list[list[float]]:
    """Send every chunk as its own request, all at once; scores per chunk."""
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
        answers = await asyncio.gather(
            *(http.post("/score", json={"texts": list(chunk)}) for chunk in chunks)
        )
    for r in answers:
        assert r.status_code == 200, r.text
    return [r.json()["scores"] for r in answers]


@pytest.mark.parametrize("name", MODELS)
def test_scores_equal_per_text_reference(
    servers: dict[str, tuple[Path, ServerProcess]], name: str
) -> None:
    path, server = servers[name]
    tok = AutoTokenizer.from_pretrained(path)
    texts = ["the movie was great", "a", "bad bad bad and boring", "hello world " * 20]
    if tok.eos_token and name != "bert":
        # Texts ending in EOS: with pad == eos (GPT-2), transformers' own pooling would
        # skip these tokens; the server must still read the head at the last real token.
        texts += [f"a good film{tok.eos_token}", f"so dull{tok.eos_token}{tok.eos_token}"]
    r = httpx.post(f"{server.url}/score", json={"texts": texts}, timeout=60)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["scores"] == pytest.approx(reference_scores(path, texts), abs=TOL)
    assert body["tokens"] == [len(tok(t)["input_ids"]) for t in texts]
    assert body["truncated"] == [False] * len(texts)
    assert body["model"] == str(path)


@pytest.mark.parametrize("name", MODELS)
def test_batch_invariance(servers: dict[str, tuple[Path, ServerProcess]], name: str) -> None:
    path, server = servers[name]
    lengths = [1 + (i * 199) // 49 for i in range(50)]  # 1 .. 200 tokens
    random.Random(1).shuffle(lengths)
    texts = texts_of_lengths(path, lengths)
    assert len(set(texts)) == len(texts)
    alone = [score(server, [t])[0] for t in texts]
    together = score(server, texts)
    chunks = [texts[i::16] for i in range(16)]  # 16 concurrent requests, mixed lengths
    spread: dict[str, float] = {}
    for chunk, scores in zip(chunks, asyncio.run(score_concurrently(server, chunks)), strict=True):
        spread.update(zip(chunk, scores, strict=True))
    reference = reference_scores(path, texts)
    assert together == pytest.approx(alone, abs=TOL)
    assert [spread[t] for t in texts] == pytest.approx(alone, abs=TOL)
    assert alone == pytest.approx(reference, abs=TOL)


@pytest.mark.parametrize("name", MODELS)
def test_routing_32_concurrent_clients(
    servers: dict[str, tuple[Path, ServerProcess]], name: str
) -> None:
    path, server = servers[name]
    corpus = make_corpus(32 * 5, seed=7, min_words=1, max_words=60)
    requests = [corpus[5 * c : 5 * c + 1 + c % 5] for c in range(32)]  # 1..5 texts each
    expected = dict(zip(corpus, reference_scores(path, corpus), strict=True))
    got = asyncio.run(score_concurrently(server, requests))
    for texts, scores in zip(requests, got, strict=True):
        assert scores == pytest.approx([expected[t] for t in texts], abs=TOL)


def test_pair_through_chat_template_equals_hand_rendered_text(
    servers: dict[str, tuple[Path, ServerProcess]],
) -> None:
    path, server = servers["llama"]
    assert "<|{{ message['role'] }}|>" in CHAT_TEMPLATE  # the template the text below follows
    queries = ["what did you think of the film", "say hi"]
    responses = ["it was great and the music was wonderful", "hello"]
    by_hand = [
        f"<|user|>\n{q}</s>\n<|assistant|>\n{r}</s>\n"
        for q, r in zip(queries, responses, strict=True)
    ]
    pairs = httpx.post(
        f"{server.url}/score", json={"queries": queries, "responses": responses}, timeout=60
    ).json()
    conversations = [
        [{"role": "user", "content": q}, {"role": "assistant", "content": r}]
        for q, r in zip(queries, responses, strict=True)
    ]
    convs = httpx.post(
        f"{server.url}/score", json={"conversations": conversations}, timeout=60
    ).json()
    texts = httpx.post(f"{server.url}/score", json={"texts": by_hand}, timeout=60).json()
    assert pairs["scores"] == pytest.approx(texts["scores"], abs=TOL)
    assert convs["scores"] == pytest.approx(texts["scores"], abs=TOL)
    assert pairs["tokens"] == texts["tokens"] == convs["tokens"]
    assert texts["scores"] == pytest.approx(reference_scores(path, by_hand), abs=TOL)


def test_pairs_without_template_join_and_conversations_are_422(
    servers: dict[str, tuple[Path, ServerProcess]],
) -> None:
    _, server = servers["gpt2"]
    r = httpx.post(f"{server.url}/score", json={"queries": ["a good"], "responses": [" film"]})
    assert r.json()["scores"] == pytest.approx(score(server, ["a good film"]), abs=TOL)
    r = httpx.post(
        f"{server.url}/score", json={"conversations": [[{"role": "user", "content": "hi"}]]}
    )
    assert r.status_code == 422
    assert r.json()["type"] == "chat_template"
    assert score(server, ["still serving"])


def test_get_reward_matches_score(servers: dict[str, tuple[Path, ServerProcess]]) -> None:
    _, server = servers["gpt2"]
    texts = ["the plot was dull", "great acting"]
    r = httpx.post(f"{server.url}/get_reward", json={"query": texts, "prompts": ["", ""]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["rewards"] == body["scores"] == pytest.approx(score(server, texts), abs=TOL)
    assert body["extra_logs"]["truncated"] == [0.0, 0.0]


def test_info_health_metrics(servers: dict[str, tuple[Path, ServerProcess]]) -> None:
    path, server = servers["llama"]
    assert httpx.get(f"{server.url}/health").json() == {"status": "ok"}
    info = httpx.get(f"{server.url}/info").json()
    assert info["model"] == str(path)
    assert info["architecture"] == "LlamaForSequenceClassification"
    assert info["chat_template"] is True and info["auth"] is False
    # the CPU default budget, raised to the model's max length when that is longer
    assert info["max_batch_tokens"] == max(CPU_BATCH_TOKENS, info["max_length"])
    assert info["max_client_batch"] == 256
    before = httpx.get(f"{server.url}/metrics").text
    score(server, ["one", "two"])
    after = httpx.get(f"{server.url}/metrics").text
    assert 'reward_server_requests_total{endpoint="/score",status="200"}' in after
    assert _metric(after, 'reward_server_items_total{endpoint="/score"}') == (
        _metric(before, 'reward_server_items_total{endpoint="/score"}') + 2
    )


def _metric(text: str, name: str) -> float:
    """The value of one sample in Prometheus text (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0
