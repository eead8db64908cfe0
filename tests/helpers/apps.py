"""In-process apps of a models file (no socket: run one in Starlette's ``TestClient``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from helpers.models_files import next_models_file
from reward_server.config import ServerSettings
from reward_server.http.app import create_app


def models_app(
    folder: Path,
    entries: Iterable[Mapping[str, Any]],
    *,
    top: Mapping[str, Any] | None = None,
    **settings: Any,
) -> FastAPI:
    """An in-process app (no socket: run it in ``TestClient``) serving a models file of
    ``entries`` written in ``folder`` (a new name each time), batching with a 1 ms window
    unless ``settings`` say otherwise."""
    path = next_models_file(folder, entries, **(top or {}))
    return create_app(ServerSettings(models=str(path), **{"max_wait_ms": 1.0, **settings}))
