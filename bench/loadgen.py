"""Closed-loop async HTTP load generator, run in its own process by the benchmark.

``python -m bench.loadgen --url URL --texts FILE --clients C --per-request K ...`` starts ``C``
client tasks on one ``httpx.AsyncClient``; each sends ``POST /score {"texts": [...K texts]}``
and, as soon as the answer arrives, the next request. Texts are taken in order from the
file (cycling), so every server sees the same sequence. After a warm-up (at least
``--warmup`` seconds *and* every client answered once, so deep queues reach their steady
state) a window of ``--duration`` seconds is measured: texts/s of requests answered in the
window, latency percentiles, and, with ``--metrics``, the server's Prometheus counters at
both ends of the window. Requests still in flight at the end are abandoned (the connection
closes, and the reward server drops their queued work). One JSON object goes to stdout.

This process never imports torch: it costs the machine only what an HTTP client costs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench.common import cpu_seconds, parse_prometheus, percentile

#: The server counters read at both ends of the window (Prometheus names).
SERVER_COUNTERS = (
    "reward_server_tokens_total",
    "reward_server_batch_padded_tokens_total",
    "reward_server_batch_rows_sum",
    "reward_server_batch_rows_count",
    "reward_server_inference_seconds_sum",
    "reward_server_queue_wait_seconds_sum",
    "reward_server_queue_wait_seconds_count",
    "reward_server_batch_padding_efficiency_sum",
    "reward_server_batch_padding_efficiency_count",
)


@dataclass(slots=True)
class _Record:
    start: float
    end: float
    first: int
    n: int
    ok: bool
    real_tokens: int
    padded_tokens: int


async def _scrape(client: httpx.AsyncClient) -> dict[str, float]:
    """The server's counters of interest (empty when it has none).

    ``texts_scored`` is the texts its model has finished: the reward server's rows over all
    forward passes, or the naive server's ``/stats`` count.
    """
    try:
        response = await client.get("/metrics", timeout=30)
        if response.status_code == 200:
            samples = parse_prometheus(response.text)
            out = {name: samples.get(name, 0.0) for name in SERVER_COUNTERS}
            out["texts_scored"] = out["reward_server_batch_rows_sum"]
            return out
        response = await client.get("/stats", timeout=30)
        if response.status_code == 200:
            stats = response.json()
            return {"texts_scored": float(stats["texts"]), "server_time": float(stats["time"])}
    except (httpx.HTTPError, ValueError, KeyError):
        pass
    return {}


async def run_load(
    url: str,
    texts: list[str],
    tokens: list[int],
    *,
    clients: int,
    per_request: int,
    warmup: float,
    duration: float,
    max_warmup: float = 300.0,
    metrics: bool = False,
    offset: int = 0,
    samples: bool = False,
    timeout: float = 600.0,
) -> dict[str, Any]:
    """Drive the server at ``url`` and return the window's figures."""
    cycle = len(texts)
    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=clients + 2)
    records: list[_Record] = []
    answered = [False] * clients
    errors: dict[str, int] = {}
    stop = False
    counter = offset

    async with httpx.AsyncClient(
        base_url=url, limits=limits, timeout=httpx.Timeout(timeout)
    ) as client:

        async def worker(i: int) -> None:
            nonlocal counter
            while not stop:
                k = counter
                counter += 1
                idxs = [(k * per_request + j) % cycle for j in range(per_request)]
                body = {"texts": [texts[j] for j in idxs]}
                lengths = [tokens[j] for j in idxs]
                t0 = time.perf_counter()
                ok = False
                try:
                    response = await client.post("/score", json=body)
                    ok = (
                        response.status_code == 200
                        and len(response.json().get("scores", ())) == per_request
                    )
                    if not ok:
                        key = str(response.status_code)
                        errors[key] = errors.get(key, 0) + 1
                except httpx.HTTPError as exc:
                    key = type(exc).__name__
                    errors[key] = errors.get(key, 0) + 1
                t1 = time.perf_counter()
                records.append(
                    _Record(
                        t0,
                        t1,
                        idxs[0],
                        per_request,
                        ok,
                        sum(lengths),
                        max(lengths) * per_request,
                    )
                )
                answered[i] = True

        begin = time.perf_counter()
        cpu0 = cpu_seconds()
        tasks = [asyncio.create_task(worker(i)) for i in range(clients)]
        try:
            while True:
                await asyncio.sleep(0.01)
                elapsed = time.perf_counter() - begin
                if (elapsed >= warmup and all(answered)) or elapsed >= max_warmup:
                    break
            warmup_s = time.perf_counter() - begin
            before = await _scrape(client) if metrics else {}
            w0 = time.perf_counter()
            first_record = len(records)
            await asyncio.sleep(duration)
            w1 = time.perf_counter()
            after = await _scrape(client) if metrics else {}
        finally:
            stop = True
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)
        cpu1 = cpu_seconds()

    window = [r for r in records[first_record:] if w0 <= r.end <= w1]
    good = [r for r in window if r.ok]
    latencies = [(r.end - r.start) * 1000.0 for r in good]
    span = w1 - w0
    result: dict[str, Any] = {
        "clients": clients,
        "per_request": per_request,
        "window_s": span,
        "warmup_s": warmup_s,
        "requests": len(good),
        "texts": sum(r.n for r in good),
        "failed": len(window) - len(good),
        "errors": errors,
        "texts_per_s": sum(r.n for r in good) / span if span > 0 else 0.0,
        "latency_ms": {
            "p50": percentile(latencies, 50),
            "p99": percentile(latencies, 99),
            "mean": sum(latencies) / len(latencies) if latencies else float("nan"),
        },
        # What a server that pads each request to its own longest text runs (naive server):
        # the mean over requests (= forward passes there) of real / padded tokens.
        "request_padding_efficiency": (
            min(1.0, sum(r.real_tokens / r.padded_tokens for r in good) / len(good))
            if good
            else float("nan")
        ),
        "loadgen_cpu_s": cpu1 - cpu0,
        "server_counters": {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        if metrics and after and before
        else {},
    }
    if samples:
        result["samples"] = [[r.first, (r.end - r.start) * 1000.0] for r in good]
    return result


def main(argv: list[str] | None = None) -> int:
    """CLI: run one load configuration and print its JSON result."""
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument(
        "--texts", required=True, help='JSON file {"texts": [...], "tokens": [...]}'
    )
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--per-request", type=int, default=1)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--max-warmup", type=float, default=300.0)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--offset", type=int, default=0, help="first request's position")
    parser.add_argument(
        "--metrics", action="store_true", help="diff the server's /metrics (or /stats)"
    )
    parser.add_argument("--samples", action="store_true", help="return (text, latency) pairs")
    args = parser.parse_args(argv)
    with open(args.texts, encoding="utf-8") as f:
        data = json.load(f)
    result = asyncio.run(
        run_load(
            args.url,
            data["texts"],
            data["tokens"],
            clients=args.clients,
            per_request=args.per_request,
            warmup=args.warmup,
            duration=args.duration,
            max_warmup=args.max_warmup,
            metrics=args.metrics,
            offset=args.offset,
            samples=args.samples,
        )
    )
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
