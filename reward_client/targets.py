"""Where requests go: the reward servers' base URLs, fixed or followed through DNS.

A base URL ``http://host:port`` (or ``https://``) is one server. ``dns+http://name:port``
(or ``dns+https://``) stands for every address ``name`` resolves to, IPv4 and IPv6: a
Kubernetes headless Service lists one per ready pod, so replicas that come and go are
followed without a restart. The client sends each request to one address (keep-alive
connections stay per replica, so failover and balance work per replica, which one pooled
connection through a ClusterIP Service cannot give) with ``Host: name:port``; over https
the TLS server name is ``name`` too, so certificates are checked against the name.

:class:`EndpointPool` holds the current :class:`Target` list. It resolves every name again
``resolve_interval`` seconds after the last resolution and sooner after a target failed to
connect; addresses that disappeared are dropped, new ones appended. A resolution that
fails or finds nothing keeps the last known addresses (a name with none yet is sent as it
is, so the request fails to connect and is retried). Resolving is the caller's I/O: the
pool says when it is :meth:`~EndpointPool.due` and :meth:`~EndpointPool.refresh` does it,
with the injected ``resolver`` (the test seam).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

__all__ = [
    "DEFAULT_RESOLVE_INTERVAL",
    "MIN_RESOLVE_GAP",
    "EndpointPool",
    "Resolver",
    "Target",
    "normalise_urls",
    "system_resolver",
]

logger = logging.getLogger(__name__)

#: Seconds between two resolutions of a ``dns+`` name: a replica that joined gets traffic,
#: and one that left stops getting it, at most this long after DNS says so.
DEFAULT_RESOLVE_INTERVAL = 5.0

#: After a connection failure a name is resolved again, but not sooner than this many
#: seconds after its last resolution (a dead replica fails many requests at once).
MIN_RESOLVE_GAP = 0.5

#: ``resolver(host, port)`` -> the addresses (IP strings) of ``host``.
Resolver = Callable[[str, int], Sequence[str]]

_SCHEMES = ("http://", "https://", "dns+http://", "dns+https://")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def system_resolver(host: str, port: int) -> list[str]:
    """Every address of ``host`` from ``getaddrinfo`` (IPv4 and IPv6), in its order, once."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def normalise_urls(base_urls: str | Sequence[str]) -> list[str]:
    """Base URLs without trailing slashes; at least one, each http(s) or dns+http(s)."""
    urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
    if not urls:
        raise ValueError("at least one base URL is needed")
    out = []
    for url in urls:
        url = url.strip().rstrip("/")
        if not url.startswith(_SCHEMES):
            raise ValueError(
                "base URL must start with http://, https://, dns+http:// or dns+https://, "
                f"got {url!r}"
            )
        if url.startswith("dns+"):
            _DnsName.parse(url)  # a name and a valid port, or ValueError now
        out.append(url)
    return out


@dataclass(frozen=True, slots=True)
class Target:
    """One server to send requests to.

    ``url`` is the base URL requests go to; for an address found through DNS, ``host`` is
    the ``Host`` header (the name, with the port unless it is the scheme's default) and
    ``server_name`` the name TLS checks (https only). Both are None for a fixed URL.
    """

    url: str
    host: str | None = None
    server_name: str | None = None


@dataclass(frozen=True, slots=True)
class _DnsName:
    """A ``dns+http(s)://name:port/prefix`` URL taken apart."""

    source: str
    scheme: str
    name: str
    port: int
    prefix: str

    @classmethod
    def parse(cls, url: str) -> _DnsName:
        parts = urlsplit(url.removeprefix("dns+"))
        if not parts.hostname:
            raise ValueError(f"no host name in {url!r}")
        try:
            port = parts.port or _DEFAULT_PORTS[parts.scheme]
        except ValueError as exc:  # a port that is not a number or out of range
            raise ValueError(f"bad port in {url!r}: {exc}") from None
        return cls(url, parts.scheme, parts.hostname, port, parts.path)

    def target(self, address: str | None) -> Target:
        """The target for one address of the name (None: the name itself, unresolved)."""
        host = self.name if self.port == _DEFAULT_PORTS[self.scheme] else f"{self.name}:{self.port}"
        if address is None:
            return Target(f"{self.scheme}://{host}{self.prefix}")
        literal = f"[{address}]" if ":" in address else address  # IPv6 in brackets
        server_name = self.name if self.scheme == "https" else None
        return Target(f"{self.scheme}://{literal}:{self.port}{self.prefix}", host, server_name)


class EndpointPool:
    """The current targets of some base URLs, ``dns+`` names re-resolved as they change.

    ``resolver`` (default :func:`system_resolver`) and ``clock`` are the test seams.
    Thread-safe; :meth:`refresh` blocks for one resolution of each name.
    """

    def __init__(
        self,
        base_urls: Sequence[str],
        *,
        resolver: Resolver | None = None,
        resolve_interval: float = DEFAULT_RESOLVE_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not resolve_interval > 0:  # also rejects NaN
            raise ValueError(f"resolve_interval must be > 0 s, got {resolve_interval}")
        self._resolver = resolver or system_resolver
        self.resolve_interval = resolve_interval
        self._clock = clock
        # One slot per base URL, in the order given: a fixed URL's one target, or a name
        # and its addresses' targets (none until the first resolution).
        self._slots: list[tuple[_DnsName | None, list[Target]]] = [
            (_DnsName.parse(u), []) if u.startswith("dns+") else (None, [Target(u)])
            for u in base_urls
        ]
        self._names = [name for name, _ in self._slots if name is not None]
        self._targets = self._flatten()
        self._next_resolve = -float("inf")  # resolve before the first request
        self._last_resolve = -float("inf")
        self._lock = threading.Lock()  # guards the state above
        self._resolving = threading.Lock()  # one resolution at a time

    @property
    def dynamic(self) -> bool:
        """True when some base URL is a ``dns+`` name."""
        return bool(self._names)

    def targets(self) -> list[Target]:
        """The current targets (a name not resolved yet stands for itself)."""
        with self._lock:
            return self._targets

    def due(self) -> bool:
        """Whether a name should be resolved again now."""
        return self.dynamic and self._clock() >= self._next_resolve

    def failed(self, target: Target) -> None:
        """``target`` failed like a server that is gone: resolve its name again soon."""
        if target.host is None and not self._unresolved(target):
            return
        with self._lock:
            soonest = self._last_resolve + MIN_RESOLVE_GAP
            self._next_resolve = min(self._next_resolve, soonest)

    def refresh(self) -> None:
        """Resolve every name now if it is still due (another thread may just have)."""
        with self._resolving:
            if not self.due():
                return
            found = {name: self._resolve(name) for name in dict.fromkeys(self._names)}
            with self._lock:
                self._slots = [
                    (name, targets if name is None else self._update(name, targets, found[name]))
                    for name, targets in self._slots
                ]
                self._targets = self._flatten()
                self._last_resolve = self._clock()
                self._next_resolve = self._last_resolve + self.resolve_interval

    def _resolve(self, name: _DnsName) -> list[str] | None:
        """The name's addresses, or None (logged) when it cannot be resolved now."""
        try:
            addresses = list(self._resolver(name.name, name.port))
        except (OSError, UnicodeError) as exc:  # gaierror; UnicodeError: not a valid name
            logger.warning("cannot resolve %s (%s); keeping its last addresses", name.source, exc)
            return None
        if not addresses:
            logger.warning("%s resolves to no address; keeping its last addresses", name.source)
            return None
        return addresses

    @staticmethod
    def _update(name: _DnsName, old: list[Target], addresses: list[str] | None) -> list[Target]:
        """Keep the addresses that are still there in their order, then append new ones."""
        if addresses is None:
            return old
        new = {name.target(a): None for a in addresses}
        kept = [t for t in old if t in new]
        added = [t for t in new if t not in old]
        gone = [t for t in old if t not in new]
        if added or gone:
            logger.info(
                "%s: %d addresses (+%s, -%s)",
                name.source,
                len(kept) + len(added),
                ",".join(t.url for t in added) or "none",
                ",".join(t.url for t in gone) or "none",
            )
        return kept + added

    def _flatten(self) -> list[Target]:
        """Every slot's targets in order; a name without addresses stands for itself."""
        out: list[Target] = []
        for name, targets in self._slots:
            out.extend(targets if targets or name is None else [name.target(None)])
        return out

    def _unresolved(self, target: Target) -> bool:
        """True for the stand-in of a name that has no address yet."""
        return any(target == name.target(None) for name in self._names)
