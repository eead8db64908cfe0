"""Deprecated path of the app factory: use :mod:`reward_server.http.app`."""

import warnings

from reward_server.http.app import create_app

warnings.warn(
    "reward_server.app is deprecated; use reward_server.http.app.create_app",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["create_app"]
