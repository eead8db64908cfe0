"""Which protocol a server speaks, and how many items it takes per request, from what it
answers to ``GET /info`` (this server, TEI) and ``GET /v1/models`` (vLLM)."""

from __future__ import annotations

__all__ = ["chunk_size", "detect"]


def detect(info: object, models: object) -> str | None:
    """The protocol a server speaks from its ``GET /info`` and ``GET /v1/models`` answers
    (None where it did not answer), or None if neither tells."""
    if isinstance(info, dict):
        if "max_client_batch" in info:
            return "remote-reward"
        if "model_type" in info and "model_id" in info:
            return "tei"
    if isinstance(models, dict) and isinstance(models.get("data"), list):
        return "vllm"
    return None


def chunk_size(info: object) -> int | None:
    """Items per request a server's ``/info`` allows (this server's or TEI's), if it says."""
    if not isinstance(info, dict):
        return None
    for key in ("max_client_batch", "max_client_batch_size"):
        value = info.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
