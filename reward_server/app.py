"""Deprecated path of the app factory: use :mod:`reward_server.http.app`."""

from reward_server._moved import warn_moved
from reward_server.http.app import create_app

warn_moved(__name__, "reward_server.http.app.create_app")

__all__ = ["create_app"]
