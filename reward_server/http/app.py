"""The FastAPI app: routes, error handlers, middlewares and the served models' lifespan.

request -> middlewares (body limit, metrics) -> route (validate, auth) -> scoring pipeline
(each selected model: render + tokenize on the tokenizer thread -> scheduler -> forward
passes on the compute thread; then combined) -> answer; any exception -> the error table (:mod:`reward_server.http.errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi import FastAPI

from reward_server import __version__
from reward_server.config import ServerSettings
from reward_server.config.tenants import TenantKeys
from reward_server.engines import Scorer
from reward_server.http.compat import (
    nemo_gym,
    openai_graders,
    openrlhf,
    protocol_error_bodies,
    sandbox_fusion,
    slime,
    tei,
    vllm,
)
from reward_server.http.errors import install_error_handlers
from reward_server.http.metrics import app_metrics
from reward_server.http.middleware import BodyLimitMiddleware, MetricsMiddleware
from reward_server.http.routes import router
from reward_server.scoring.pipeline import ScoringPipeline
from reward_server.scoring.registry import ModelRegistry, model_specs

__all__ = ["create_app"]

logger = logging.getLogger(__name__)


def create_app(
    settings: ServerSettings,
    *,
    model: Scorer | None = None,
    models: Mapping[str, Scorer] | None = None,
) -> FastAPI:
    """Build the FastAPI app; the lifespan loads the models of ``settings`` that are not
    given (``model``: --model's scorer; ``models``: models-file entries' scorers by name)."""
    metrics, http_metrics = app_metrics(settings.reward_window)
    given = dict(models or {})
    if model is not None:
        given[model_specs(settings)[0].name] = model
    registry = ModelRegistry(settings, metrics, given)
    tenant_keys = TenantKeys(
        settings.tenants, settings.api_keys, on_reload=metrics.on_tenant_reload
    )
    metrics.watch(registry, tenant_keys)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await registry.start()
        try:
            async with _reloading(tenant_keys):
                yield
        finally:
            await registry.stop()

    app = FastAPI(
        title="reward-server",
        version=__version__,
        summary="A sequence-classification reward model behind HTTP: text in, scores out.",
        lifespan=lifespan,
    )
    app.state.registry = registry
    app.state.pipeline = ScoringPipeline(registry)
    app.state.metrics = metrics
    app.state.http_metrics = http_metrics
    app.state.tenant_keys = tenant_keys
    app.include_router(router)  # /score, /health, /info, /metrics
    app.include_router(openrlhf.router)  # OpenRLHF's /get_reward
    app.include_router(vllm.router)  # vLLM's /classify, /pooling, /v1/models
    app.include_router(tei.router)  # TEI's /predict
    app.include_router(slime.router)  # slime's remote_rm: /slime/reward
    app.include_router(sandbox_fusion.router)  # SandboxFusion's /run_code
    app.include_router(nemo_gym.router)  # NeMo Gym's resources server: /verify, /seed_session
    app.include_router(openai_graders.router)  # OpenAI's /v1/fine_tuning/alpha/graders/*
    app.include_router(openai_graders.endpoint_router)  # the endpoint grader: /v1/graders/NAME
    if settings.tenants is None:
        _drop_security_from_openapi(app)
    install_error_handlers(app)
    app.add_middleware(
        BodyLimitMiddleware,
        limit=settings.max_body_bytes,
        metrics=http_metrics,
        error_bodies=protocol_error_bodies(vllm.router, tei.router, openai_graders.router),
    )
    app.add_middleware(MetricsMiddleware, metrics=http_metrics)
    return app


@contextlib.asynccontextmanager
async def _reloading(keys: TenantKeys) -> AsyncIterator[None]:
    """While the app serves, reload the keys file (--api-keys) on SIGHUP and when it changes.

    uvicorn handles only SIGINT and SIGTERM; SIGHUP's default action would end the server,
    so with a keys file the loop takes it over (main thread only: an app run on another
    thread, as by a test client, still reloads on change). Without a keys file SIGHUP keeps
    its default.
    """
    if keys.path is None:
        yield
        return
    loop = asyncio.get_running_loop()
    hup = getattr(signal, "SIGHUP", None)
    on_hup = hup is not None and threading.current_thread() is threading.main_thread()
    if on_hup:
        loop.add_signal_handler(hup, keys.reload, "SIGHUP")
    watch = asyncio.create_task(keys.watch(), name="keys-file-watch")
    logger.info(
        "%d tenants from %s; reloaded on %s",
        len(keys.table.tenants) if keys.table else 0,
        keys.path,
        "SIGHUP and on change" if on_hup else "change",
    )
    try:
        yield
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        if on_hup:
            loop.remove_signal_handler(hup)


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
