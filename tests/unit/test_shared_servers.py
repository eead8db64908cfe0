"""helpers.servers.SharedServers, the tests' servers by spec, with a stand-in for starting a
server: one start per spec while it runs, the same process to every taker, the least
recently used idle ones stopped beyond ``keep``, a dead one started anew."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import servers
from helpers.servers import SharedServers


class FakeProcess:
    def __init__(self) -> None:
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


class FakeServer:
    def __init__(self, args: tuple[Any, ...], env: dict[str, str]) -> None:
        self.args, self.env = args, env
        self.proc = FakeProcess()
        self.url = f"http://fake/{id(self)}"
        self.stopped = False


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[FakeServer]:
    """Every server the pool starts (none is a process)."""
    made: list[FakeServer] = []

    @contextlib.contextmanager
    def running_server(
        model: Any, *args: str, env: dict[str, str], timeout: float
    ) -> Iterator[FakeServer]:
        server = FakeServer((model, *args), env)
        made.append(server)
        try:
            yield server
        finally:
            server.stopped = True

    monkeypatch.setattr(servers, "running_server", running_server)
    return made


def test_one_start_per_spec_and_the_same_server_to_every_taker(
    started: list[FakeServer], tmp_path: Path
) -> None:
    pool = SharedServers(tmp_path)
    with pool("m") as a, pool("m") as b:
        assert a is b
    with pool("m") as again:
        assert again is a and not a.stopped
    with pool("m", "--max-wait-ms", "1") as flags, pool("m", env={"X": "1"}) as env:
        assert len({id(a), id(flags), id(env)}) == 3
    assert len(started) == 3
    pool.close()
    assert all(server.stopped for server in started)


def test_a_models_file_of_the_same_entries_is_the_same_spec(
    started: list[FakeServer], tmp_path: Path
) -> None:
    pool = SharedServers(tmp_path)
    entries = [{"name": "check", "kind": "verifier", "verifier": "exact"}]
    with pool(models=entries) as a, pool(models=[dict(entries[0])]) as b:
        assert a is b
        flag, path = a.args[1:3]
        assert flag == "--models" and Path(path).read_text(encoding="utf-8").startswith("models:")
    with pool(models=entries, top={"aggregate": "mean"}) as other:
        assert other is not a
    pool.close()


def test_idle_servers_beyond_keep_stop_least_recently_used_first(
    started: list[FakeServer], tmp_path: Path
) -> None:
    pool = SharedServers(tmp_path, keep=2)
    for model in ("a", "b", "c"):
        with pool(model):
            pass
    first, second, third = started
    assert first.stopped and not second.stopped and not third.stopped
    with pool("b"), pool("d"), pool("e"):  # held: none stops while in use
        assert not any(s.stopped for s in started[1:])
    # Given back e, then d, then b: two idle ones are kept, the ones given back last.
    assert [s.stopped for s in started] == [True, False, True, False, True]
    pool.close()


def test_a_server_that_died_is_started_anew(started: list[FakeServer], tmp_path: Path) -> None:
    pool = SharedServers(tmp_path)
    with pool("m") as first:
        pass
    first.proc.returncode = -9
    with pool("m") as second:
        assert second is not first and first.stopped
    pool.close()
