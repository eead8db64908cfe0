"""One item's sandbox: bwrap (or, in mode none, a plain process) with a runner in it, the
program built once, then each test started by the runner: for Python a fork of the warm
Python runner (``_runner.py``), for an executable a fork of the native runner
(``_serve.c``)."""

from __future__ import annotations

import logging
import os
import posixpath
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from reward_server.sandbox._channel import Channel, RunnerGone
from reward_server.sandbox._host import SANDBOX_ENV, SANDBOX_ROOT, bwrap_argv, drop_privileges
from reward_server.sandbox._languages import Language, language
from reward_server.sandbox._launcher import LAUNCHER_NAME
from reward_server.sandbox._types import CompileResult, Limits, RunResult
from reward_server.sandbox._verdicts import build_error, build_result, run_error, run_result

if TYPE_CHECKING:
    from reward_server.sandbox._sandbox import Sandbox

# The runner, one source: the forked job's side, then the loop that uses it.
logger = logging.getLogger(__name__)

RUNNER_SOURCE = "\n".join(
    Path(__file__).with_name(name).read_text(encoding="utf-8")
    for name in ("_runner_job.py", "_runner.py")
)
# Compiling that source at every start would be a large share of an item's start: the
# sandbox's interpreter compiles it once (compile_runner), and each runner starts from the
# bytecode, read from a descriptor.
_COMPILE = (
    "import marshal, sys; sys.stdout.buffer.write(marshal.dumps(compile("
    "sys.stdin.buffer.read(), '<sandbox runner>', 'exec', dont_inherit=True)))"
)
_BOOT = (
    "import marshal, os; code = marshal.loads(os.pread({fd}, {size}, 0)); os.close({fd}); "
    "exec(code)"
)


def compile_runner(python: str) -> bytes | None:
    """The runner's bytecode for ``python`` (marshal is per interpreter version), or None
    when that fails (then each runner compiles its source)."""
    try:
        done = subprocess.run(
            [python, "-I", "-S", "-c", _COMPILE],
            input=RUNNER_SOURCE.encode(),
            capture_output=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("could not compile the sandbox's runner with %s: %s", python, exc)
        return None
    return done.stdout


#: Stack of every build and run (C++ recursion; thread stacks default to it, keep it sane).
STACK_BYTES = 64 << 20
#: Inodes of the item's work directory per MB of it (bwrap cannot cap them; the runner's
#: tmpfs does: a program creating empty files would otherwise fill kernel memory).
INODES_PER_MB = 64
_MB = 1 << 20


class Session:
    """One item's sandbox: ``async with sandbox.session(...) as item`` builds the program
    (``item.compile_result``), then ``await item.run(stdin)`` once per test, concurrently if
    wanted (bounded by the sandbox's workers). Leaving the block kills everything left and
    frees the sandbox's memory. A sandbox that cannot start gives a ``sandbox_error``
    compile result, not an exception."""

    def __init__(
        self, sandbox: Sandbox, language_name: str, files: dict[str, str | bytes], limits: Limits
    ) -> None:
        self.sandbox = sandbox
        self.language: Language = language(language_name)
        self.files = _clean_files(self.language, files)
        self.limits = limits
        # The build's result once the session is entered (async with).
        self.compile_result = CompileResult(False, "sandbox_error", "", "not started", 0.0, None)
        self._root = SANDBOX_ROOT
        self._host_dir: str | None = None  # mode none: the item's folder on the host
        self._channel: Channel | None = None
        self._closed = False

    @property
    def pid(self) -> int | None:
        """Host pid of the item sandbox's outer process (bwrap; the runner in mode none)."""
        proc = self._channel.proc if self._channel is not None else None
        return proc.pid if proc is not None else None

    async def __aenter__(self) -> Session:
        began = time.monotonic()
        try:
            async with self.sandbox._slot():
                failure = await self._start()
                if failure is None:
                    self.compile_result = await self._build()
                else:
                    self.compile_result = build_error("sandbox_error", failure, began)
        except BaseException:
            await self._close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._close()

    async def _close(self) -> None:
        self._closed = True
        if self._channel is not None:
            await self._channel.close()
        if self._host_dir is not None:
            shutil.rmtree(self._host_dir, ignore_errors=True)

    # -- start ------------------------------------------------------------------------
    async def _start(self) -> str | None:
        """Start the sandbox and its runner; None when ready, else what went wrong."""
        sandbox = self.sandbox
        # Executables are served by the native runner (_serve.c): no interpreter to start
        # per item. Python programs need the warm Python runner.
        native = not self.language.warm
        self._channel = channel = Channel()
        if native and sandbox._launcher is None:
            return sandbox._no_launcher
        memfds: list[int] = []
        try:
            if sandbox.mode == "bwrap":
                argv = self._bwrap_argv(memfds, native)
            else:
                self._fill_host_folder(native)
                argv = []
            if native:
                argv += [f"{self._root}/{LAUNCHER_NAME}", "serve"]
            else:
                argv += self._python_runner(memfds)
            workdir_bytes = self.limits.workdir_mb * _MB
            inodes = max(1024, self.limits.workdir_mb * INODES_PER_MB)
            argv += [sandbox.mode, self._root, str(channel.runner_fd), str(workdir_bytes)]
            argv += [str(inodes), "--", *sorted(self.files)]
            user: dict[str, Any] = {}
            if sandbox.mode == "bwrap" and sandbox.uid not in (None, os.geteuid()):
                prefix, user = drop_privileges(sandbox.uid)
                argv = prefix + argv
            return await channel.start(argv, memfds, env=dict(SANDBOX_ENV), **user)
        finally:
            for fd in memfds:
                os.close(fd)

    def _python_runner(self, memfds: list[int]) -> list[str]:
        """The Python runner's command line up to its arguments (which are the native
        runner's); its bytecode in a memfd, appended to ``memfds``."""
        sandbox = self.sandbox
        code = sandbox._runner_code
        if code is None:
            return [sandbox.python, "-I", "-S", "-c", RUNNER_SOURCE]
        fd = os.memfd_create("sandbox-runner")
        memfds.append(fd)
        _write_all(fd, code)
        return [sandbox.python, "-I", "-S", "-c", _BOOT.format(fd=fd, size=len(code))]

    def _bwrap_argv(self, memfds: list[int], native: bool) -> list[str]:
        """bwrap's command line for this item: its files and (``native``) the native
        runner come in memfds (appended to ``memfds``, which the caller closes once bwrap
        started)."""
        sandbox = self.sandbox
        assert sandbox.bwrap is not None

        def memfd(name: str, content: bytes) -> int:
            fd = os.memfd_create(f"sandbox-{posixpath.basename(name)}")
            memfds.append(fd)
            _write_all(fd, content)
            os.lseek(fd, 0, os.SEEK_SET)
            return fd

        placed = [(memfd(rel, content), rel) for rel, content in self.files.items()]
        files_bytes = sum(len(c) for c in self.files.values())
        tools = []
        if native:
            assert sandbox._launcher is not None
            tools.append((memfd(LAUNCHER_NAME, sandbox._launcher), LAUNCHER_NAME))
            files_bytes += len(sandbox._launcher)
        return bwrap_argv(
            sandbox.bwrap,
            binds=sandbox._binds,
            root_bytes=self.limits.workdir_mb * _MB + files_bytes + 16 * _MB,
            files=placed,
            tools=tools,
        )

    def _fill_host_folder(self, native: bool) -> None:
        """Mode none: the item's folder on the host, with its files and (``native``) the
        native runner."""
        self._host_dir = self._root = tempfile.mkdtemp(prefix="sandbox-none-")
        for rel, content in self.files.items():
            path = Path(self._host_dir, "prog", rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
        if native:
            assert self.sandbox._launcher is not None
            tool = Path(self._host_dir, LAUNCHER_NAME)
            tool.write_bytes(self.sandbox._launcher)
            tool.chmod(0o555)

    # -- jobs -------------------------------------------------------------------------
    def _values(self, limits: Limits) -> dict[str, str]:
        return {
            "prog": f"{self._root}/prog",
            "source": self.language.source,
            "memory_mb": str(limits.memory_mb),
            "python": self.sandbox.python,
        }

    def _rlimits(self, limits: Limits, *, build: bool) -> dict[str, Any]:
        lang = self.language
        memory_mb = limits.memory_mb + lang.extra_memory_mb
        out: dict[str, Any] = {
            "timeout_s": limits.compile_timeout_s if build else limits.run_timeout_s,
            "cpu_s": limits.compile_timeout_s if build else limits.cpu_limit_s,
            "as_bytes": max(memory_mb, lang.compile_memory_mb if build else 0) * _MB,
            "fsize_bytes": max(limits.file_size_mb, 256 if build else 0) * _MB,
            "nofile": max(limits.open_files, 1024 if build else 0),
            "stack_bytes": STACK_BYTES,
        }
        # RLIMIT_NPROC: in mode none the programs share the server's user, whose own
        # processes and threads would count against it (and root's are not counted at all).
        if self.sandbox.mode == "bwrap":
            out["nproc"] = max(limits.processes, lang.compile_processes if build else 0)
        return out

    async def _build(self) -> CompileResult:
        """Check or compile the program once, then make its folder read-only."""
        assert self._channel is not None
        lang, limits = self.language, self.limits
        values = self._values(limits)
        began = time.monotonic()
        msg: dict[str, Any] = {"cwd": "prog", "seal": True, "env": dict(lang.env)}
        if lang.warm:
            msg.update(kind="pycheck", argv=[f"{values['prog']}/{lang.source}"])
        elif lang.compile is not None:
            msg.update(kind="exec", argv=_fill(lang.compile, values))
        else:  # nothing to build: seal the folder
            try:
                report = await self._channel.control({"op": "seal"})
            except RunnerGone as exc:
                return build_error("sandbox_error", str(exc), began)
            if report.get("error"):
                return build_error("sandbox_error", str(report["error"]), began)
            return CompileResult(True, "ok", "", "", 0.0, None)
        msg["limits"] = self._rlimits(limits, build=True)
        try:
            outcome = await self._channel.job(
                msg, limits.compile_timeout_s, b"", limits.output_bytes, False
            )
        except RunnerGone as exc:
            return build_error("sandbox_error", str(exc), began)
        return build_result(outcome, limits.compile_timeout_s, began)

    async def run(self, stdin: str | bytes, *, limits: Limits | None = None) -> RunResult:
        """Run the program once on ``stdin`` (``limits``: this run's, default the
        session's; the work directory's size is the session's)."""
        if self._channel is None:
            raise RuntimeError("use the session as `async with sandbox.session(...) as item`")
        if self._closed:
            raise RuntimeError("the session is closed")
        if not self.compile_result.ok:
            return run_error(f"the program was not built ({self.compile_result.status})")
        if self._channel.broken is not None:
            return run_error(self._channel.broken)
        lim = limits or self.limits
        lang = self.language
        values = self._values(lim)
        msg: dict[str, Any] = {
            "cwd": "test",
            "limits": self._rlimits(lim, build=False),
            "env": dict(lang.env),
        }
        if lang.warm:
            msg.update(kind="python", argv=[f"{values['prog']}/{lang.source}"])
        else:
            msg.update(kind="exec", argv=_fill(lang.run, values))
        data = stdin.encode("utf-8") if isinstance(stdin, str) else bytes(stdin)
        async with self.sandbox._slot():
            try:
                outcome = await self._channel.job(
                    msg, lim.run_timeout_s, data, lim.output_bytes, True
                )
            except RunnerGone as exc:
                return run_error(str(exc))
        return run_result(outcome, lim, lang)


def _clean_files(lang: Language, files: dict[str, str | bytes]) -> dict[str, bytes]:
    """Validated relative paths -> bytes; the main source must be there."""
    out: dict[str, bytes] = {}
    for name, content in files.items():
        rel = posixpath.normpath(name) if isinstance(name, str) else ""
        if not rel or rel.startswith(("/", "../")) or rel in (".", "..") or "\0" in rel:
            raise ValueError(f"file name {name!r} is not a relative path inside the work dir")
        out[rel] = content.encode("utf-8") if isinstance(content, str) else bytes(content)
    if lang.source not in out:
        raise ValueError(f"{lang.name} programs need their main source in {lang.source!r}")
    return out


def _fill(template: tuple[str, ...], values: dict[str, str]) -> list[str]:
    return [part.format(**values) for part in template]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
