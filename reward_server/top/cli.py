"""``reward-server top``: poll a server's /metrics (and /info once) and redraw the view in
place until q or Ctrl-C."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import select
import ssl
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from rich.console import Console
from rich.live import Live

from reward_server import __version__
from reward_server.top._frame import Frame, build_frame
from reward_server.top._render import render
from reward_server.top._scrape import Snapshot

__all__ = ["KeyRefused", "Poller", "api_key", "build_parser", "main"]

PROG = "reward-server top"
#: Where the key comes from when --api-key is not given, in order: the server's own
#: variable, then the one the reward client's framework adapters read.
KEY_ENV = ("REWARD_SERVER_API_KEY", "REWARD_API_KEY")
CA_ENV = "REWARD_CA_BUNDLE"


class KeyRefused(Exception):
    """/info answered 401 or 403: the key is wrong or missing."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="A live view of a reward server in the terminal: throughput, latency "
        "percentiles, errors, queues, tenants and each model's score distribution, from its "
        "/metrics, redrawn in place. q or Ctrl-C quits.",
    )
    parser.add_argument("url", metavar="URL", help="the server, e.g. http://127.0.0.1:8000")
    parser.add_argument(
        "--api-key",
        metavar="KEY",
        default=None,
        help=f"the server's API key (for /info) [default: env {' or '.join(KEY_ENV)}]",
    )
    parser.add_argument(
        "--interval",
        type=float,
        default=2.0,
        metavar="SECONDS",
        help="seconds between polls; rates and latencies cover the last one [default: 2]",
    )
    parser.add_argument(
        "--once",
        action="store_true",
        help="poll twice, one interval apart, print one frame and exit",
    )
    parser.add_argument(
        "--svg", metavar="PATH", help="with --once: also save the frame as an SVG image"
    )
    parser.add_argument(
        "--ca-cert",
        metavar="PEM",
        default=os.environ.get(CA_ENV) or None,
        help=f"CA bundle an https server's certificate is checked with [default: env {CA_ENV}]",
    )
    parser.add_argument(
        "--insecure", action="store_true", help="do not check an https server's certificate"
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def _reason(exc: httpx.HTTPError) -> str:
    """A short reason for a failed request: "connection refused", "timed out", ..."""
    if isinstance(exc, httpx.TimeoutException):
        return "no answer in time"
    text = str(exc) or type(exc).__name__
    if "refused" in text.lower():
        return "connection refused"
    return text.split("] ", 1)[-1] if text.startswith("[Errno") else text


@dataclass
class Poller:
    """Asks the server for /info (until it answered) and /metrics; makes the frames."""

    url: str
    key: str | None
    interval: float
    verify: Any = True
    transport: httpx.BaseTransport | None = None
    #: /info's answer once it came (None: not yet).
    info: dict[str, Any] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        headers = {"User-Agent": f"reward-server-top/{__version__}"}
        if self.key:
            headers["Authorization"] = f"Bearer {self.key}"
        self.http = httpx.Client(
            base_url=self.url,
            headers=headers,
            verify=self.verify,
            timeout=max(5.0, self.interval),
            transport=self.transport,
        )

    def close(self) -> None:
        self.http.close()

    def _fetch_info(self) -> dict[str, Any]:
        answer = self.http.get("/info")
        if answer.status_code in (401, 403):
            raise KeyRefused(_refused_message(answer.status_code, self.key))
        if answer.status_code != 200:
            return {}  # the figures come from /metrics; the names are a nicety
        body = answer.json()
        return body if isinstance(body, dict) else {}

    def scrape(self) -> Snapshot:
        """One scrape of /metrics; raises httpx.HTTPError when there is none."""
        if self.info is None:
            self.info = self._fetch_info()
        answer = self.http.get("/metrics")
        answer.raise_for_status()
        return Snapshot.parse(answer.text, time.monotonic())

    def poll(self, before: Snapshot | None) -> tuple[Frame, Snapshot | None]:
        """The frame of a new scrape, with rates since ``before``; and that scrape (None when
        the server could not be reached: the next rates start afresh)."""
        try:
            now = self.scrape()
        except httpx.HTTPStatusError as exc:
            self.info = None
            return self.problem(f"{exc.request.url.path} answered {exc.response.status_code}"), None
        except httpx.HTTPError as exc:
            self.info = None
            return self.problem(f"cannot reach {self.url}: {_reason(exc)}"), None
        return build_frame(self.url, self.interval, self.info or {}, now, before), now

    def problem(self, what: str) -> Frame:
        line = f"{what}; retrying every {self.interval:g} s"
        return Frame(url=self.url, interval_s=self.interval, problem=line)


def api_key(given: str | None, environ: Mapping[str, str]) -> str | None:
    """The key: --api-key's, else the first of KEY_ENV set (None: no key)."""
    return given or next((environ[name] for name in KEY_ENV if environ.get(name)), None)


def _refused_message(status: int, key: str | None) -> str:
    hint = f"pass --api-key or set {KEY_ENV[0]}"
    if key:
        return f"the API key was refused ({status}): {hint}"
    return f"the server needs an API key ({status}): {hint}"


@contextlib.contextmanager
def _keypresses() -> Iterator[Callable[[float], str]]:
    """A function that waits up to some seconds for keys typed and returns them ("" if
    none). On a terminal, stdin is in cbreak mode meanwhile (keys come unbuffered and
    unechoed; Ctrl-C still interrupts) and restored after; elsewhere it only waits."""
    if not sys.stdin.isatty():
        yield lambda seconds: (time.sleep(max(seconds, 0.0)), "")[1]
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)

    def wait(seconds: float) -> str:
        ready, _, _ = select.select([fd], [], [], max(seconds, 0.0))
        return os.read(fd, 64).decode(errors="replace") if ready else ""

    tty.setcbreak(fd)
    try:
        yield wait
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _live(poller: Poller, console: Console) -> int:
    """Redraw until q; 0."""
    before: Snapshot | None = None
    with (
        _keypresses() as wait,
        Live(console=console, screen=True, auto_refresh=False, redirect_stderr=False) as live,
    ):
        while True:
            due = time.monotonic() + poller.interval
            frame, before = poller.poll(before)
            live.update(render(frame), refresh=True)
            while (left := due - time.monotonic()) > 0:
                if "q" in wait(left).lower():
                    return 0


def _once(poller: Poller, svg: str | None) -> int:
    """Two scrapes one interval apart, one frame printed; 0, or 1 when the server is down."""
    frame, before = poller.poll(None)
    if before is not None:
        time.sleep(poller.interval)
        frame, _ = poller.poll(before)
    if frame.problem is not None:
        print(f"{PROG}: error: {frame.problem.split('; retrying')[0]}", file=sys.stderr)
        return 1
    console = Console(record=svg is not None)
    console.print(render(frame))
    if svg is not None:
        # Without rich's web fonts (a CDN): the image names nothing off the machine, and
        # falls back to the reader's monospace font.
        image = re.sub(r"@font-face\s*\{[^}]*\}\s*", "", console.export_svg(title=PROG))
        with open(svg, "w", encoding="utf-8") as file:
            file.write(image)
    return 0


def _verify(args: argparse.Namespace) -> ssl.SSLContext | bool:
    if args.insecure:
        return False
    if args.ca_cert:
        return ssl.create_default_context(cafile=args.ca_cert)
    return True


def main(argv: Sequence[str]) -> int:
    """Run the view; the exit code (2: usage, a refused key or a CA file it cannot read)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.interval <= 0:
        parser.error("--interval must be above 0")
    if args.svg and not args.once:
        parser.error("--svg needs --once")
    url = args.url.rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    key = api_key(args.api_key, os.environ)
    try:
        verify = _verify(args)
    except (OSError, ssl.SSLError) as exc:
        print(f"{PROG}: error: --ca-cert {args.ca_cert}: {exc}", file=sys.stderr)
        return 2
    poller = Poller(url, key, args.interval, verify)
    try:
        return _once(poller, args.svg) if args.once else _live(poller, Console())
    except KeyRefused as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C is the other way to quit
        return 0
    finally:
        poller.close()
