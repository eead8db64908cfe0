"""``reward-server top`` in a real terminal: tmux runs it against a real server under load,
and the test reads the screen (``tmux capture-pane``), types q and Ctrl-C, and checks what
it says when the key is wrong and when nothing listens on the port.

Each run is wrapped as ``bash -c 'reward-server top ...; echo "[exit $?]"; exec sleep'``:
the wrapper prints the exit status on the screen and keeps the pane open. tmux 3.3's own
``remain-on-exit`` is not used: it sometimes never reaps a command that exits (the pane is
dead with an empty ``#{pane_dead_status}``) and drops the command's last output, so a test
reading either would be flaky. bash waits for the command and lets a Ctrl-C the command
handled go by (it prints the status after it too).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from helpers.models_files import keys_yaml
from helpers.posting import bearer
from helpers.tenants import KEY_A, KEY_B, WRONG
from observability_parts import composite_server
from server_proc import REWARD_SERVER, ServerProcess, free_port, wait_until

TMUX = shutil.which("tmux")
WRAPPER = '"$@"; echo "[exit $?]"; exec sleep 600'
#: The figures' line: "items/s 12.5   requests/s 3.0 ... items total 1,234 ..."
ITEMS_S = re.compile(r"items/s ([\d,.]+)")
ITEMS_TOTAL = re.compile(r"items total ([\d,]+)")


def _number(text: str) -> float:
    return float(text.replace(",", ""))


class Terminal:
    """A private tmux server (its own socket name, no config file) with one 160x50 session
    per run."""

    def __init__(self) -> None:
        assert TMUX is not None, "tmux is not installed (apt-get install tmux)"
        self.socket = f"reward-top-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        # COLUMNS and LINES left out too: rich prefers them to the pane's size, and a CI job
        # may export COLUMNS=80 (the pane is 160 wide).
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("TMUX", "REWARD_")) and k not in ("COLUMNS", "LINES")
        }

    def tmux(self, *args: str) -> str:
        done = subprocess.run(
            [str(TMUX), "-L", self.socket, "-f", os.devnull, *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=30,
            check=True,
        )
        return done.stdout

    def start(self, session: str, *argv: str, env: dict[str, str] | None = None) -> None:
        """Run ``reward-server top *argv`` in a new session."""
        extra = [arg for name, value in (env or {}).items() for arg in ("-e", f"{name}={value}")]
        command = ["bash", "-c", WRAPPER, "top", str(REWARD_SERVER), "top", *argv]
        self.tmux("new-session", "-d", "-s", session, "-x", "160", "-y", "50", *extra, *command)

    def screen(self, session: str) -> str:
        """What the pane shows now, and the lines scrolled above it."""
        return self.tmux("capture-pane", "-p", "-S", "-", "-t", session)

    def wait_for(self, session: str, pattern: str, timeout: float = 60) -> str:
        """The screen once it shows ``pattern`` (a regular expression)."""
        found: list[str] = []

        def shown() -> bool:
            found[:] = [self.screen(session)]
            return re.search(pattern, found[0]) is not None

        try:
            wait_until(shown, timeout, f"{pattern!r} on the screen")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the screen:\n{found[0] if found else ''}") from None
        return found[0]

    def keys(self, session: str, *keys: str) -> None:
        self.tmux("send-keys", "-t", session, *keys)

    def close(self) -> None:
        subprocess.run(
            [str(TMUX), "-L", self.socket, "kill-server"], capture_output=True, env=self.env
        )


@pytest.fixture
def terminal() -> Iterator[Terminal]:
    term = Terminal()
    try:
        yield term
    finally:
        term.close()


@pytest.fixture(scope="module")
def server(gpt2_rm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A composite of a reward model and a verifier, with two tenants' keys."""
    keys = keys_yaml(("alpha", KEY_A), ("beta", KEY_B))
    with composite_server(gpt2_rm, tmp_path_factory.mktemp("top"), keys) as srv:
        yield srv


class Load:
    """/score requests in a loop from a thread (alpha's key), of varied lengths, until stopped."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="top-load", daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, headers=bearer(KEY_A), timeout=60) as http:
            while not self._stop.is_set():
                n = self.sent
                responses = ["4" * (1 + (n + i) % 40) for i in range(4)]
                queries = [f"{n} + {i}?" for i in range(4)]  # new items: no score cache hits
                body = {"queries": queries, "responses": responses, "labels": ["4"] * 4}
                assert http.post("/score", json=body).status_code == 200
                self.sent += 1

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


def test_tmux_is_installed() -> None:
    assert TMUX is not None, "tmux is not installed (apt-get install tmux)"


def test_the_view_shows_live_figures_and_quits_on_q(
    server: ServerProcess, terminal: Terminal
) -> None:
    with Load(server.url) as load:
        wait_until(lambda: load.sent > 0, 60, "the first scored request")
        terminal.start("live", server.url, "--api-key", KEY_A)
        terminal.wait_for("live", r"items/s [1-9]|items/s 0\.[1-9]")
        # A model's rate needs a second scrape after its first items: read the frame with it.
        first = terminal.wait_for("live", r"(?m)^\s*rm\s+[1-9][\d.,]*\s")
        assert "model rm+exact (rm, exact)" in first and server.url in first
        assert _number(ITEMS_S.search(first)[1]) > 0  # type: ignore[index]
        # /score's latency percentiles, in ms or s, over the last interval
        row = next(line for line in first.splitlines() if line.strip().startswith("/score"))
        assert re.match(r"\s*/score(\s+[\d.,]+){3}(\s+[\d.]+ m?s){3}\s", row), row
        # the tenants and models tables
        assert re.search(r"\balpha\s+[1-9][\d.,]*\s", first), first  # alpha's items/s
        assert re.search(r"^\s*rm\s+[1-9][\d.,]*\s", first, re.M), first  # rm's items/s
        # each model's score distribution over its window: p05 p25 p50 p75 p95 mean std
        for model in ("rm+exact", "rm", "exact"):
            scores = rf"^\s*{re.escape(model)}\s+alpha\s+[1-9][\d,]*(\s+-?[\d.e+-]+){{7}}\s"
            assert re.search(scores, first, re.M), first
        # the view updates in place: the total of items scored grows from frame to frame
        total = _number(ITEMS_TOTAL.search(first)[1])  # type: ignore[index]

        def grew() -> bool:
            match = ITEMS_TOTAL.search(terminal.screen("live"))
            return match is not None and _number(match[1]) > total

        wait_until(grew, 60, "a later frame with more items")
        terminal.keys("live", "q")
        screen = terminal.wait_for("live", r"\[exit \d+\]")
    assert "[exit 0]" in screen and "Traceback" not in screen
    assert "items/s" not in screen  # the view's screen is gone, the terminal restored


def test_ctrl_c_quits_cleanly_and_the_key_may_come_from_the_environment(
    server: ServerProcess, terminal: Terminal
) -> None:
    terminal.start("ctrl-c", server.url, env={"REWARD_SERVER_API_KEY": KEY_B})
    terminal.wait_for("ctrl-c", r"model rm\+exact")
    terminal.keys("ctrl-c", "C-c")
    screen = terminal.wait_for("ctrl-c", r"\[exit \d+\]")
    assert "[exit 0]" in screen
    assert "Traceback" not in screen and "KeyboardInterrupt" not in screen


def test_a_wrong_key_is_said_clearly(server: ServerProcess, terminal: Terminal) -> None:
    terminal.start("wrong", server.url, "--api-key", WRONG)
    screen = terminal.wait_for("wrong", r"\[exit \d+\]")
    assert "[exit 2]" in screen
    assert (
        "reward-server top: error: the API key was refused (401): pass --api-key or set "
        "REWARD_SERVER_API_KEY" in screen.replace("\n", "")
    )
    assert "Traceback" not in screen and WRONG not in screen


def test_a_server_that_is_down_is_said_clearly_and_retried(terminal: Terminal) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    terminal.start("down", url)
    said = f"cannot reach {url}: connection refused; retrying every 2 s"
    first = terminal.wait_for("down", re.escape(said))
    clock = re.search(r"(\d\d:\d\d:\d\d), every 2 s", first)
    assert clock is not None
    # still trying: a later poll redraws the same line with its own time
    terminal.wait_for("down", rf"(?!{clock[1]})\d\d:\d\d:\d\d, every 2 s; q quits")
    assert said in terminal.screen("down")
    terminal.keys("down", "q")
    screen = terminal.wait_for("down", r"\[exit \d+\]")
    assert "[exit 0]" in screen and "Traceback" not in screen
