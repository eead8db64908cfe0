"""Load: 64 concurrent clients, mixed request sizes and forms, every score checked.

One test, parametrised by duration: a short run in ``make test`` and a long one marked
``soak`` for ``make soak`` (``RELIABILITY_SOAK_SECONDS``, default 600). Every answer is
compared with a per-item reference computed once in process (the same reward model, one
item at a time, no padding), the server's own item counters must equal what the clients
sent (nothing lost or scored twice), and no request is left in progress. The soak also
bounds the server's resident memory after the run to within 10% of its level after warm-up
(over minutes of load a leak shows there; a few seconds of load cannot tell one from the
allocator's noise, so the short run does not measure it).

Also here: a queue that is too small for the load answers 429 with ``Retry-After``, and the
reward client's retries bring every request through.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from helpers.load import Pool, build_pool, items_scored, scrape
from server_proc import ServerProcess, running_server, start_server, wait_until

from reward_client import AsyncRewardClient, RetryPolicy, RewardClient

CLIENTS = 64
TOL = 1e-5
SHORT_SECONDS = 8.0
SOAK_SECONDS = float(os.environ.get("RELIABILITY_SOAK_SECONDS", "600"))
#: Where the soak run writes its figures (the README's Reliability section quotes them).
REPORT = os.environ.get("RELIABILITY_REPORT", "runs/reliability/soak.json")
#: The server answers at most this many items a request; larger client calls are split.
MAX_CLIENT_BATCH = 32

logger = logging.getLogger(__name__)


def error_answers(samples: dict[str, float]) -> float:
    """Error answers the server gave so far, of any status (``reward_server_errors_total``)."""
    return sum(v for k, v in samples.items() if k.startswith("reward_server_errors_total{"))


def rss(proc: psutil.Process) -> int:
    """Resident set size in bytes."""
    return int(proc.memory_info().rss)


# --------------------------------------------------------------------------- load generator


@dataclass
class Tally:
    """What the clients did and saw."""

    requests: int = 0
    items: int = 0
    errors: int = 0
    wrong: int = 0
    verified: int = 0
    by_form: Counter[str] = field(default_factory=Counter)
    items_by_endpoint: Counter[str] = field(default_factory=Counter)
    first_problems: list[str] = field(default_factory=list)

    def problem(self, text: str) -> None:
        if len(self.first_problems) < 10:
            self.first_problems.append(text)


FORMS = ("texts", "pairs", "conversations", "get_reward", "client")


def _check(tally: Tally, form: str, got: Sequence[float], want: Sequence[float]) -> None:
    if len(got) != len(want):
        tally.wrong += len(want)
        tally.problem(f"{form}: {len(got)} scores for {len(want)} items")
        return
    for g, w in zip(got, want, strict=True):
        if isinstance(g, float) and math.isfinite(g) and abs(g - w) <= TOL * max(1.0, abs(w)):
            tally.verified += 1
        else:
            tally.wrong += 1
            tally.problem(f"{form}: score {g!r}, reference {w!r}")


async def _one_request(
    http: httpx.AsyncClient,
    client: AsyncRewardClient,
    url: str,
    pool: Pool,
    rng: random.Random,
    tally: Tally,
) -> None:
    """Send one request of a random form and size; check every score against the pool."""
    form = rng.choice(FORMS)
    # Mostly small requests, sometimes large ones (the client call splits past 32 items).
    n = rng.choice((1, 1, 2, 3, 5, 8, 13, 21, 32)) if form != "client" else rng.randint(1, 100)
    tally.requests += 1
    tally.by_form[form] += 1
    tally.items += n
    try:
        if form == "texts":
            idx = [rng.randrange(len(pool.texts)) for _ in range(n)]
            body: dict[str, Any] = {"texts": [pool.texts[i] for i in idx]}
            want, path, key = [pool.text_ref[i] for i in idx], "/score", "scores"
        elif form == "pairs":
            idx = [rng.randrange(len(pool.queries)) for _ in range(n)]
            body = {
                "queries": [pool.queries[i] for i in idx],
                "responses": [pool.responses[i] for i in idx],
            }
            want, path, key = [pool.pair_ref[i] for i in idx], "/score", "scores"
        elif form == "conversations":
            idx = [rng.randrange(len(pool.conversations)) for _ in range(n)]
            body = {"conversations": [pool.conversations[i] for i in idx]}
            want, path, key = [pool.conv_ref[i] for i in idx], "/score", "scores"
        elif form == "get_reward":
            idx = [rng.randrange(len(pool.texts)) for _ in range(n)]
            body = {"query": [pool.texts[i] for i in idx]}
            want, path, key = [pool.text_ref[i] for i in idx], "/get_reward", "rewards"
        else:
            idx = [rng.randrange(len(pool.queries)) for _ in range(n)]
            got = await client.score(
                queries=[pool.queries[i] for i in idx], responses=[pool.responses[i] for i in idx]
            )
            tally.items_by_endpoint["/score"] += n
            _check(tally, form, got, [pool.pair_ref[i] for i in idx])
            return
        r = await http.post(url + path, json=body)
        if r.status_code != 200:
            tally.errors += 1
            tally.problem(f"{form}: HTTP {r.status_code} {r.text[:200]}")
            return
        tally.items_by_endpoint[path] += n
        _check(tally, form, r.json()[key], want)
    except Exception as exc:  # any failure of a request is an error of the run
        tally.errors += 1
        tally.problem(f"{form}: {type(exc).__name__}: {exc}")


async def _drive(url: str, pool: Pool, seconds: float, seed: int, tally: Tally) -> None:
    """``CLIENTS`` concurrent clients, each sending requests back to back until time is up."""
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)

    async def one_client(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        async with AsyncRewardClient(url, timeout=120, max_retries=0) as client:
            while time.monotonic() < deadline:
                await _one_request(http, client, url, pool, rng, tally)

    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        await asyncio.gather(*(one_client(k) for k in range(CLIENTS)))


def run_load(url: str, pool: Pool, seconds: float, seed: int) -> Tally:
    """Run the clients for ``seconds`` (bounded: each request has a 120 s timeout)."""
    tally = Tally()
    asyncio.run(_drive(url, pool, seconds, seed, tally))
    return tally


# --------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def pool(llama_rm: Path) -> Pool:
    return build_pool(llama_rm)


@pytest.fixture
def load_server(llama_rm: Path, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    # The Llama-like model has a chat template, so every input form is valid.
    server = start_server(llama_rm, "--max-client-batch", str(MAX_CLIENT_BATCH))
    try:
        request.getfixturevalue("pool")  # computed while the server loads
        server.wait_ready(90)
        yield server
    finally:
        server.stop()
        server.log_path.unlink(missing_ok=True)


@pytest.mark.parametrize(
    "seconds",
    [
        pytest.param(SHORT_SECONDS, id="short"),
        pytest.param(
            SOAK_SECONDS,
            id="soak",
            marks=[pytest.mark.soak, pytest.mark.slow, pytest.mark.timeout(SOAK_SECONDS + 600)],
        ),
    ],
)
def test_concurrent_clients_mixed_load(
    load_server: ServerProcess, pool: Pool, seconds: float
) -> None:
    server = load_server
    proc = psutil.Process(server.proc.pid)
    start = scrape(server.url)
    before = items_scored(start)

    # Warm-up with the same load: allocator pools, tokenizer caches and every batch shape
    # reach their steady state before the baseline is taken.
    warm_seconds = min(max(seconds * 0.25, 2.5), 60.0)
    warm = run_load(server.url, pool, warm_seconds, seed=1)
    assert warm.errors == 0 and warm.wrong == 0, warm.first_problems
    rss_warm = rss(proc)

    begin = time.monotonic()
    tally = run_load(server.url, pool, seconds, seed=2)
    elapsed = time.monotonic() - begin
    rss_after = rss(proc)
    end = scrape(server.url)
    after = items_scored(end)

    assert tally.errors == 0, tally.first_problems
    assert tally.wrong == 0, tally.first_problems
    assert tally.verified == tally.items
    assert error_answers(end) == error_answers(start) == 0  # not one error answer
    assert set(tally.by_form) == set(FORMS), tally.by_form
    # The server scored exactly what the clients sent: nothing lost, nothing twice.
    for endpoint in ("/score", "/get_reward"):
        sent = warm.items_by_endpoint[endpoint] + tally.items_by_endpoint[endpoint]
        assert after.get(endpoint, 0) - before.get(endpoint, 0) == sent, endpoint
    assert scrape(server.url).get('reward_server_requests_in_progress{endpoint="/score"}') == 0
    drift = (rss_after - rss_warm) / rss_warm
    if seconds >= SOAK_SECONDS:
        assert abs(drift) <= 0.10, (rss_warm, rss_after)
    assert server.proc.poll() is None
    assert httpx.get(f"{server.url}/health").status_code == 200

    figures = {
        "clients": CLIENTS,
        "duration_s": round(elapsed, 1),
        "warmup_s": round(warm_seconds, 1),
        "requests": tally.requests,
        "items": tally.items,
        "errors": tally.errors,
        "scores_verified": tally.verified,
        "requests_by_form": dict(tally.by_form),
        "rss_after_warmup_mib": round(rss_warm / 2**20, 1),
        "rss_after_run_mib": round(rss_after / 2**20, 1),
        "memory_drift_pct": round(100 * drift, 2),
        "model": "tiny Llama-like reward model (2 layers, hidden 32), float32, CPU",
        "cpus": os.cpu_count(),
    }
    logger.info("load run: %s", json.dumps(figures))
    print(json.dumps(figures, indent=2))
    if seconds >= SOAK_SECONDS:
        report = Path(REPORT)
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- queue full


def test_queue_full_gives_429_and_client_retries_bring_everything_through(
    llama_rm: Path, pool: Pool
) -> None:
    """Deterministic: the batcher waits up to ten minutes for a full batch of 32 rows and the
    queue holds 32 items, so 31 queued items refuse every 8-item request until one more
    item fills the batch; nothing depends on how fast requests arrive."""
    rng = random.Random(5)

    def texts_and_refs(n: int) -> tuple[list[str], list[float]]:
        idx = [rng.randrange(len(pool.texts)) for _ in range(n)]
        return [pool.texts[i] for i in idx], [pool.text_ref[i] for i in idx]

    queue_full = 'reward_server_errors_total{status="429",type="queue_full"}'
    args = ("--max-queue", "32", "--max-batch-size", "32", "--max-batch-tokens", "65536")
    args += ("--max-client-batch", "8", "--max-wait-ms", "600000")
    # Items are drawn with replacement: without the score cache each one is a queued row.
    args += ("--score-cache-size", "0")
    with running_server(llama_rm, *args) as server, ThreadPoolExecutor(16) as threads:

        def raw(texts: list[str]) -> httpx.Response:
            with httpx.Client(timeout=120) as http:
                return http.post(f"{server.url}/score", json={"texts": texts})

        def queued() -> float:
            return scrape(server.url)["reward_server_queue_items"]

        def fill_31() -> list[tuple[Any, list[float]]]:
            """31 items waiting (8 + 8 + 8 + 7), one short of a batch."""
            held = []
            for n in (8, 8, 8, 7):
                texts, want = texts_and_refs(n)
                held.append((threads.submit(raw, texts), want))
            wait_until(lambda: queued() == 31, 60, "31 items queued")
            return held

        def fill_the_batch() -> None:
            texts, want = texts_and_refs(1)
            r = raw(texts)
            assert r.status_code == 200 and r.json()["scores"] == pytest.approx(want, abs=TOL)

        # Raw requests: with 31 items queued, each 8-item request is refused whole.
        held = fill_31()
        refused = [raw(texts_and_refs(8)[0]) for _ in range(3)]
        for r in refused:
            assert r.status_code == 429, r.text
            assert int(r.headers["Retry-After"]) >= 1
            assert r.json()["type"] == "queue_full"
            assert "retry" in r.json()["error"]
        assert queued() == 31  # nothing of a refused request was admitted
        fill_the_batch()
        for future, want in held:
            r = future.result(timeout=120)
            assert r.status_code == 200, r.text
            assert r.json()["scores"] == pytest.approx(want, abs=TOL)
        assert queued() == 0

        # The same through RewardClient: 8 calls of 8 items meet 429s while 31 items wait;
        # once the batch is filled, their retries (honouring Retry-After, capped at 1 s to
        # keep the test short) bring every call through in two full batches, right.
        def through_client(texts: list[str]) -> list[float]:
            policy = RetryPolicy(max_retries=200, max_retry_after=1.0)
            with RewardClient(server.url, timeout=120, retry=policy) as c:
                return c.score(texts=texts)

        held = fill_31()
        refusals = scrape(server.url).get(queue_full, 0.0)
        calls = [texts_and_refs(8) for _ in range(8)]
        results = [threads.submit(through_client, texts) for texts, _ in calls]
        wait_until(
            lambda: scrape(server.url).get(queue_full, 0.0) >= refusals + len(calls),
            60,
            "every client call to meet a 429",
        )
        assert not any(f.done() for f in results)
        fill_the_batch()
        for future, want in held:
            assert future.result(timeout=120).json()["scores"] == pytest.approx(want, abs=TOL)
        for future, (_, want) in zip(results, calls, strict=True):
            assert future.result(timeout=300) == pytest.approx(want, abs=TOL)
        assert queued() == 0
