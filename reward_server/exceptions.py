"""Deprecated path of the server's exceptions: use :mod:`reward_server.errors`."""

from reward_server._moved import warn_moved
from reward_server.errors import *  # noqa: F403 - the old names, re-exported
from reward_server.errors import __all__  # noqa: F401

warn_moved(__name__, "reward_server.errors")
