"""The unit folder's rule, kept by a check: a unit test starts no process and binds no socket.

While a test of this folder is set up, runs or is torn down, an audit hook refuses
``subprocess``, ``os.fork``/``posix_spawn``/``exec``/``system`` and ``socket.bind`` (the
operation raises), and the test fails naming what it tried, even where the test caught the
error. A test that needs any of these belongs in tests/integration (see docs/development.md).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest

# urllib3 (under ray and requests) probes for IPv6 by binding a socket to ::1 as it is
# imported: imported here, before any test, so that a unit test importing it is not refused.
with contextlib.suppress(ImportError):
    import urllib3.util.connection  # noqa: F401
# matplotlib builds its font list on first use and runs fc-list for it where fontconfig is
# installed; on a fresh machine that first use would be a unit test's (the charts'): the
# list is built here, before any test, and cached for the next runs.
with contextlib.suppress(ImportError):
    import matplotlib.font_manager  # noqa: F401

#: Audit events of a new process or a listening socket.
REFUSED = frozenset(
    {
        "subprocess.Popen",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.spawn",
        "os.exec",
        "os.system",
        "socket.bind",
    }
)


class UnitTestError(RuntimeError):
    """A unit test started a process or bound a socket."""


_attempts: list[str] | None = None  # a list while a unit test's phase runs


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _attempts is not None and event in REFUSED:
        what = f"{event}{args[:2]!r}"[:200]
        _attempts.append(what)
        raise UnitTestError(f"a unit test may not {what}: move it to tests/integration")


# For the whole process (an audit hook stays once added); it acts only while _attempts is a list.
sys.addaudithook(_audit)


@contextlib.contextmanager
def _guarded() -> Iterator[None]:
    """Refuse processes and sockets in the block; fail after it if any was tried."""
    global _attempts
    _attempts = []
    try:
        yield
    finally:
        attempts, _attempts = _attempts, None
    if attempts:
        pytest.fail(
            "a unit test started a process or bound a socket (tests/integration is for those): "
            + "; ".join(attempts),
            pytrace=False,
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with _guarded():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with _guarded():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with _guarded():
        return (yield)
