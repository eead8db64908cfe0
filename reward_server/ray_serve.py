"""Deprecated path of the Ray Serve application: use :mod:`reward_server.http.ray_serve`."""

from reward_server._moved import warn_moved
from reward_server.http.ray_serve import (
    DEPLOYMENT_NAME,
    ServeOptions,
    app,
    build,
    deployment_options,
)

warn_moved(__name__, "reward_server.http.ray_serve (serve run reward_server.http.ray_serve:app)")

__all__ = ["DEPLOYMENT_NAME", "ServeOptions", "app", "build", "deployment_options"]
