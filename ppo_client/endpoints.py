"""Deprecated: base URLs and ``dns+http://`` targets moved to :mod:`reward_client.targets`;
this module goes in the next release."""

from __future__ import annotations

import warnings

from reward_client.targets import (
    DEFAULT_RESOLVE_INTERVAL,
    MIN_RESOLVE_GAP,
    EndpointPool,
    Resolver,
    Target,
    normalise_urls,
    system_resolver,
)

__all__ = [
    "DEFAULT_RESOLVE_INTERVAL",
    "MIN_RESOLVE_GAP",
    "EndpointPool",
    "Resolver",
    "Target",
    "normalise_urls",
    "system_resolver",
]

warnings.warn(
    "ppo_client.endpoints is deprecated: import from reward_client.targets instead",
    DeprecationWarning,
    stacklevel=2,
)
