"""``reward-server``: load a reward model, then serve it with uvicorn.

Every flag is derived from a ``ServerSettings`` field (so flags, env vars and settings never
drift apart): ``--max-batch-tokens`` <-> ``max_batch_tokens`` <-> ``REWARD_SERVER_MAX_BATCH_TOKENS``,
spelt as ``ppo-client train``'s flags are (:mod:`settings_cli`). Flags override the environment.
"""

from __future__ import annotations

import argparse
import logging
import signal
import ssl
import sys
import types
import typing
from collections.abc import Callable, Sequence
from typing import NoReturn

import uvicorn
from pydantic import ValidationError

import settings_cli
from reward_server import __version__
from reward_server.config import ENV_PREFIX, ServerSettings
from reward_server.errors import ModelLoadError
from settings_cli import EPILOG, HelpFormatter, add_flags
from settings_cli.exit import exit_now

if typing.TYPE_CHECKING:
    from reward_server.scoring.registry import ModelRegistry

logger = logging.getLogger("reward_server")

PROG = "reward-server"

#: Python logging level for uvicorn's extra "trace" level.
_TRACE = 5

#: Seconds an idle keep-alive connection stays open. Longer than the idle expiry of
#: clients (httpx: 5 s) and of typical proxies (60 s), so that the client side always
#: closes first: with equal timeouts a request sent on a connection the server is closing
#: at that instant fails with a bare ReadError.
KEEP_ALIVE_S = 75


def build_parser() -> argparse.ArgumentParser:
    """The argument parser, one flag per ServerSettings field (:mod:`settings_cli`)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Serve a sequence-classification reward model over HTTP: POST /score "
        "takes texts, query/response pairs or conversations and returns raw reward logits.",
        epilog=f"Every flag can also be set through its environment variable "
        f"({ENV_PREFIX}<FLAG>, e.g. {ENV_PREFIX}MAX_BATCH_TOKENS); flags win. {EPILOG}",
        formatter_class=HelpFormatter,
        allow_abbrev=False,
    )
    add_flags(parser, ServerSettings, env_prefix=ENV_PREFIX)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    return parser


def parse_settings(argv: Sequence[str] | None = None) -> ServerSettings:
    """Settings from flags over ``REWARD_SERVER_*`` env vars (exits with usage on error)."""
    parser = build_parser()
    given = vars(parser.parse_args(argv))
    try:
        # Keyword arguments beat environment variables in pydantic-settings.
        return ServerSettings(**given)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            if not err["loc"]:  # the settings as a whole: the message names the flags
                problems.append(str(err["msg"]).removeprefix("Value error, "))
                continue
            name = str(err["loc"][0])
            if err["type"] == "missing":
                problems.append(
                    f"{settings_cli.flag(name)} is required (or set {ENV_PREFIX}{name.upper()})"
                )
            else:
                problems.append(f"{settings_cli.flag(name)}: {err['msg']}")
        parser.error("; ".join(problems))


def _configure_logging(level: str) -> None:
    numeric = _TRACE if level == "trace" else getattr(logging, level.upper())
    logging.addLevelName(_TRACE, "TRACE")
    logging.basicConfig(
        level=numeric,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _load(registry: ModelRegistry) -> bool:
    """Load the served models, or print one line saying why not and return False."""
    try:
        registry.load()
        return True
    except ModelLoadError as exc:
        reason = str(exc)
    except Exception as exc:  # an unexpected failure still gets one line, not a traceback
        logger.debug("model load failed", exc_info=exc)
        reason = f"{type(exc).__name__}: {exc}"
    reason = " ".join(reason.split())  # one line, whatever the message held
    settings = registry.settings
    what = f"model {settings.model}" if settings.models is None else f"models of {settings.models}"
    print(f"{PROG}: error: could not load {what}: {reason}", file=sys.stderr)
    return False


def check_tls(settings: ServerSettings) -> str | None:
    """Why the server cannot serve HTTPS with its --ssl-* files, or None (also without TLS).

    Checked before the model loads, so a missing or wrong file costs no model load. The
    password is never prompted for: an encrypted key without --ssl-keyfile-password fails
    here (OpenSSL would otherwise ask on the terminal, which a container does not have).
    """
    if settings.ssl_certfile is None or settings.ssl_keyfile is None:
        return None
    for flag, path in (
        ("--ssl-certfile", settings.ssl_certfile),
        ("--ssl-keyfile", settings.ssl_keyfile),
    ):
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            return f"{flag}: cannot read {path}: {exc.strerror or exc}"
    secret = settings.ssl_keyfile_password
    password = secret.get_secret_value() if secret is not None else ""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
            settings.ssl_certfile, settings.ssl_keyfile, lambda: password
        )
    except ssl.SSLError as exc:
        if _encrypted_pem(settings.ssl_keyfile):  # OpenSSL says no more than "PEM lib"
            if secret is None:
                return (
                    f"--ssl-keyfile {settings.ssl_keyfile} is encrypted: give its password "
                    f"with --ssl-keyfile-password (or {ENV_PREFIX}SSL_KEYFILE_PASSWORD)"
                )
            return f"--ssl-keyfile-password does not decrypt --ssl-keyfile {settings.ssl_keyfile}"
        return (
            f"--ssl-certfile {settings.ssl_certfile} / --ssl-keyfile {settings.ssl_keyfile}: "
            f"not a PEM certificate and its private key: {exc}"
        )
    return None


def _encrypted_pem(path: str) -> bool:
    """Whether the PEM key file at ``path`` is encrypted (PKCS#8 or OpenSSL's old form)."""
    try:
        with open(path, "rb") as file:
            head = file.read(4096)
    except OSError:
        return False
    return b"ENCRYPTED PRIVATE KEY" in head or b"Proc-Type: 4,ENCRYPTED" in head


def hash_key_main(argv: Sequence[str]) -> int:
    """``reward-server hash-key``: the key_sha256 of a key for the keys file (--api-keys)."""
    import getpass
    import secrets

    from reward_server.config.tenants import hash_key

    parser = argparse.ArgumentParser(
        prog=f"{PROG} hash-key",
        description="Print the key_sha256 of an API key for --api-keys. The key is read from "
        "stdin (prompted for, unechoed, on a terminal), never from the command line, where "
        'ps would show it. Same as: printf %s "$KEY" | sha256sum',
    )
    parser.add_argument(
        "--new",
        action="store_true",
        help="make a new random key instead and print it (give it to the tenant) and its hash",
    )
    args = parser.parse_args(argv)
    if args.new:
        key = secrets.token_urlsafe(32)
        print(f"key: {key}")
        print(f"key_sha256: {hash_key(key)}")
        return 0
    # HTTP drops the spaces around a header value, so a key never has any: strip them (and
    # the newline of `echo "$KEY" |`).
    raw = getpass.getpass("API key: ") if sys.stdin.isatty() else sys.stdin.read()
    key = raw.strip()
    if not key:
        print(f"{PROG} hash-key: error: no key on stdin", file=sys.stderr)
        return 2
    print(hash_key(key))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags, load the model, serve until SIGTERM/SIGINT; return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["hash-key"]:
        return hash_key_main(args[1:])
    if args[:1] == ["top"]:  # a live view of a running server (httpx and rich only)
        from reward_server.top import main as top_main

        return top_main(args[1:])
    settings = parse_settings(args)
    _configure_logging(settings.log_level)
    tls_problem = check_tls(settings)
    if tls_problem is not None:
        print(f"{PROG}: error: {tls_problem}", file=sys.stderr)
        return 2
    from reward_server.http.app import create_app

    app = create_app(settings)
    registry: ModelRegistry = app.state.registry
    logger.info("loading reward model %s", settings.served)
    try:
        loaded = _load(registry)
    except KeyboardInterrupt:
        return 130
    if not loaded:
        return 1

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # uvicorn's loggers propagate to the root handler set up above
        access_log=settings.log_level in ("debug", "trace"),
        lifespan="on",
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=None,  # finish every request in flight, however long
        ssl_certfile=settings.ssl_certfile,
        ssl_keyfile=settings.ssl_keyfile,
        ssl_keyfile_password=(
            settings.ssl_keyfile_password.get_secret_value()
            if settings.ssl_keyfile_password is not None
            else None
        ),
    )
    server = DrainingServer(config, on_drain=registry.begin_drain)
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    model = registry.model  # the first reward model; None when only verifiers are served
    logger.info(
        "serving %s on %s (%s) at %s://%s:%d",
        registry.name,
        model.device if model is not None else "cpu",
        model.info().get("dtype", "?") if model is not None else "verifiers",
        "https" if settings.tls else "http",
        host,
        settings.port,
    )
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits this way when it cannot bind or start
        code = exc.code if isinstance(exc.code, int) else 1
        return code or 1
    if not server.started:
        return 1
    return 0


def run() -> NoReturn:
    """Entry point of the ``reward-server`` console script (and ``python -m reward_server``):
    :func:`main`, then :func:`settings_cli.exit.exit_now` (a stopped server has drained its
    requests and closed its engines; the interpreter's teardown would only spend CPU)."""
    exit_now(main())


class DrainingServer(uvicorn.Server):
    """uvicorn.Server that flips the app to draining first and exits 0 on SIGTERM/SIGINT."""

    def __init__(self, config: uvicorn.Config, on_drain: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_drain = on_drain

    def handle_exit(self, sig: int, frame: types.FrameType | None) -> None:
        """Mark the app draining (/health 503), then let uvicorn shut down gracefully."""
        self._on_drain()
        super().handle_exit(sig, frame)
        # uvicorn re-raises a captured signal after shutting down, which would make a
        # graceful SIGTERM exit look like a kill (-15). A drained shutdown exits 0.
        if sig in (signal.SIGTERM, signal.SIGINT):
            self._captured_signals.clear()
