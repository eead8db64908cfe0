"""The trainer's own pattern against in process: one client, requests of 64 texts back to back.

A PPO or GRPO trainer scores its rollouts chunk by chunk through one
:class:`~reward_client.RewardClient` and waits for each answer. The reference, L64, is
what the model does in process on the same 64-text chunks: each chunk tokenized, sorted by
length and scored in batches of one size (the best of a small sweep), as L in
:mod:`bench.throughput`. Measured alongside, to tell where a loss comes from: the same texts
in one request, and two clients each sending chunks of 64 back to back.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.common import model_server_env, summary

logger = logging.getLogger(__name__)

#: The ratio the server must reach against L64 with one client (issue 12).
TARGET = 0.90


@dataclass
class TrainerPatternConfig:
    """Sizes of the trainer-pattern measurement."""

    model_path: str
    n_texts: int = 256
    chunk: int = 64
    min_tokens: int = 8
    max_tokens: int = 256
    batch_sizes: tuple[int, ...] = (4, 8, 16)
    rounds: int = 3
    seed: int = 0
    torch_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    server_args: tuple[str, ...] = ()


def _chunks(texts: Sequence[str], size: int) -> list[list[str]]:
    return [list(texts[i : i + size]) for i in range(0, len(texts), size)]


def inprocess_chunks(scorer: Any, chunks: Sequence[Sequence[str]], batch_size: int) -> float:
    """L64: texts/s of the chunks scored in process one after the other (tokenization in)."""
    seconds = sum(scorer.run(chunk, batch_size)["seconds"] for chunk in chunks)
    return sum(len(c) for c in chunks) / seconds


def back_to_back(client: Any, chunks: Sequence[Sequence[str]]) -> float:
    """Texts/s of one client sending the chunks one after the other, each awaited."""
    started = time.perf_counter()
    for chunk in chunks:
        client.score(texts=list(chunk))
    return sum(len(c) for c in chunks) / (time.perf_counter() - started)


def one_request(client: Any, texts: Sequence[str]) -> float:
    """Texts/s of all texts in one call (one request up to the server's max_client_batch)."""
    started = time.perf_counter()
    client.score(texts=list(texts))
    return len(texts) / (time.perf_counter() - started)


def two_clients(clients: Sequence[Any], chunks: Sequence[Sequence[str]]) -> float:
    """Texts/s of two clients, each sending every other chunk back to back."""
    started = time.perf_counter()
    errors: list[BaseException] = []

    def work(client: Any, mine: Sequence[Sequence[str]]) -> None:
        try:
            for chunk in mine:
                client.score(texts=list(chunk))
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    threads = [
        threading.Thread(target=work, args=(c, chunks[i :: len(clients)]))
        for i, c in enumerate(clients)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(len(c) for c in chunks) / (time.perf_counter() - started)


def run_trainer_pattern(cfg: TrainerPatternConfig) -> dict[str, Any]:
    """L64 and the server under the trainer's pattern, in turns round by round."""
    from bench.models import make_texts
    from bench.throughput import InProcessScorer
    from reward_client import RewardClient
    from reward_server.launcher import running_server

    scorer = InProcessScorer(cfg.model_path, cfg.torch_threads)
    texts, tokens = make_texts(
        scorer.tokenizer,
        cfg.n_texts,
        min_tokens=cfg.min_tokens,
        max_tokens=cfg.max_tokens,
        seed=cfg.seed + 11,
    )
    chunks = _chunks(texts, cfg.chunk)
    env = model_server_env(cfg.torch_threads)
    ref, one, single, two = (
        f"L{cfg.chunk}",
        f"1 client x {cfg.chunk}",
        "1 request",
        f"2 clients x {cfg.chunk}",
    )
    rates: dict[str, list[float]] = {ref: [], one: [], single: [], two: []}
    with (
        running_server(cfg.model_path, *cfg.server_args, env=env, timeout=180) as server,
        RewardClient(server.url, timeout=600.0) as client,
        RewardClient(server.url, timeout=600.0) as second,
    ):
        scorer.warm_up(texts)
        # Every chunk once: the server's batcher fits its pass-cost model on its first
        # passes and cuts windows at the limits until then (a trainer's steady state is
        # many calls); the second client's connection too.
        back_to_back(client, chunks)
        second.score(texts=chunks[0])
        sweep = {
            bs: max(inprocess_chunks(scorer, chunks, bs) for _ in range(2))
            for bs in cfg.batch_sizes
        }
        best_bs = max(sweep, key=lambda bs: sweep[bs])
        logger.info("trainer pattern: %s sweep %s, best batch size %d", ref, sweep, best_bs)
        for rnd in range(cfg.rounds):
            rates[ref].append(inprocess_chunks(scorer, chunks, best_bs))
            rates[one].append(back_to_back(client, chunks))
            rates[single].append(one_request(client, texts))
            rates[two].append(two_clients((client, second), chunks))
            logger.info(
                "trainer pattern round %d: %s",
                rnd + 1,
                ", ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items()),
            )
    ratios = {
        f"{name} / {ref}": summary(x / y for x, y in zip(vals, rates[ref], strict=True))
        for name, vals in rates.items()
        if name != ref
    }
    value = ratios[f"{one} / {ref}"]
    return {
        "config": {k: v for k, v in asdict(cfg).items() if k != "model_path"},
        "text_tokens": {"n": len(tokens), "mean": sum(tokens) / len(tokens)},
        "sweep": {str(bs): rate for bs, rate in sweep.items()},
        "best_batch_size": best_bs,
        "texts_per_s": {name: summary(vals) for name, vals in rates.items()},
        "ratios": ratios,
        "targets": [
            {
                "name": f"trainer pattern: 1 client x {cfg.chunk} texts back to back / L{cfg.chunk}",
                "value": value,
                "op": ">=",
                "threshold": TARGET,
                "holds": bool(value["median"] >= TARGET),
            }
        ],
    }
