"""What the function-style integrations (verl, OpenRLHF) share: where to score, read from
keyword arguments then the environment, and the clients kept for the whole process.

A framework calls a reward function many times with no object to hold a client, so one
client per setting is kept (:class:`ClientCache`), and calls reuse its connections.

=========================  =======================  =============================================
keyword argument           environment              meaning
=========================  =======================  =============================================
``reward_url``             ``REWARD_URL``           one base URL, a comma-separated list or a list
``reward_api_key``         ``REWARD_API_KEY``       the server's API key
``reward_timeout``         ``REWARD_TIMEOUT``       seconds per request (default 60)
``reward_ca_bundle``       ``REWARD_CA_BUNDLE``     CA bundle an https server's certificate is
                                                    checked against (default: the system's)
``reward_deadline``        ``REWARD_DEADLINE``      seconds one reward call may take in all,
                                                    retries included (the client's ``deadline``;
                                                    default: no such limit)
``reward_client_options``                           further client options (a mapping, such as
                                                    ``{"max_retries": 3}``; see ClientOptions)
``masked_score``           ``REWARD_MASKED_SCORE``  the score given to an item the server masked
                                                    (default 0.0; :mod:`.masks`)
=========================  =======================  =============================================
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from reward_client.client import AsyncRewardClient, RewardClient
from reward_client.wire import LABELLED

__all__ = ["CLIENT_KWARGS", "ClientCache", "ClientSettings", "WarnOnce", "flag"]

#: The keyword arguments :meth:`ClientSettings.read` takes.
CLIENT_KWARGS = frozenset(
    {
        "reward_url",
        "reward_api_key",
        "reward_timeout",
        "reward_ca_bundle",
        "reward_deadline",
        "reward_client_options",
    }
)
_TRUE = frozenset({"1", "true", "yes", "on"})


def flag(value: object) -> bool:
    """A yes/no setting: a bool, or a string such as ``1``, ``true``, ``yes``, ``on``."""
    if isinstance(value, str):
        return value.strip().lower() in _TRUE
    return bool(value)


def _urls(value: str | Iterable[object], hint: str) -> tuple[str, ...]:
    """Base URLs from a string (comma-separated allowed) or a list of strings."""
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    urls = tuple(u.strip() for u in items if u.strip())
    if not urls:
        raise ValueError(f"no reward server URL: set {hint}")
    return urls


@dataclass(frozen=True)
class ClientSettings:
    """Where and how to score; equal settings share one cached client."""

    urls: tuple[str, ...]
    api_key: str | None
    timeout: float
    options: tuple[tuple[str, Any], ...]

    @classmethod
    def read(cls, kwargs: Mapping[str, Any], hint: str = "REWARD_URL") -> ClientSettings:
        """Settings from the call's keyword arguments, then the environment, then defaults;
        ``hint`` says where a missing URL can be set."""
        env = os.environ
        options = dict(kwargs.get("reward_client_options") or {})
        ca_bundle = kwargs.get("reward_ca_bundle") or env.get("REWARD_CA_BUNDLE")
        if ca_bundle:  # a ``verify`` among the options wins
            options.setdefault("verify", str(ca_bundle))
        deadline = kwargs.get("reward_deadline") or env.get("REWARD_DEADLINE")
        if deadline:  # likewise a ``deadline`` among the options
            options.setdefault("deadline", float(deadline))
        return cls(
            urls=_urls(kwargs.get("reward_url") or env.get("REWARD_URL") or "", hint),
            api_key=kwargs.get("reward_api_key") or env.get("REWARD_API_KEY") or None,
            timeout=float(kwargs.get("reward_timeout") or env.get("REWARD_TIMEOUT") or 60.0),
            # Sorted so that equal options give the same cached client.
            options=tuple(sorted((str(k), v) for k, v in dict(options).items())),
        )

    def labels(self, labels: list[Any], warn: WarnOnce) -> list[Any] | None:
        """``labels`` when the configured protocol carries them (``auto`` is taken to);
        else None, with a warning once that they are left out."""
        protocol = dict(self.options).get("protocol", "remote-reward")
        if protocol == "auto" or protocol in LABELLED:
            return labels
        warn(f"labels:{protocol}", "protocol %r has no labels: they are not sent", protocol)
        return None

    def client_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the client these settings describe."""
        return {
            "base_urls": list(self.urls),
            "api_key": self.api_key,
            "timeout": self.timeout,
            **dict(self.options),
        }


class WarnOnce:
    """Logs a warning to ``logger`` the first time its key comes up in this process."""

    def __init__(self, logger: logging.Logger) -> None:
        self.logger = logger
        self.seen: set[str] = set()

    def __call__(self, key: str, message: str, *args: object) -> None:
        if key not in self.seen:
            self.seen.add(key)
            self.logger.warning(message, *args)


class ClientCache:
    """One client per :class:`ClientSettings`, kept for the process (thread-safe).

    An ``httpx.AsyncClient``'s connections belong to the event loop that opened them, so
    the async clients are kept per loop and forgotten with it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sync: dict[ClientSettings, RewardClient] = {}
        self._async: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[ClientSettings, AsyncRewardClient]
        ] = weakref.WeakKeyDictionary()

    def blocking(self, settings: ClientSettings) -> RewardClient:
        """The blocking client for ``settings``."""
        with self._lock:
            client = self._sync.get(settings)
            if client is None:
                client = self._sync[settings] = RewardClient(**settings.client_kwargs())
            return client

    def for_loop(self, settings: ClientSettings) -> AsyncRewardClient:
        """The async client for ``settings`` on the running event loop."""
        loop = asyncio.get_running_loop()
        with self._lock:
            clients = self._async.setdefault(loop, {})
            client = clients.get(settings)
            if client is None:
                client = clients[settings] = AsyncRewardClient(**settings.client_kwargs())
            return client

    def close(self) -> None:
        """Close the blocking clients and forget every async client."""
        with self._lock:
            clients = list(self._sync.values())
            self._sync.clear()
            self._async.clear()
        for client in clients:
            client.close()

    async def aclose(self) -> None:
        """Close the async clients kept for the running event loop."""
        with self._lock:
            clients = self._async.pop(asyncio.get_running_loop(), {})
        for client in clients.values():
            await client.aclose()
