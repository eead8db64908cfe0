"""The score cache: a served model's value for exact token ids, kept across requests (an LRU
bounded by entries and bytes) and computed once for identical rows of one request or of
requests in flight at the same time (:meth:`ScoreCache.in_flight`).

What is cached is the row value a model's scheduler gives back for one row of token ids
(a sequence model's logit or row of logits, a process model's per-token step scores, a
judge's expected score-token value or greedy answer), never a finished answer: the served
model turns cached values into results exactly as it turns fresh ones, from the request's
own tokenized items, so a cached item's score, logits, step scores, ``truncated`` flag and
token count are those a fresh pass would give (the value itself is the float the pass
gave the first time, bit for bit).

A key is the served model's :class:`ModelIdentity` (as a digest) followed by the exact
token ids: two rows share an entry only when the same model, loaded the same way, read the
same ids. Plain data and the standard library only: no torch, no HTTP; one instance per
service, used from the event loop alone (no lock).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from reward_server.config.entries import GenerateJudge, RubricJudge
from reward_server.config.models_file import ModelSpec
from reward_server.scoring.metrics import CacheState

__all__ = [
    "ENTRY_OVERHEAD_BYTES",
    "MISS",
    "ModelIdentity",
    "ScoreCache",
    "caches_kind",
    "local_fingerprint",
    "model_identity",
]

logger = logging.getLogger(__name__)

#: What :meth:`ScoreCache.get` gives back when the key is not cached (None is no value).
MISS: Final = object()

#: Bytes counted for each entry on top of its key's and value's payload: the dict slot, the
#: LRU links and the object headers of the key and value (CPython, 64-bit: about 200).
ENTRY_OVERHEAD_BYTES = 200

#: Entry fields that do not change a row's value (how its score counts, what it is called).
_PRESENTATION_KEYS = {"name", "weight", "normalize"}

#: A value as a scheduler gives it back: a float, a row of floats, or a generated answer.
Value = float | list[float] | str


def caches_kind(spec: ModelSpec) -> bool:
    """Whether a model of this entry is cached (and its identical rows deduplicated).

    ``sequence``, ``process`` and ``judge`` in ``logprobs`` mode run one deterministic
    forward pass per row: cached. A judge in ``mode: generate`` (or a rubric judge) is cached when greedy
    (``temperature: 0``) and not when it samples: a duplicate or repeated item must draw a
    sample of its own, not the first one's. Verifiers and ``kind: remote`` never reach this
    cache (their served models do not use it): a verifier reads text and label, not token
    ids, and is cheap or deliberately impure (a python function); a remote service owns its
    model, which may change under it, and its own caching.
    """
    if spec.kind in ("sequence", "process"):
        return True
    if isinstance(spec, GenerateJudge | RubricJudge):
        return spec.temperature == 0  # a rubric judge's logprobs verdicts: 0 too
    return spec.kind == "judge"


@dataclass(frozen=True, slots=True)
class ModelIdentity:
    """Everything that decides what a served model gives for given token ids.

    ``revision``: for a hub id, the snapshot commit the local hub cache resolves; for a local
    folder, ``files:`` and a SHA-256 over its files' names, sizes and modification times
    (:func:`local_fingerprint`). Not a hash of the weights: reading every weight file at
    start-up costs seconds to minutes for a large model, while a changed checkpoint (a new
    save, a copied-in file) changes a size or a modification time. The cache lives in the
    process and a model is loaded once per process, so within one server the identity
    chiefly tells apart models that share a cache; it is complete so that it stays right
    wherever keys are compared. ``facts``: the loaded model's own facts (its engine's
    ``info()``: resolved dtype, device, max length, truncation side, label index, labels,
    score tokens, generation settings, vLLM's settings) and the models-file entry's settings
    (step settings, judge template and mode, objectives, ...) as sorted JSON.
    """

    model: str
    revision: str | None
    adapter: str | None
    adapter_revision: str | None
    engine: str
    facts: str

    def digest(self) -> bytes:
        """A SHA-256 of every field: the prefix of this model's keys."""
        text = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).digest()


def local_fingerprint(folder: Path) -> str:
    """``files:`` and a SHA-256 over the names, sizes and modification times (ns) of every
    file under ``folder`` (relative names, sorted; hidden entries skipped)."""
    h = hashlib.sha256()
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            if name.startswith("."):
                continue
            path = Path(root, name)
            try:
                st = path.stat()
            except OSError:
                continue
            h.update(f"{path.relative_to(folder)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return "files:" + h.hexdigest()


def _hub_revision(repo_id: str) -> str | None:
    """The snapshot commit of ``repo_id`` in the local hub cache (what an offline load reads),
    or None when it cannot be told."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - installed with transformers
        return None
    try:
        found = try_to_load_from_cache(repo_id, "config.json")
    except Exception:  # a malformed id: the revision stays unknown
        return None
    if not isinstance(found, str):
        return None
    parts = Path(found).parts
    # <cache>/models--org--name/snapshots/<commit>/config.json
    if len(parts) >= 3 and parts[-3] == "snapshots":
        return "commit:" + parts[-2]
    return None


def _revision(source: str | None) -> str | None:
    """The revision of a model or adapter named by a folder or a hub id."""
    if source is None:
        return None
    path = Path(source).expanduser()
    if path.is_dir():
        return local_fingerprint(path)
    return _hub_revision(source)


def model_identity(spec: ModelSpec, info: Mapping[str, object], engine: str) -> ModelIdentity:
    """The identity of a served model: its entry ``spec``, its scorer's ``info()`` and the
    engine (the scorer's class) that computes its values. Reads the file system (stat calls,
    no file contents)."""
    model = str(info.get("model") or spec.model or spec.name)
    adapter = info.get("adapter") or getattr(spec, "adapter", None)
    adapter_name = None if adapter is None else str(adapter)
    entry = spec.model_dump(exclude=_PRESENTATION_KEYS)
    facts = json.dumps(
        {"entry": entry, "scorer": dict(info)}, sort_keys=True, separators=(",", ":"), default=str
    )
    local = Path(model).expanduser()
    return ModelIdentity(
        model=str(local.resolve()) if local.is_dir() else model,
        revision=_revision(model),
        adapter=adapter_name,
        adapter_revision=_revision(adapter_name),
        engine=engine,
        facts=facts,
    )


def _ids_bytes(input_ids: Sequence[int]) -> bytes:
    """The token ids as bytes: 4 per id (typecode ``I``) when they all fit, else 8 (``q``);
    the typecode leads, so the two forms never collide."""
    try:
        return b"I" + array("I", input_ids).tobytes()
    except OverflowError:  # an id of 2**32 or more (or negative): no vocabulary has one
        return b"q" + array("q", input_ids).tobytes()


class ScoreCache:
    """An LRU map from (model identity, exact token ids) to a row's value, bounded by
    ``max_entries`` and by ``max_bytes`` (each entry counted as its key's bytes, its
    value's payload and :data:`ENTRY_OVERHEAD_BYTES`). The least recently used entries go
    first when either bound is passed; a value larger than ``max_bytes`` alone is not kept.
    ``max_entries`` 0 disables it (:attr:`enabled`)."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        if max_entries < 0 or max_bytes < 0:
            raise ValueError("cache bounds must be non-negative")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        # key -> (stored value, its counted size)
        self._entries: OrderedDict[bytes, tuple[float | array[float] | str, int]] = OrderedDict()
        self._bytes = 0
        # Keys a request is scoring now -> the future its value (or MISS) arrives in.
        self._in_flight: dict[bytes, asyncio.Future[Any]] = {}

    @property
    def enabled(self) -> bool:
        """Whether anything can be kept at all."""
        return self.max_entries > 0 and self.max_bytes > 0

    @property
    def entries(self) -> int:
        """Entries held now."""
        return len(self._entries)

    @property
    def bytes(self) -> int:
        """Bytes counted for the entries held now."""
        return self._bytes

    def snapshot(self) -> CacheState:
        """Its entries and bytes now (read by /metrics at a scrape)."""
        return CacheState(len(self._entries), self._bytes)

    @staticmethod
    def key(model: bytes, input_ids: Sequence[int]) -> bytes:
        """The key of ``input_ids`` scored by the model whose identity digest is ``model``."""
        return model + _ids_bytes(input_ids)

    def get(self, key: bytes) -> Any:
        """The value kept under ``key`` (now the most recently used), or :data:`MISS`.

        A row comes back as a new list each time: nothing a caller does to it reaches the
        cache."""
        entry = self._entries.get(key)
        if entry is None:
            return MISS
        self._entries.move_to_end(key)
        stored = entry[0]
        return stored.tolist() if isinstance(stored, array) else stored

    def put(self, key: bytes, value: Value) -> bool:
        """Keep ``value`` under ``key`` as the most recently used, evicting the least
        recently used entries until both bounds hold. False when it is not kept: the cache
        is off, the value alone passes ``max_bytes``, or it is no float, row of floats or
        text (another engine's type: scored afresh each time rather than returned changed).
        """
        if not self.enabled:
            return False
        stored: float | array[float] | str
        if type(value) is float:
            stored, payload = value, 8
        elif type(value) is list and all(type(v) is float for v in value):
            stored = array("d", value)  # a float64 holds a Python float exactly
            payload = stored.itemsize * len(stored)
        elif type(value) is str:
            stored, payload = value, len(value.encode())
        else:
            logger.debug("score cache: a %s is not kept", type(value).__name__)
            return False
        size = len(key) + payload + ENTRY_OVERHEAD_BYTES
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
        if size > self.max_bytes:
            return False
        self._entries[key] = (stored, size)
        self._bytes += size
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            _, (_, evicted) = self._entries.popitem(last=False)
            self._bytes -= evicted
        return True

    def in_flight(self, key: bytes) -> asyncio.Future[Any] | None:
        """The future of ``key``'s value when a request is scoring it now, else None."""
        return self._in_flight.get(key)

    def begin(self, key: bytes) -> None:
        """Mark ``key`` in flight: requests that need it wait for :meth:`end` (on the
        running event loop)."""
        self._in_flight[key] = asyncio.get_running_loop().create_future()

    def end(self, key: bytes, value: Any) -> None:
        """``key`` is no longer in flight: its waiters get ``value`` (:data:`MISS`: the pass
        failed, score it yourselves)."""
        flight = self._in_flight.pop(key, None)
        if flight is not None and not flight.done():
            flight.set_result(value)

    def clear(self) -> None:
        """Forget every entry."""
        self._entries.clear()
        self._bytes = 0
