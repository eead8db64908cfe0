"""The keyword options both clients take (:class:`ClientOptions`), their defaults, and
``verify`` as httpx takes it (:func:`tls_verify`)."""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from typing import TypeAlias, TypedDict

import httpx

from reward_client.results import RetryEvent
from reward_client.retry import RetryPolicy
from reward_client.targets import Resolver

__all__ = [
    "DEFAULT_MAX_CLIENT_BATCH",
    "DEFAULT_MAX_CONCURRENCY",
    "ClientOptions",
    "Verify",
    "tls_verify",
]

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

    ``deadline``: seconds each call may take in all (discovery, every chunk, every retry),
    from the moment it starts; None (the default): no such limit, only the retry budget.
    Every request tells the server its time budget in the ``X-Request-Timeout-Ms`` header:
    the least of ``timeout`` (its read part) and what is left of the deadline, so that the
    server answers in time, with the items it could not finish masked ``deadline``. No
    attempt starts, and no pause ends, once the deadline has passed; an attempt waits for
    its answer at most 1 s past it (``DEADLINE_GRACE``, for the server's answer to arrive),
    so a call that cannot succeed raises RewardServerError by then (``gave_up`` names the
    deadline). A call's own ``deadline=`` (``score``, ``score_detailed``) overrides it.
    Without a deadline a request can overrun the retry budget by one attempt's timeout.
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
    deadline: float | None


#: How https servers are checked: True (the system's or certifi's CAs, or $SSL_CERT_FILE),
#: False (not at all), a CA bundle file or folder, or an ``ssl.SSLContext``.
Verify: TypeAlias = "bool | str | os.PathLike[str] | ssl.SSLContext"


def tls_verify(verify: Verify) -> bool | ssl.SSLContext:
    """``verify`` as httpx takes it: a CA bundle path becomes an ``ssl.SSLContext`` (httpx
    0.28 deprecates paths); True, False and contexts are kept."""
    if isinstance(verify, bool | ssl.SSLContext):
        return verify
    if not isinstance(verify, str | os.PathLike):
        raise TypeError(
            f"verify must be a bool, a CA bundle path or an ssl.SSLContext, got {verify!r}"
        )
    path = os.fspath(verify)
    try:
        if os.path.isdir(path):
            return ssl.create_default_context(capath=path)
        return ssl.create_default_context(cafile=path)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"verify: cannot load the CA bundle {path!r}: {exc}") from None
