"""Faults: servers killed, stalled and stopped, clients gone, a trainer killed mid-write.

Nothing is lost, repeated or invented: a PPO run whose reward server is SIGKILLed and
restarted logs every step once with real scores; with two servers, one killed mid-run, the
requests fail over; a stalled server ends in one ``RewardServerError`` naming the URL and
the cause; a client that hangs up has its queued work dropped; a trainer SIGKILLed while
writing a checkpoint resumes from the previous one; SIGTERM finishes what is in flight.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers.load import Pool, build_pool, items_scored, scrape
from helpers.training import (
    PPO_CLIENT,
    dataset,
    ppo_client_env,
    ppo_config,
    read_jsonl,
    space_reward,
    steps_of,
)
from server_proc import (
    HeldRequest,
    ServerProcess,
    free_port,
    running_server,
    start_server,
    wait_until,
)

from ppo_client import PPOTrainer
from reward_client import RetryPolicy, RewardClient, RewardServerError, ScoreResult
from tiny_models import make_corpus

TOL = 1e-5


@pytest.fixture
def one_thread() -> Iterator[None]:
    """In-process training: tiny models run fastest on one thread next to the servers."""
    import torch

    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def metric(url: str, name: str) -> float:
    """One Prometheus sample of the server (0 when absent)."""
    return scrape(url).get(name, 0.0)


def assert_real_scores(rows: Sequence[dict[str, Any]]) -> None:
    """Every step has a finite, non-zero mean score, and they are not all the same."""
    scores = [row["objective/scores"] for row in rows]
    assert all(math.isfinite(s) and s != 0.0 for s in scores), scores
    assert len(set(scores)) > 1, scores


# --------------------------------------------------------------------------- server SIGKILL


#: How long the killed server stays down before its restart begins; the restart's own load
#: time comes on top, so the outage outlasts the longest backoff (10 s), as a real restart
#: (a 7B reward model loads in one to three minutes) would.
DOWN_S = 10


def test_reward_server_sigkilled_during_train_and_restarted(
    gpt2_policy: Path, bert_rm: Path, tmp_path: Path
) -> None:
    """Default retry settings (a budget of 600 s) outlast a server that is down and restarts."""
    n_steps = 24
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in dataset()))
    out = tmp_path / "out"
    port = free_port()
    server: ServerProcess | None = start_server(bert_rm, port=port)
    restarted: ServerProcess | None = None
    trainer_log = tmp_path / "trainer.log"
    train: subprocess.Popen[bytes] | None = None
    try:
        config = tmp_path / "ppo.yaml"
        config.write_text(
            f"model_name_or_path: {gpt2_policy}\n"
            f"reward_url: {server.url}\n"
            f"dataset_name: {data}\n"
            f"output_dir: {out}\n"
            "per_device_train_batch_size: 4\n"
            "gradient_accumulation_steps: 1\n"
            "local_rollout_forward_batch_size: 4\n"
            f"total_episodes: {4 * n_steps}\n"
            "response_length: 8\n"
            "num_ppo_epochs: 1\n"
            f"num_sample_generations: {n_steps}\n"  # samples (with scores) of every step
            "disable_tqdm: true\n"
        )
        with trainer_log.open("wb") as log:
            train = subprocess.Popen(
                [str(PPO_CLIENT), "train", "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=ppo_client_env(),
            )
        # Both start at once (the trainer's client retries until the server is up).
        server.wait_ready(90)
        metrics_file = out / "metrics.jsonl"

        def training_is_under_way() -> bool:
            assert train is not None and train.poll() is None, trainer_log.read_text()
            return len(steps_of(metrics_file)) >= 3

        wait_until(training_is_under_way, 180, "the first steps")
        assert server.stop(signal.SIGKILL) == -signal.SIGKILL
        steps_at_kill = len(steps_of(metrics_file))
        server = None
        time.sleep(DOWN_S)
        assert train.poll() is None, trainer_log.read_text()[-5000:]  # still waiting
        restarted = start_server(bert_rm, port=port)  # same port, as a supervisor would
        restarted.wait_ready(90)
        assert train.wait(timeout=300) == 0, trainer_log.read_text()[-5000:]
        # The logged scores of every step, before and after the kill, are the reward
        # model's scores of those texts: none invented, zero-filled or shifted.
        samples = read_jsonl(out / "samples.jsonl")
        with RewardClient(restarted.url) as client:
            again = client.score(
                queries=[s["query"] for s in samples], responses=[s["response"] for s in samples]
            )
    finally:
        if train is not None and train.poll() is None:
            train.kill()
            train.wait()
        for srv in (server, restarted):
            if srv is not None:
                srv.stop()

    log = trainer_log.read_text()
    assert f"done: {n_steps} steps" in log
    assert steps_at_kill < n_steps  # the kill came mid-run...
    # ...and the client waited it out, saying so on every failed attempt.
    waits = [line for line in log.splitlines() if "of the 600 s retry budget" in line]
    assert len(waits) >= 3 and all("next try in" in line for line in waits), log[-5000:]
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, n_steps + 1))  # each step once
    assert_real_scores(rows)
    # A step after the kill waited out the whole outage.
    assert max(r["time/reward_wait_s"] for r in rows if r["step"] > steps_at_kill) > DOWN_S - 5
    assert {s["step"] for s in samples} == set(range(1, n_steps + 1))
    for sample, score in zip(samples, again, strict=True):
        assert abs(sample["score"] - score) <= TOL, (sample, score)


# --------------------------------------------------------------------------- failover


class KillingClient(RewardClient):
    """A RewardClient that SIGKILLs ``victim`` while its ``kill_at``-th call is in flight."""

    def __init__(self, urls: Sequence[str], victim: ServerProcess, kill_at: int) -> None:
        super().__init__(urls, timeout=30, retry=RetryPolicy(max_retries=10, backoff_max=1.0))
        self.victim, self.kill_at, self.calls = victim, kill_at, 0
        self.killed_after_step = -1
        self.victim_items = 0.0

    def score_pairs_detailed(self, prompts: Sequence[Any], responses: Sequence[str]) -> ScoreResult:
        self.calls += 1
        if self.calls == self.kill_at:
            self.killed_after_step = self.calls - 1
            self.victim_items = items_scored(scrape(self.victim.url)).get("/score", 0.0)
            threading.Thread(target=self.victim.stop, args=(signal.SIGKILL,)).start()
        return super().score_pairs_detailed(prompts, responses)


def test_two_reward_urls_one_killed_mid_run_fails_over(
    gpt2_policy: Path, bert_rm: Path, tmp_path: Path, one_thread: None
) -> None:
    n_steps = 16
    # Two items per request: each reward call is split over both servers at once.
    first, second = (start_server(bert_rm, "--max-client-batch", "2") for _ in range(2))
    try:
        for srv in (first, second):
            srv.wait_ready(90)
        client = KillingClient([first.url, second.url], victim=first, kill_at=5)
        config = ppo_config(
            gpt2_policy,
            tmp_path / "out",
            per_device_train_batch_size=4,
            gradient_accumulation_steps=1,
            local_rollout_forward_batch_size=4,
            num_ppo_epochs=1,
            total_episodes=4 * n_steps,
        )
        with client:
            history = PPOTrainer(config, train_dataset=dataset(), reward_fn=client).train()
            second_items = items_scored(scrape(second.url)).get("/score", 0)
        first_exit = first.proc.wait(timeout=30)
    finally:
        first.stop(signal.SIGKILL)
        second.stop()
    assert first_exit == -signal.SIGKILL
    assert client.killed_after_step == 4
    assert [row["step"] for row in history] == list(range(1, n_steps + 1))  # no step failed
    assert_real_scores(history)
    # Both servers shared the first steps; the survivor took over the rest (4 rollouts a
    # step): every chunk after the kill, and a chunk cut off by it once more.
    assert client.victim_items > 0
    assert second_items >= 4 * (n_steps - client.killed_after_step)
    assert second_items <= 4 * n_steps


# --------------------------------------------------------------------------- stalls and hang-ups


@pytest.fixture(scope="module")
def slow_batch_server(bert_rm: Path) -> Iterator[ServerProcess]:
    """A server whose batcher waits up to a minute for a full batch (256 rows): small
    requests stay queued until their client hangs up; a 256-item request runs at once."""
    args = ("--max-wait-ms", "60000", "--max-batch-size", "256", "--max-batch-tokens", "65536")
    # The queue itself is under test: no score cache answering or merging identical items.
    args += ("--score-cache-size", "0")
    with running_server(bert_rm, *args) as srv:
        yield srv


def _full_batch(seed: int) -> list[str]:
    return make_corpus(256, seed=seed, min_words=2, max_words=12)


def test_stalled_server_ends_in_reward_server_error_naming_url_and_cause(
    slow_batch_server: ServerProcess,
) -> None:
    url = slow_batch_server.url
    texts = _full_batch(1)
    want = httpx.post(f"{url}/score", json={"texts": texts}, timeout=60).json()["scores"]
    os.kill(slow_batch_server.proc.pid, signal.SIGSTOP)  # accepts connections, never answers
    try:
        fast = RetryPolicy(max_retries=2, backoff_max=0.05)
        client = RewardClient(url, timeout=1.0, retry=fast, max_client_batch=64)
        with client, pytest.raises(RewardServerError) as info:
            client.score(texts=texts)
    finally:
        os.kill(slow_batch_server.proc.pid, signal.SIGCONT)
    error = info.value
    assert error.url == f"{url}/score"
    assert error.status is None and error.attempts == 3
    assert str(error).startswith(f"POST {url}/score failed after 3 attempts: timed out")
    # Resumed, the server drops the abandoned requests and serves the same scores again.
    with RewardClient(url, timeout=60) as client:
        assert client.score(texts=texts) == pytest.approx(want, abs=TOL)
    wait_until(lambda: metric(url, "reward_server_queue_items") == 0, 30, "an empty queue")


def _hang_up_after_queueing(url: str, port: int, clients: int, items: int) -> None:
    """``clients`` raw connections each send a request of ``items`` texts, wait until all
    of it is queued, then close without reading the answer."""
    queued_before = metric(url, "reward_server_queue_items")
    socks = []
    for k in range(clients):
        body = json.dumps({"texts": make_corpus(items, seed=100 + k, max_words=8)}).encode()
        head = (
            f"POST /score HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(head + body)
        socks.append(sock)
    want = queued_before + clients * items
    wait_until(lambda: metric(url, "reward_server_queue_items") == want, 30, f"{want} items queued")
    for sock in socks:
        sock.close()


def test_client_hanging_up_mid_request_drops_its_work(slow_batch_server: ServerProcess) -> None:
    url, port = slow_batch_server.url, slow_batch_server.port
    disconnected = 'reward_server_errors_total{status="499",type="client_disconnected"}'
    batches = 'reward_server_batches_total{outcome="ok"}'
    # 6 rounds of 8 x 4 items stay under one 256-row batch even if the batcher counted the
    # dropped items towards it, so nothing can start a forward pass.
    clients, items, rounds = 8, 4, 6
    before = scrape(url)
    for _ in range(rounds):
        _hang_up_after_queueing(url, port, clients, items)
        wait_until(lambda: metric(url, "reward_server_queue_items") == 0, 30, "the queue to empty")
    wait_until(lambda: _in_progress(url) == 0, 30, "no request in progress")
    after = scrape(url)
    # Every hang-up was noticed, and its items left the queue without a forward pass; no
    # handler of a gone client is left waiting (what would hold its memory).
    assert after[disconnected] - before.get(disconnected, 0) == clients * rounds
    assert after.get(batches, 0) == before.get(batches, 0)
    # And the server keeps serving, right.
    texts = _full_batch(2)
    with RewardClient(url, timeout=60) as client:
        scores = client.score(texts=texts)
        assert scores == pytest.approx(client.score(texts=texts[::-1])[::-1], abs=TOL)
    assert httpx.get(f"{url}/health").status_code == 200


# --------------------------------------------------------------------------- trainer SIGKILL

#: Runs the real trainer in a child process; ``torch.save`` is wrapped so that the write of
#: the file named by KILL_AT is cut off half-way by SIGKILL: a deterministic kill in the
#: middle of a checkpoint write (the trainer itself is unchanged).
CHILD = """
import json, os, signal, sys
from pathlib import Path
import torch
sys.path[:0] = [sys.argv[4], sys.argv[5]]
from helpers.training import dataset, ppo_config, space_reward
from ppo_client import PPOTrainer

real_save = torch.save
def save(obj, f, *args, **kwargs):
    if str(f).endswith(os.environ["KILL_AT"]):
        with open(f, "wb") as fh:
            fh.write(b"PK\\x03\\x04 half a file")
            fh.flush()
            os.fsync(fh.fileno())
        os.kill(os.getpid(), signal.SIGKILL)
    return real_save(obj, f, *args, **kwargs)
torch.save = save

config = ppo_config(Path(sys.argv[1]), Path(sys.argv[2]), **json.loads(sys.argv[3]))
PPOTrainer(config, train_dataset=dataset(), reward_fn=space_reward).train()
"""


def test_trainer_sigkilled_during_checkpoint_write_resumes_from_the_previous(
    gpt2_policy: Path, tmp_path: Path, one_thread: None
) -> None:
    out = tmp_path / "run"
    settings: dict[str, Any] = {
        "total_episodes": 8 * 6,
        "save_steps": 2,
        "seed": 3,
    }
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    here = Path(__file__).resolve()  # tests/ (the helpers), then the repository
    child = subprocess.run(
        [
            sys.executable,
            str(script),
            str(gpt2_policy),
            str(out),
            json.dumps(settings),
            str(here.parents[1]),
            str(here.parents[2]),
        ],
        capture_output=True,
        text=True,
        env={**ppo_client_env(), "KILL_AT": ".tmp-checkpoint-4/optimizer.pt"},
        timeout=300,
    )
    assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr
    torn = out / ".tmp-checkpoint-4"
    assert (torn / "optimizer.pt").read_bytes().startswith(b"PK")  # killed mid-write
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-2"]
    assert steps_of(out / "metrics.jsonl") == [1, 2, 3, 4]

    # The previous checkpoint is intact and loadable on its own.
    import torch
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(out / "checkpoint-2" / "policy")
    torch.load(out / "checkpoint-2" / "optimizer.pt", weights_only=True)
    assert json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())["step"] == 2

    resumed = PPOTrainer(
        ppo_config(gpt2_policy, out, resume_from_checkpoint="latest", **settings),
        train_dataset=dataset(),
        reward_fn=space_reward,
    )
    assert resumed.state.step == 2  # the torn write is ignored
    history = resumed.train()
    assert [row["step"] for row in history] == [1, 2, 3, 4, 5, 6]
    assert steps_of(out / "metrics.jsonl") == [1, 2, 3, 4, 5, 6]  # steps 3-4 once, not twice
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [
        "checkpoint-2",
        "checkpoint-4",
        "checkpoint-6",
    ]
    assert not torn.exists()
    torch.load(out / "checkpoint-4" / "optimizer.pt", weights_only=True)


# --------------------------------------------------------------------------- SIGTERM


def _in_progress(url: str) -> float:
    """Scoring requests being handled (/score and /get_reward)."""
    samples = scrape(url)
    return sum(
        samples.get(f'reward_server_requests_in_progress{{endpoint="{e}"}}', 0.0)
        for e in ("/score", "/get_reward")
    )


def test_sigterm_finishes_mixed_requests_in_flight_with_right_scores(llama_rm: Path) -> None:
    """SIGTERM while requests of every input form are in flight: each is finished with its
    right scores, then the server exits 0.

    Deterministic: the batcher waits up to ten minutes for a full batch of 27 rows, so the
    16 requests (24 items) stay queued until a 17th request (3 items), whose body is held
    half-sent, completes the batch, and its body is only let through after SIGTERM."""
    srv = start_server(
        llama_rm,
        *("--max-wait-ms", "600000", "--max-batch-size", "27", "--max-batch-tokens", "65536"),
        *("--score-cache-size", "0"),  # 27 rows, whether or not two items are identical
    )
    try:
        pool: Pool = build_pool(llama_rm, seed=11, texts=15, pairs=6, conversations=6)
        requests: list[tuple[str, dict[str, Any], str, list[float]]] = []
        for j in range(2):  # two requests of three items in each form
            sl, tl = slice(3 * j, 3 * j + 3), slice(6 + 3 * j, 9 + 3 * j)
            pair = {"queries": pool.queries[sl], "responses": pool.responses[sl]}
            convs = {"conversations": pool.conversations[sl]}
            requests += [
                ("/score", {"texts": pool.texts[sl]}, "scores", pool.text_ref[sl]),
                ("/score", pair, "scores", pool.pair_ref[sl]),
                ("/score", convs, "scores", pool.conv_ref[sl]),
                ("/get_reward", {"query": pool.texts[tl]}, "rewards", pool.text_ref[tl]),
            ]
        srv.wait_ready(90)
        answers: list[httpx.Response | None] = [None] * len(requests)

        def send(i: int) -> None:
            path, body, _, _ = requests[i]
            answers[i] = httpx.post(f"{srv.url}{path}", json=body, timeout=120)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(requests))]
        for t in threads:
            t.start()
        wait_until(
            lambda: metric(srv.url, "reward_server_queue_items") == 24, 60, "24 items queued"
        )
        last = HeldRequest(f"{srv.url}/score", {"texts": pool.texts[12:15]})
        n = len(requests) + 1
        wait_until(lambda: _in_progress(srv.url) == n, 60, f"{n} requests in flight")
        assert answers == [None] * len(requests) and not last.done  # all still in flight
        srv.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "draining" in srv.log(), 60, "the server to begin draining")
        last.release()  # the batch is full now: it runs, though the server is draining
        code = srv.proc.wait(timeout=120)
        held = last.result()
        for t in threads:
            t.join(timeout=120)
        log = srv.log()
    finally:
        srv.stop(signal.SIGKILL)
        srv.log_path.unlink(missing_ok=True)
    assert code == 0, log
    for (_, _, key, want), r in zip(requests, answers, strict=True):
        assert r is not None and r.status_code == 200, r and r.text
        assert r.json()[key] == pytest.approx(want, abs=TOL)
    assert held.status_code == 200, held.text
    assert held.json()["scores"] == pytest.approx(pool.text_ref[12:15], abs=TOL)
    with pytest.raises(httpx.ConnectError):  # and it is really gone
        httpx.get(f"{srv.url}/health", timeout=3)
