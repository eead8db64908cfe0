"""The sandbox's native executable (``_launch.c`` and ``_serve.c``), built once per process
with the host's C compiler: the runner of items whose programs are executables, and the
launcher of each of their runs (see the C files for why and what they do). Without a
compiler, or when the build fails, the Python runner serves those items too and forks itself
for each run: the same isolation, milliseconds more per item and per run.
"""

from __future__ import annotations

import functools
import logging
import shutil
import subprocess
import tempfile
from pathlib import Path

from reward_server.sandbox._languages import SANDBOX_PATH

logger = logging.getLogger(__name__)

LAUNCHER_SOURCES = tuple(Path(__file__).with_name(name) for name in ("_launch.c", "_serve.c"))
#: Where the launcher lies inside an item's sandbox (beside ``prog`` and ``work``).
LAUNCHER_NAME = "launch"
_COMPILERS = ("cc", "gcc", "clang")


def find_compiler() -> str | None:
    """The host's C compiler (the sandbox's PATH first, then the server's), or None."""
    for name in _COMPILERS:
        found = shutil.which(name, path=SANDBOX_PATH) or shutil.which(name)
        if found:
            return found
    return None


@functools.cache
def build_launcher(compiler: str | None = None) -> bytes | None:
    """The native executable, or None (then the Python runner forks for every run).

    Linked statically when the C library allows it: a static binary skips the dynamic
    loader at every run, which is a measurable share of a short test's start. It is copied
    into each item's sandbox, so it needs nothing of the host's file system at run time.
    """
    cc = compiler or find_compiler()
    if cc is None:
        # Info, not a warning: an image without compilers (Python programs only, which never
        # use the launcher) is a normal set-up.
        logger.info(
            "sandbox: no C compiler (%s) on the host: executables run under the Python "
            "runner, from a fork of it (slower per item and per test)",
            "/".join(_COMPILERS),
        )
        return None
    failure = ""
    with tempfile.TemporaryDirectory(prefix="sandbox-launcher-") as folder:
        out = Path(folder, LAUNCHER_NAME)
        for link in (["-static"], []):
            argv = [cc, "-O2", "-s", *link, "-o", str(out), *map(str, LAUNCHER_SOURCES)]
            try:
                subprocess.run(argv, capture_output=True, timeout=120, check=True)
                return out.read_bytes()
            except subprocess.CalledProcessError as exc:
                failure = exc.stderr.decode("utf-8", "replace").strip()[-400:]
            except (OSError, subprocess.SubprocessError) as exc:
                failure = str(exc)
    logger.warning(
        "sandbox: could not build the native runner with %s (%s): executables run under "
        "the Python runner, from a fork of it (slower per item and per test)",
        cc,
        failure,
    )
    return None
