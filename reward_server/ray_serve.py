"""Deprecated path of the Ray Serve application: use :mod:`reward_server.http.ray_serve`."""

import warnings

from reward_server.http.ray_serve import (
    DEPLOYMENT_NAME,
    ServeOptions,
    app,
    build,
    deployment_options,
)

warnings.warn(
    "reward_server.ray_serve is deprecated; use reward_server.http.ray_serve "
    "(serve run reward_server.http.ray_serve:app)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["DEPLOYMENT_NAME", "ServeOptions", "app", "build", "deployment_options"]
