"""Servers by spec: a real ``reward-server`` of a model or of a models file's entries, shared
by the tests that need the same one (an in-process app of a models file: helpers.apps).

A spec is what the command line says: the model (``--model``), the models file's entries
(``--models``, written here), the other flags and the environment. :class:`SharedServers`
(the session fixture ``shared_server`` of tests/conftest.py) starts a server once per spec
and hands the same process to every test, fixture or test file of the pytest worker that
asks for that spec again: a module-scoped fixture takes it for its module and gives it back
at the module's end, and the pool keeps the last few it was given back running for the next
file (make test's ``--dist loadfile`` runs each file whole in one worker, one after another,
so a server is never shared by two workers, nor by two tests at once).

Only for tests that leave the server as they found it: no signal, no reload, no drain, no
overload, and no check of a count from zero (a shared server has served other tests
before: compare a metric before and after). A test that stops, reloads, breaks or counts
from zero starts its own (:func:`serve`, or ``server_proc.running_server``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server_proc import ServerProcess, running_server

from helpers.models_files import write_models

logger = logging.getLogger(__name__)

Entries = Iterable[Mapping[str, Any]]

#: How long a server of a models file may take to start on a busy machine (loading models,
#: starting verifier workers): the default of running_server is 60 s.
START_TIMEOUT_S = 180.0


def models_flags(
    folder: Path, models: Entries | None, top: Mapping[str, Any] | None = None
) -> tuple[str, ...]:
    """``--models FILE`` for ``models`` written in ``folder`` (nothing without entries)."""
    if models is None:
        return ()
    return ("--models", str(write_models(folder, models, **(top or {}))))


@contextlib.contextmanager
def serve(
    model: str | Path | None = None,
    *flags: str,
    models: Entries | None = None,
    top: Mapping[str, Any] | None = None,
    folder: Path | None = None,
    timeout: float = START_TIMEOUT_S,
    **kwargs: Any,
) -> Iterator[ServerProcess]:
    """A server of its own: ``reward-server [--model model] [--models FILE] *flags``, the
    models file of ``models`` (and its keys ``top``) written in ``folder`` (a temporary
    folder when None); ``kwargs`` as ``running_server`` takes them (``env``, ``log_path``,
    ``verify``). Stopped at the end of the block."""
    with contextlib.ExitStack() as stack:
        if models is not None and folder is None:
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="models-")))
        if models is not None and folder is not None:
            flags = (*models_flags(folder, models, top), *flags)
        yield stack.enter_context(running_server(model, *flags, timeout=timeout, **kwargs))


@dataclass
class _Shared:
    server: ServerProcess
    stop: contextlib.ExitStack
    users: int = 0
    last_use: int = 0


@dataclass
class SharedServers:
    """Servers by spec for one pytest worker (see the module's docstring).

    ``with shared(model, *flags, models=..., env=...) as server``: the running server of
    that spec, started on first use. Servers nobody holds stay running, at most ``keep`` of
    them (the least recently used is stopped first), until :meth:`close`.
    """

    folder: Path
    keep: int = 3
    _servers: dict[str, _Shared] = field(default_factory=dict)
    _clock: Iterator[int] = field(default_factory=itertools.count)

    @contextlib.contextmanager
    def __call__(
        self,
        model: str | Path | None = None,
        *flags: str,
        models: Entries | None = None,
        top: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = START_TIMEOUT_S,
    ) -> Iterator[ServerProcess]:
        models = None if models is None else [dict(entry) for entry in models]
        spec = json.dumps(
            [str(model) if model is not None else None, flags, models, top, env],
            sort_keys=True,
            default=str,
        )
        shared = self._take(spec, model, flags, models, top, env, timeout)
        try:
            yield shared.server
        finally:
            shared.users -= 1
            shared.last_use = next(self._clock)
            self._trim()

    def _take(
        self,
        spec: str,
        model: str | Path | None,
        flags: tuple[str, ...],
        models: Entries | None,
        top: Mapping[str, Any] | None,
        env: Mapping[str, str] | None,
        timeout: float,
    ) -> _Shared:
        shared = self._servers.get(spec)
        if shared is not None and shared.server.proc.poll() is not None:  # it died: anew
            logger.warning("shared server %s exited; starting it anew", shared.server.url)
            shared.stop.close()
            del self._servers[spec]
            shared = None
        if shared is None:
            stop = contextlib.ExitStack()
            folder = Path(tempfile.mkdtemp(prefix=f"server-{len(self._servers)}-", dir=self.folder))
            args = (*models_flags(folder, models, top), *flags)
            server = stop.enter_context(
                running_server(model, *args, env=dict(env or {}), timeout=timeout)
            )
            shared = self._servers[spec] = _Shared(server, stop)
        shared.users += 1
        return shared

    def _trim(self) -> None:
        idle = sorted((s.last_use, spec) for spec, s in self._servers.items() if s.users == 0)
        for _last_use, spec in idle[: max(0, len(idle) - self.keep)]:
            self._servers.pop(spec).stop.close()

    def close(self) -> None:
        """Stop every server (the end of the worker's session)."""
        while self._servers:
            _spec, shared = self._servers.popitem()
            shared.stop.close()
