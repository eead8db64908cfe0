"""Pipes between the server and a sandboxed program, on the event loop, never blocking it.

A program's stdout and stderr are drained while it runs, into a buffer capped at a number of
bytes: the excess is read and dropped (a full pipe would stop the program), and the cap is
reported. Its stdin is fed as the pipe accepts it; a program that exits without reading all
of it ends the feed quietly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable

_CHUNK = 1 << 16
# Reads per wake-up: a program writing as fast as the pipe drains must not hold the event
# loop in one callback.
_READS_PER_WAKE = 8
#: Bytes of the end of a stream kept besides the capped head (to recognise an error message
#: that comes after a flood of output, e.g. "MemoryError").
TAIL_BYTES = 4096


class Drain:
    """Reads one pipe to its end on the running loop, keeping at most ``cap`` bytes."""

    def __init__(self, fd: int, cap: int, on_exceed: Callable[[], None] | None = None) -> None:
        self.fd = fd
        self.cap = cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.truncated = False
        self._on_exceed = on_exceed
        self._loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = self._loop.create_future()
        os.set_blocking(fd, False)
        self._loop.add_reader(fd, self._readable)

    def _readable(self) -> None:
        for _ in range(_READS_PER_WAKE):
            try:
                chunk = os.read(self.fd, _CHUNK)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self.close()
                return
            self.total += len(chunk)
            room = self.cap - len(self.head)
            if room > 0:
                self.head += chunk[:room]
            if len(chunk) > room:
                if not self.truncated and self._on_exceed is not None:
                    self._on_exceed()
                self.truncated = True
            self.tail += chunk[-TAIL_BYTES:]
            del self.tail[:-TAIL_BYTES]

    def close(self) -> None:
        """Stop reading (at EOF, or when the caller gives up waiting) and close the pipe."""
        if self.fd < 0:
            return
        self._loop.remove_reader(self.fd)
        os.close(self.fd)
        self.fd = -1
        if not self.done.done():
            self.done.set_result(None)


class Feed:
    """Writes ``data`` into one pipe on the running loop, then closes it."""

    def __init__(self, fd: int, data: bytes) -> None:
        self.fd = fd
        self._view = memoryview(data)
        self._loop = asyncio.get_running_loop()
        os.set_blocking(fd, False)
        if self._view:
            self._loop.add_writer(fd, self._writable)
        else:
            self.close()

    def _writable(self) -> None:
        try:
            written = os.write(self.fd, self._view[:_CHUNK])
        except BlockingIOError:
            return
        except OSError:  # the program closed its stdin or exited: the rest is not wanted
            self.close()
            return
        self._view = self._view[written:]
        if not self._view:
            self.close()

    def close(self) -> None:
        if self.fd < 0:
            return
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_writer(self.fd)
        os.close(self.fd)
        self.fd = -1
