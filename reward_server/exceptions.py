"""Deprecated path of the server's exceptions: use :mod:`reward_server.errors`."""

import warnings

from reward_server.errors import *  # noqa: F403 - the old names, re-exported
from reward_server.errors import __all__  # noqa: F401

warnings.warn(
    "reward_server.exceptions is deprecated; use reward_server.errors",
    DeprecationWarning,
    stacklevel=2,
)
