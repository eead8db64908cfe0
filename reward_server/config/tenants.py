"""Tenants: who shares this server. A tenant is a name, a scheduling weight and
optional limits; ``--api-keys FILE`` lists them with the SHA-256 of each one's key.

The keys file's loading and reloading live here too (plain data, no HTTP), and
:data:`current_tenant`, the tenant of the request being served: the HTTP layer's auth
dependency sets it in the request's task, and the schedulers read it where they queue work
(the context is copied into the tasks a request starts), so no signature between the route
and a scheduler has to carry it. It lives in this lowest layer so that both the scoring
core and the engines' own schedulers can read it.

.. code-block:: yaml

    tenants:
      - name: sweep                # unique; the label of its metrics
        key_sha256: 9f86d0...      # printf %s "$KEY" | sha256sum  (never the key itself)
        weight: 1                  # share of the batches when tenants compete (default 1)
        tokens_per_s: 20000        # optional rate limit on the tokens it sends
        queue_share: 0.5           # optional: fraction of --max-queue its items may take
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import re
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from reward_server.config._yaml_file import read_yaml_file
from reward_server.errors import validation_problem

__all__ = [
    "DEFAULT_TENANT",
    "RELOAD_POLL_S",
    "Tenant",
    "TenantKeys",
    "TenantTable",
    "TenantsFileError",
    "current_tenant",
    "hash_key",
    "parse_tenants_file",
    "read_tenants_file",
]

logger = logging.getLogger(__name__)

#: How often the keys file's size and modification time are checked for a change.
RELOAD_POLL_S = 1.0


@dataclass(frozen=True, slots=True)
class Tenant:
    """One caller of the server, as the keys file names it.

    ``weight``: its share of the batches when several tenants wait (weighted fair queueing
    on tokens). ``tokens_per_s``: a rate limit on the tokens it sends (None: none).
    ``queue_share``: the fraction of ``--max-queue`` its queued items may take (None: all).
    """

    name: str
    weight: float = 1.0
    tokens_per_s: float | None = None
    queue_share: float | None = None


#: Every request when the server has no keys file (no key, or one ``--api-key``).
DEFAULT_TENANT = Tenant("default")

#: The tenant of the request being served (DEFAULT_TENANT outside a request).
current_tenant: ContextVar[Tenant] = ContextVar("reward_server_tenant", default=DEFAULT_TENANT)


class TenantsFileError(ValueError):
    """The keys file cannot be read or is not valid; ``str(e)`` says where and why (and
    never holds key material: only the file's path, tenant names and field names)."""


def hash_key(key: str) -> str:
    """The hex SHA-256 of ``key`` (UTF-8), as the keys file's ``key_sha256`` holds it: the
    same as ``printf %s "$KEY" | sha256sum``."""
    return hashlib.sha256(_key_bytes(key)).hexdigest()


def _key_bytes(key: str) -> bytes:
    # surrogateescape: a header's bytes that are not UTF-8 still hash (to no tenant's hash).
    return key.encode("utf-8", "surrogateescape")


# ---------------------------------------------------------------------- the file's schema


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")


class _TenantEntry(BaseModel):
    """One entry of ``tenants:``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    key_sha256: str
    weight: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    tokens_per_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    queue_share: float | None = Field(default=None, gt=0, le=1)

    @field_validator("name")
    @classmethod
    def _plain_name(cls, value: str) -> str:
        """A label value of the per-tenant metrics and a word in logs: short and plain."""
        if not _NAME.fullmatch(value):
            raise ValueError(
                "a tenant name is 1-64 letters, digits, '_', '.', '@' or '-', starting with a "
                "letter or digit"
            )
        return value

    @field_validator("key_sha256", mode="before")
    @classmethod
    def _hex_digest(cls, value: object) -> str:
        """64 hex digits. The messages never repeat the value: it may be a key pasted here
        by mistake."""
        if not isinstance(value, str):
            raise ValueError(
                "must be a string of 64 hex digits (quote it in YAML: a digest of only "
                "digits reads as a number)"
            )
        digest = value.strip().lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(
                "must be the 64 hex digits of the key's SHA-256 "
                '(printf %s "$KEY" | sha256sum), never the key itself'
            )
        return digest


class _TenantsFile(BaseModel):
    """The whole keys file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tenants: list[_TenantEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> _TenantsFile:
        """Names and hashes each appear once."""
        names: dict[str, int] = {}
        digests: dict[str, int] = {}
        for i, entry in enumerate(self.tenants):
            if entry.name in names:
                raise ValueError(
                    f"tenants[{i}]: duplicate name {entry.name!r} (also tenants[{names[entry.name]}])"
                )
            if entry.key_sha256 in digests:
                raise ValueError(
                    f"tenants[{i}] ({entry.name!r}) has the same key_sha256 as "
                    f"tenants[{digests[entry.key_sha256]}]: give each tenant its own key"
                )
            names[entry.name] = i
            digests[entry.key_sha256] = i
        return self


# ---------------------------------------------------------------------- the table


@dataclass(frozen=True, slots=True)
class TenantTable:
    """The tenants a server knows and the SHA-256 digest of each one's key (same order)."""

    tenants: tuple[Tenant, ...]
    digests: tuple[bytes, ...]

    @classmethod
    def single_key(cls, key: str) -> TenantTable:
        """``--api-key``: one tenant, :data:`DEFAULT_TENANT`."""
        return cls((DEFAULT_TENANT,), (hashlib.sha256(_key_bytes(key)).digest(),))

    @property
    def names(self) -> list[str]:
        """The tenants' names, in the file's order."""
        return [tenant.name for tenant in self.tenants]

    def authenticate(self, key: str) -> Tenant | None:
        """The tenant whose key ``key`` is, or None.

        The key's digest is compared with every tenant's in constant time, all of them
        whichever matches, so the time taken says nothing about which tenant (or how much
        of a digest) matched.
        """
        digest = hashlib.sha256(_key_bytes(key)).digest()
        found: Tenant | None = None
        for tenant, expected in zip(self.tenants, self.digests, strict=True):
            # compare_digest first: it runs for every tenant, match or not.
            if hmac.compare_digest(digest, expected) and found is None:
                found = tenant
        return found


def parse_tenants_file(data: Any, source: str = "keys file") -> TenantTable:
    """Validate the parsed YAML of a keys file; TenantsFileError naming every problem."""
    if data is None:
        raise TenantsFileError(f"{source} is empty: it needs a 'tenants' list")
    if not isinstance(data, dict):
        raise TenantsFileError(f"{source} must be a mapping with a 'tenants' list")
    try:
        parsed = _TenantsFile.model_validate(data)
    except ValidationError as exc:
        problems = [validation_problem(err) for err in exc.errors()]
        raise TenantsFileError(f"{source}: {'; '.join(problems)}") from None
    return TenantTable(
        tuple(
            Tenant(e.name, weight=e.weight, tokens_per_s=e.tokens_per_s, queue_share=e.queue_share)
            for e in parsed.tenants
        ),
        tuple(bytes.fromhex(e.key_sha256) for e in parsed.tenants),
    )


def read_tenants_file(path: str | Path) -> TenantTable:
    """Read and validate the keys file at ``path``; TenantsFileError when it is not right."""
    # The YAML parser's message quotes the line it stopped at, which may hold a key.
    data = read_yaml_file(path, "keys file", TenantsFileError, quote_yaml_error=False)
    return parse_tenants_file(data, str(path))


# ---------------------------------------------------------------------- the live keys


def _signature(path: Path) -> tuple[int, int, int] | None:
    """What tells a changed file: inode (an editor's rename), size and mtime; None: gone."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class TenantKeys:
    """The tenants the server authenticates against now, reloadable from the keys file.

    ``table`` None: no key at all (every request is :data:`DEFAULT_TENANT`). With a
    ``path``, :meth:`reload` (on SIGHUP) and :meth:`poll` (a changed file) replace the table
    in one assignment, so the next request sees the new keys; a file that does not load
    keeps the old table and logs why. ``on_reload(ok)`` is told of every reload.
    """

    def __init__(
        self,
        table: TenantTable | None,
        path: str | Path | None = None,
        on_reload: Callable[[bool], None] | None = None,
    ) -> None:
        self._table = table
        self.path = Path(path).expanduser() if path is not None else None
        self.on_reload = on_reload
        # The file as the table was read from it (taken before reading: a write that lands
        # while it is read changes the signature again, so the next poll reloads).
        self._signature = _signature(self.path) if self.path is not None else None

    @property
    def table(self) -> TenantTable | None:
        """The tenants now in force (None: no key configured)."""
        return self._table

    @property
    def count(self) -> int:
        """Tenants in force now (1 without a key: every request is the default tenant)."""
        table = self._table
        return len(table.tenants) if table is not None else 1

    @property
    def required(self) -> bool:
        """Whether requests must carry a key."""
        return self._table is not None

    def authenticate(self, key: str) -> Tenant | None:
        """The tenant of ``key`` in the table now in force, or None (see TenantTable)."""
        table = self._table  # one read: a reload in between cannot mix two tables
        return table.authenticate(key) if table is not None else None

    def reload(self, why: str = "reload") -> bool:
        """Read the keys file again; on success the new tenants are in force at once. A file
        that does not load leaves the old tenants and logs a WARNING (no key material)."""
        if self.path is None:
            return False
        self._signature = _signature(self.path)
        try:
            table = read_tenants_file(self.path)
        except TenantsFileError as exc:
            logger.warning("%s: not reloaded, the old tenants stay: %s", why, exc)
            self._notify(ok=False)
            return False
        old = self._table.names if self._table is not None else []
        self._table = table
        added = [name for name in table.names if name not in old]
        removed = [name for name in old if name not in table.names]
        logger.info(
            "%s: reloaded %s: %d tenants (added: %s; removed: %s)",
            why,
            self.path,
            len(table.tenants),
            ", ".join(added) or "none",
            ", ".join(removed) or "none",
        )
        self._notify(ok=True)
        return True

    def _notify(self, *, ok: bool) -> None:
        if self.on_reload is not None:
            self.on_reload(ok)

    def poll(self) -> bool:
        """Reload when the file changed since it was last read; whether it reloaded."""
        if self.path is None or _signature(self.path) == self._signature:
            return False
        return self.reload("keys file changed")

    async def watch(self, interval: float = RELOAD_POLL_S) -> None:
        """Poll the file every ``interval`` seconds until cancelled (a stat, no read,
        while it is unchanged)."""
        while True:
            await asyncio.sleep(interval)
            try:
                self.poll()
            except Exception:  # the watch must outlive any surprise; the old keys stay
                logger.exception("keys file watch failed; the old tenants stay")
