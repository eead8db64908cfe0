"""Load on a server: a seeded pool of mixed inputs (texts, pairs, conversations) with each
item's reference score computed in process, and the server's own counts from /metrics."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch

from reward_server.engines.transformers import RewardModel
from tiny_models import make_corpus

# --------------------------------------------------------------------------- reference pool


@dataclass
class Pool:
    """Texts, pairs and conversations with their reference scores, keyed by position."""

    texts: list[str]
    queries: list[str]
    responses: list[str]
    conversations: list[list[dict[str, str]]]
    text_ref: list[float]
    pair_ref: list[float]
    conv_ref: list[float]


def _one_by_one(model: RewardModel, rendered: Sequence[str]) -> list[float]:
    """Reference scores: each item alone (no padding, no neighbours)."""
    encoded = model.encode(list(rendered), truncate=True)
    return [model.score_batch([e.input_ids])[0] for e in encoded]


def build_pool(
    model_path: Path, seed: int = 7, *, texts: int = 160, pairs: int = 80, conversations: int = 60
) -> Pool:
    """A seeded pool of mixed-length inputs and their in-process reference scores."""
    rng = random.Random(seed)
    text_list = make_corpus(texts, seed=seed, min_words=1, max_words=120)
    queries = make_corpus(pairs, seed=seed + 1, min_words=1, max_words=30)
    responses = make_corpus(pairs, seed=seed + 2, min_words=1, max_words=60)
    conv_list = []
    for turn in make_corpus(conversations, seed=seed + 3, min_words=1, max_words=40):
        conv = [{"role": "user", "content": turn}]
        if rng.random() < 0.5:
            conv.insert(0, {"role": "system", "content": "be kind"})
        conv.append({"role": "assistant", "content": " ".join(reversed(turn.split()))})
        conv_list.append(conv)
    # One thread: tiny models run fastest so, and torch's spinning worker threads would
    # otherwise starve a server process starting next to this one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = RewardModel.load(str(model_path), dtype="float32", device="cpu")
        return Pool(
            texts=text_list,
            queries=queries,
            responses=responses,
            conversations=conv_list,
            text_ref=_one_by_one(model, text_list),
            pair_ref=_one_by_one(model, model.render_pairs(queries, responses)),
            conv_ref=_one_by_one(model, model.render_conversations(conv_list)),
        )
    finally:
        torch.set_num_threads(threads)


# --------------------------------------------------------------------------- metrics scrape


def scrape(url: str) -> dict[str, float]:
    """The server's Prometheus samples, ``name{labels}`` -> value."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def items_scored(samples: dict[str, float]) -> dict[str, float]:
    """Items scored per endpoint (``reward_server_items_total``)."""
    out = {}
    for name, value in samples.items():
        m = re.fullmatch(r'reward_server_items_total\{endpoint="([^"]+)"\}', name)
        if m:
            out[m.group(1)] = value
    return out
