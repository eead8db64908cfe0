"""The keyword options both clients take (:class:`ClientOptions`) and their defaults."""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from typing import TypedDict

import httpx

from reward_client.results import RetryEvent
from reward_client.retry import RetryPolicy
from reward_client.targets import Resolver

__all__ = ["DEFAULT_MAX_CLIENT_BATCH", "DEFAULT_MAX_CONCURRENCY", "ClientOptions"]

#: Chunk size used when the server's ``/info`` does not say how many items it accepts.
DEFAULT_MAX_CLIENT_BATCH = 64

#: Requests in flight per call unless ``max_concurrency`` says otherwise.
DEFAULT_MAX_CONCURRENCY = 8


class ClientOptions(TypedDict, total=False):
    """Keyword options shared by :class:`~reward_client.RewardClient` and
    :class:`~reward_client.AsyncRewardClient`.

    ``timeout``: per request (seconds or an ``httpx.Timeout``; default 60), also through a
    passed-in ``http_client``. ``retry``: the :class:`~reward_client.RetryPolicy`;
    ``retry_timeout`` and ``max_retries`` replace its fields of those names.
    ``max_client_batch``: items per request (default: the server's, read from ``/info``).
    ``max_concurrency``: requests in flight per call (default 8). ``on_retry``: called with
    a :class:`~reward_client.RetryEvent` before each retry (from a worker thread in the
    sync client). ``seed``: seeds the jitter. ``clock``: a monotonic clock in seconds for
    the retry budget (the test seam, with the face's ``sleep``). ``protocol``: what the
    server speaks, ``remote-reward`` (this project's server, the default), ``vllm``,
    ``tei``, ``openrlhf``, or ``auto`` to ask the server (see :mod:`reward_client.wire`).
    ``resolve_interval``: seconds between two resolutions of a ``dns+http://name:port``
    base URL (default 5; also resolved again soon after a failure); ``resolver``: ``(host,
    port) -> addresses``, the test seam (default ``getaddrinfo``; see
    :mod:`reward_client.targets`). ``verify``: how ``https://`` servers are checked: True
    (default: the system's CAs through certifi, or ``$SSL_CERT_FILE``), a CA bundle file (or
    folder) that signed the server's certificate, an ``ssl.SSLContext`` (e.g. with a client
    certificate loaded), or False (no check: testing only). It configures the HTTP client
    the reward client creates; a passed-in ``http_client`` keeps its own. A certificate that
    fails the check is a configuration error: raised at once, never retried.
    """

    timeout: float | httpx.Timeout
    retry: RetryPolicy | None
    retry_timeout: float | None
    max_retries: int | None
    max_client_batch: int | None
    max_concurrency: int
    on_retry: Callable[[RetryEvent], None] | None
    seed: int | None
    clock: Callable[[], float]
    protocol: str
    resolver: Resolver | None
    resolve_interval: float
    verify: bool | str | os.PathLike[str] | ssl.SSLContext
