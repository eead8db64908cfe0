"""The reward server as a Ray Serve application (the optional extra ``remote-reward[ray]``).

    serve run reward_server.http.ray_serve:app model=/models/rm
    serve run deploy/ray/serve_config.yaml

Every replica runs the very app ``reward-server`` serves (:func:`reward_server.http.app.create_app`,
built inside the replica behind Serve's ASGI ingress), so routes, validation, errors, auth,
``/metrics`` and the micro-batcher are the same; the app's lifespan loads the model once per
replica, when the replica starts, and drains it when Serve stops the replica. Serve's
proxy spreads requests over the replicas and routes around one that died.

:func:`app` is the application builder ``serve run`` and config files call with their
``args``: server settings by their field names (``model``, ``max_batch_size``, ...; the
``REWARD_SERVER_*`` environment where the application is built fills the rest, as for the
CLI) and the deployment's options (:class:`ServeOptions`). By default one replica per GPU
when the model runs on GPUs, and autoscaling between ``min_replicas`` and ``max_replicas``
on the requests in flight per replica (``target_ongoing_requests``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from reward_server.config import ServerSettings

try:
    import ray
    from ray import serve
    from ray.serve import Application
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "reward_server.http.ray_serve needs Ray Serve: pip install 'remote-reward[ray]'"
    ) from exc

__all__ = ["DEPLOYMENT_NAME", "ServeOptions", "app", "build", "deployment_options"]

logger = logging.getLogger("reward_server")

#: The deployment's name (what a config file's ``deployments:`` entry refers to).
DEPLOYMENT_NAME = "RewardServer"


class ServeOptions(BaseModel):
    """The Serve deployment's options among the builder's args (the rest are settings)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    num_replicas: int | None = Field(default=None, ge=1)
    """A fixed number of replicas; unset: autoscale between min_replicas and max_replicas."""
    min_replicas: int = Field(default=1, ge=0)
    """Fewest replicas the autoscaler keeps (0 scales to zero when idle)."""
    max_replicas: int = Field(default=4, ge=1)
    """Most replicas the autoscaler starts (one per GPU: at most the cluster's GPUs)."""
    target_ongoing_requests: float = Field(default=8.0, gt=0)
    """Requests in flight per replica the autoscaler aims at. Each request is a chunk of up
    to max_client_batch items that the replica's micro-batcher merges with the others; a
    few in flight keep a GPU busy."""
    max_ongoing_requests: int = Field(default=64, ge=1)
    """Requests one replica takes at once; Serve's proxy queues the rest. Serve's own
    default (5) would starve the micro-batcher."""
    num_gpus: float | None = Field(default=None, ge=0)
    """GPUs per replica. Unset: tensor_parallel_size when the model runs on CUDA (device
    cuda, or auto where GPUs are in sight), else 0."""
    num_cpus: float = Field(default=1.0, ge=0)
    """CPUs reserved per replica (tokenization and, on CPU, the forward passes)."""

    @model_validator(mode="after")
    def _check_range(self) -> ServeOptions:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas {self.min_replicas} exceeds max_replicas {self.max_replicas}"
            )
        return self


def _gpus_per_replica(settings: ServerSettings, options: ServeOptions) -> float:
    """The GPUs a replica reserves (see :attr:`ServeOptions.num_gpus`)."""
    if options.num_gpus is not None:
        return options.num_gpus
    on_gpu = settings.device.startswith("cuda")
    if settings.device == "auto":
        on_gpu = _gpus_in_sight()
    # vLLM shards a model over tensor_parallel_size GPUs; Ray hands a replica the GPUs it
    # reserved (CUDA_VISIBLE_DEVICES), so it reserves them all.
    return float(settings.tensor_parallel_size) if on_gpu else 0.0


def _gpus_in_sight() -> bool:
    """Whether replicas will find GPUs: the cluster's when connected to Ray (a config file
    is built on the cluster), else this machine's (``serve run module:app`` builds before it
    connects; pass num_gpus when this machine is not like the cluster's nodes)."""
    if ray.is_initialized():
        return ray.cluster_resources().get("GPU", 0) > 0
    import torch

    return torch.cuda.is_available()


def deployment_options(settings: ServerSettings, options: ServeOptions) -> dict[str, Any]:
    """Keyword arguments of ``serve.deployment`` for the reward server's replicas."""
    scaling: dict[str, Any]
    if options.num_replicas is not None:
        scaling = {"num_replicas": options.num_replicas}
    else:
        scaling = {
            "autoscaling_config": {
                "min_replicas": options.min_replicas,
                "initial_replicas": max(options.min_replicas, 1),
                "max_replicas": options.max_replicas,
                "target_ongoing_requests": options.target_ongoing_requests,
            }
        }
    return {
        "name": DEPLOYMENT_NAME,
        "max_ongoing_requests": options.max_ongoing_requests,
        "ray_actor_options": {
            "num_cpus": options.num_cpus,
            "num_gpus": _gpus_per_replica(settings, options),
        },
        **scaling,
    }


class RewardServerReplica:
    """One replica: Serve's ingress wrapper runs the app; this adds Serve's health check."""

    app: FastAPI  # set by Serve's ASGI ingress wrapper

    def check_health(self) -> None:
        """Raise (so that Serve replaces the replica) once its scheduler stopped unasked."""
        registry = self.app.state.registry
        if not registry.ready and not registry.draining:
            raise RuntimeError("the reward model's scheduler is not running")


def build(settings: ServerSettings, options: ServeOptions | None = None) -> Application:
    """The Serve application: the reward server's app on every replica of one deployment."""
    options = options or ServeOptions()

    # Serve calls this in each replica (a plain function: Serve only calls functions), so
    # the app, its threads and its model are the replica's own.
    def build_app() -> FastAPI:
        _configure_logging(settings.log_level)
        from reward_server.http.app import create_app

        return create_app(settings)

    replica = serve.ingress(build_app)(RewardServerReplica)
    deployment = serve.deployment(**deployment_options(settings, options))(replica)
    logger.info(
        "reward server on Ray Serve: model %s, %s",
        settings.model,
        f"{options.num_replicas} replicas"
        if options.num_replicas is not None
        else f"{options.min_replicas}-{options.max_replicas} replicas (autoscaling)",
    )
    return deployment.bind()


def app(args: Mapping[str, Any]) -> Application:
    """Application builder for ``serve run reward_server.http.ray_serve:app key=value ...`` and
    config files: settings fields and :class:`ServeOptions` by name, the settings' other
    fields from the ``REWARD_SERVER_*`` environment."""
    args = dict(args)
    serve_args = {k: args.pop(k) for k in list(args) if k in ServeOptions.model_fields}
    try:
        settings = ServerSettings(**args)
        options = ServeOptions(**serve_args)
    except ValidationError as exc:
        raise ValueError(f"reward_server.http.ray_serve: bad arguments: {exc}") from None
    if settings.tls:
        # Serve's HTTP proxy owns the port, not uvicorn: ignoring the certificate would
        # serve plain HTTP while the user believes it is HTTPS.
        raise ValueError(
            "reward_server.http.ray_serve: ssl_certfile/ssl_keyfile do not apply on Ray "
            "Serve (its proxy serves the port): terminate TLS in an ingress or proxy in front"
        )
    return build(settings, options)


def _configure_logging(level: str) -> None:
    """The server's log level in a replica; a stderr handler where Ray set up none."""
    numeric = logging.DEBUG if level == "trace" else getattr(logging, level.upper())
    logging.getLogger("reward_server").setLevel(numeric)
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
