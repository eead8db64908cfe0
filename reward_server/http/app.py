"""The FastAPI app: routes, error handlers, middlewares and the service's lifespan.

request -> middlewares (body limit, metrics) -> route (validate, auth) -> service (render +
tokenize on the tokenizer thread -> scheduler -> forward passes on the compute thread) ->
answer; any exception -> the error table (:mod:`reward_server.http.errors`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi import FastAPI

from reward_server import __version__
from reward_server.config import ServerSettings
from reward_server.engines import Scorer
from reward_server.http.compat import openrlhf, protocol_error_bodies, slime, tei, vllm
from reward_server.http.errors import install_error_handlers
from reward_server.http.middleware import BodyLimitMiddleware, MetricsMiddleware
from reward_server.http.routes import router
from reward_server.scoring.metrics import Metrics
from reward_server.scoring.service import Service

__all__ = ["create_app"]


def create_app(
    settings: ServerSettings,
    *,
    model: Scorer | None = None,
    models: Mapping[str, Scorer] | None = None,
) -> FastAPI:
    """Build the FastAPI app; the lifespan loads the models of ``settings`` that are not
    given (``model``: --model's scorer; ``models``: models-file entries' scorers by name)."""
    metrics = Metrics()
    service = Service(settings, model, metrics, models=models)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    app = FastAPI(
        title="reward-server",
        version=__version__,
        summary="A sequence-classification reward model behind HTTP: text in, scores out.",
        lifespan=lifespan,
    )
    app.state.service = service
    app.state.metrics = metrics
    app.include_router(router)  # /score, /health, /info, /metrics
    app.include_router(openrlhf.router)  # OpenRLHF's /get_reward
    app.include_router(vllm.router)  # vLLM's /classify, /pooling, /v1/models
    app.include_router(tei.router)  # TEI's /predict
    app.include_router(slime.router)  # slime's remote_rm: /slime/reward
    if settings.api_key is None:
        _drop_security_from_openapi(app)
    install_error_handlers(app)
    app.add_middleware(
        BodyLimitMiddleware,
        limit=settings.max_body_bytes,
        metrics=metrics,
        error_bodies=protocol_error_bodies(vllm.router, tei.router),
    )
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return app


def _drop_security_from_openapi(app: FastAPI) -> None:
    """Without an API key nothing needs auth: say so in /openapi.json too."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        schema = generate()
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                operation.pop("security", None)
        schema.get("components", {}).pop("securitySchemes", None)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
