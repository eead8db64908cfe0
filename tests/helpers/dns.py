"""Names that resolve to several addresses, for the client's ``dns+http://`` targets: a stub
resolver whose answers a test changes, and a fake clock."""

from __future__ import annotations

import threading
from collections.abc import Sequence


class StubResolver:
    """Answers from ``answers[host]`` (a list it may change), counting the calls."""

    def __init__(self, **answers: Sequence[str]) -> None:
        self.answers = {host.replace("_", "."): list(a) for host, a in answers.items()}
        self.calls: list[tuple[str, int]] = []
        self.error: OSError | None = None
        self.lock = threading.Lock()

    def set(self, host: str, addresses: Sequence[str]) -> None:
        with self.lock:
            self.answers[host] = list(addresses)

    def __call__(self, host: str, port: int) -> list[str]:
        with self.lock:
            self.calls.append((host, port))
            if self.error is not None:
                raise self.error
            return list(self.answers.get(host, []))


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now
