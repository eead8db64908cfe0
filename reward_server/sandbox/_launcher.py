"""The sandbox's native runner (``_serve.c``, ``_message.c``, ``_launch.c``), built once per
process with the host's C compiler: the runner of every item whose programs are executables
(compiled programs, compilers, node, java; see the C files for why and what it does).
Without a C compiler, or when the build fails, those languages are unavailable (the server
says so at start-up, naming the language); Python programs need no compiler.

Every warning is an error (``-Wall -Wextra -Werror``), and the hardening the compiler
accepts is on: fortified libc calls, stack protector and clash protection, control-flow
protection, a read-only GOT (RELRO, bind now), a non-executable stack, a position-
independent executable (static where the C library allows it).
"""

from __future__ import annotations

import functools
import logging
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from reward_server.sandbox._languages import SANDBOX_PATH

logger = logging.getLogger(__name__)

LAUNCHER_SOURCES = tuple(
    Path(__file__).with_name(name) for name in ("_serve.c", "_message.c", "_launch.c")
)
#: Where the launcher lies inside an item's sandbox (beside ``prog`` and ``work``).
LAUNCHER_NAME = "launch"
_COMPILERS = ("cc", "gcc", "clang")
#: Always: optimised, every warning an error (a compiler that cannot is not used).
BASE_FLAGS = ("-O2", "-Wall", "-Wextra", "-Werror", "-Wformat", "-Wformat-security")
#: Hardening, each taken when the compiler accepts it (the first accepted of a row).
_HARDENING = (
    (("-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=3"), ("-U_FORTIFY_SOURCE", "-D_FORTIFY_SOURCE=2")),
    (("-fstack-protector-strong",), ("-fstack-protector",)),
    (("-fstack-clash-protection",),),
    (("-fcf-protection",),),
    (("-Wl,-z,relro,-z,now",),),
    (("-Wl,-z,noexecstack",),),
)
#: How to link, by preference: a static PIE (no dynamic loader at each run's start, and its
#: address randomised), static, a dynamic PIE, the compiler's default.
_LINKS = (("-static-pie", "-fPIE"), ("-static",), ("-fPIE", "-pie"), ())
_PROBE = '#include <stdio.h>\nint main(void) { return puts("") < 0; }\n'


def find_compiler() -> str | None:
    """The host's C compiler (the sandbox's PATH first, then the server's), or None."""
    for name in _COMPILERS:
        found = shutil.which(name, path=SANDBOX_PATH) or shutil.which(name)
        if found:
            return found
    return None


def _compile(cc: str, flags: Sequence[str], sources: Sequence[Path], out: Path) -> str | None:
    """Compile and link; None, or the compiler's complaint."""
    argv = [cc, *flags, "-s", "-o", str(out), *map(str, sources)]
    try:
        subprocess.run(argv, capture_output=True, timeout=120, check=True)
    except subprocess.CalledProcessError as exc:
        return exc.stderr.decode("utf-8", "replace").strip()[-400:] or f"exit {exc.returncode}"
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    return None


@functools.cache
def launcher_flags(cc: str) -> tuple[str, ...]:
    """The flags the native runner is built with by ``cc``: :data:`BASE_FLAGS`, then each
    hardening flag and the first way of linking that ``cc`` accepts (a trivial program
    built with them, every warning an error)."""
    with tempfile.TemporaryDirectory(prefix="sandbox-cc-") as folder:
        probe = Path(folder, "probe.c")
        probe.write_text(_PROBE, encoding="utf-8")

        def accepted(flags: Sequence[str]) -> bool:
            return _compile(cc, flags, [probe], Path(folder, "probe")) is None

        best = [*BASE_FLAGS, *(flag for row in _HARDENING for flag in row[0]), *_LINKS[0]]
        if accepted(best):  # the usual case: one compiler run
            return tuple(best)
        chosen = list(BASE_FLAGS)
        for row in _HARDENING:
            chosen += next((list(option) for option in row if accepted([*chosen, *option])), [])
        link = next(link for link in _LINKS if not link or accepted([*chosen, *link]))
        return (*chosen, *link)


def _build(cc: str, sources: Sequence[Path]) -> tuple[bytes | None, str]:
    """The executable built from ``sources`` with :func:`launcher_flags`, or None and why."""
    flags = launcher_flags(cc)
    with tempfile.TemporaryDirectory(prefix="sandbox-launcher-") as folder:
        out = Path(folder, LAUNCHER_NAME)
        failure = _compile(cc, flags, sources, out)
        if failure is None:
            logger.info("sandbox: native runner built with %s %s", cc, " ".join(flags))
            return out.read_bytes(), ""
    why = f"could not build the native runner with {cc}: {failure}"
    logger.warning("%s", why)
    return None, why


@functools.cache
def build_launcher(compiler: str | None = None) -> tuple[bytes | None, str]:
    """The native runner's executable, or None and why not (no compiler, or its build
    failed). It is copied into each item's sandbox, so it needs nothing of the host's file
    system at run time when it is static."""
    cc = compiler or find_compiler()
    if cc is None:
        # Info, not a warning: an image without compilers (Python programs only, which never
        # use the native runner) is a normal set-up.
        why = f"no C compiler ({', '.join(_COMPILERS)}) to build the sandbox's native runner"
        logger.info("sandbox: %s: only Python programs can run", why)
        return None, why
    return _build(cc, LAUNCHER_SOURCES)
