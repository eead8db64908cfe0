"""A fake scorer at the model seam of an in-process app: deterministic scores (one token per
character, position-weighted), a poison token that makes its batch fail, an optional gate that
holds a forward pass; and the settings of an app that serves it."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from reward_server.config import ServerSettings
from reward_server.errors import ChatTemplateError, TextTooLongError
from reward_server.text.rendering import Encoded

POISON = "\N{SKULL}"  # a text holding it makes the fake scorer's whole batch fail
SECRET_DETAIL = "secret internal detail"


class FakeModel:
    """A deterministic stand-in for RewardModel: one token per character."""

    name = "fake-rm"
    adapter = None
    architecture = "FakeForSequenceClassification"
    num_labels = 1
    label_index = 0
    truncation_side = "left"
    dtype = "float32"
    device = "cpu"
    is_decoder = True

    def __init__(self, *, max_length: int = 64, has_chat_template: bool = True) -> None:
        self.max_length = max_length
        self.has_chat_template = has_chat_template
        self.gate: threading.Event | None = None  # when set, forward passes wait for it
        self.entered = threading.Event()  # set when a forward pass has started
        self.batches: list[int] = []  # rows of every forward pass
        self.nan = False

    def render_pairs(self, queries: Sequence[str], responses: Sequence[str]) -> list[str]:
        return [f"{q}>{r}" for q, r in zip(queries, responses, strict=True)]

    def render_conversations(
        self, conversations: Sequence[Sequence[Mapping[str, str]]]
    ) -> list[str]:
        if not self.has_chat_template:
            raise ChatTemplateError("model 'fake-rm' has no chat template")
        return ["|".join(f"{m['role']}:{m['content']}" for m in conv) for conv in conversations]

    def encode(self, texts: Sequence[str], *, truncate: bool) -> list[Encoded]:
        out = []
        for i, text in enumerate(texts):
            ids = [ord(c) for c in text]
            cut = len(ids) > self.max_length
            if cut and not truncate:
                raise TextTooLongError(i, len(ids), self.max_length)
            if cut:
                ids = ids[-self.max_length :]
            out.append(Encoded(input_ids=ids, truncated=cut, num_tokens=len(ids)))
        return out

    def score_batch(self, batch: Sequence[Sequence[int]]) -> list[float]:
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(timeout=30), "test never released the gate"
        self.batches.append(len(batch))
        if any(ord(POISON) in row for row in batch):
            raise RuntimeError(SECRET_DETAIL)
        if self.nan:
            return [float("nan")] * len(batch)
        return [fake_score_ids(row) for row in batch]

    def info(self) -> dict[str, object]:
        return {
            "model": self.name,
            "adapter": self.adapter,
            "architecture": self.architecture,
            "num_labels": self.num_labels,
            "label_index": self.label_index,
            "max_length": self.max_length,
            "truncation_side": self.truncation_side,
            "dtype": self.dtype,
            "device": self.device,
            "chat_template": self.has_chat_template,
        }


def fake_score_ids(ids: Sequence[int]) -> float:
    """The fake's score of one row: position-weighted, so order matters."""
    return sum((i + 1) * t for i, t in enumerate(ids)) / 1000.0


def fake_score(text: str) -> float:
    """The fake's score of an untruncated text."""
    return fake_score_ids([ord(c) for c in text])


def settings(**overrides: Any) -> ServerSettings:
    """Settings for an in-process app (no flags, no env)."""
    return ServerSettings(**{"model": "fake-rm", "max_wait_ms": 1.0, **overrides})
