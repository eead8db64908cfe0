"""Running untrusted programs (the policy's code) under bubblewrap: standard library only.

::

    sandbox = Sandbox()                      # raises SandboxUnavailable, one line why
    async with sandbox.session("python", {"main.py": code}, Limits()) as item:
        if item.compile_result.ok:
            results = await asyncio.gather(*(item.run(t) for t in inputs))

The pieces::

    Sandbox ---- one per server: the bwrap binary, the sandbox user, `workers` slots
      └ Session ---- one per item: one bwrap sandbox, a runner inside (PID 1): a warm
          │          Python interpreter for Python, the native runner for executables
          ├ compile_result     built once (Python: a syntax check)
          └ run(stdin) ------- one test: a fork of the runner -> RunResult

What one item's sandbox guarantees (``mode="bwrap"``), each with a hostile test in
``tests/integration/test_sandbox_hostile.py``:

- new user, PID, network, IPC, UTS, mount and cgroup namespaces; started as an
  unprivileged uid when the server is root (the kernel does not count root's processes);
- the host's toolchains read-only (``/usr`` and the few ``/etc`` entries they read);
  nothing else of the host: no ``/root``, ``/home``, ``/tmp``, ``/work``, no model folder,
  keys file or TLS key; an empty environment (``PATH``, ``HOME``, ``LANG``, ``TMPDIR``);
  ``/proc`` of its own PID namespace (``/proc/1`` is the runner, not the server);
- one writable place, a fresh tmpfs of ``workdir_mb`` with an inode cap (``/tmp`` points
  into it); the program's files read-only once built;
- per run: rlimits on CPU time, address space, processes (counted per run), file size,
  open files, stack and core files, ``no_new_privs``, no new namespaces; a wall-clock
  deadline after which the run's process group and any process that escaped it are
  killed; stdout and stderr drained while it runs and capped (``output_bytes`` each);
- nothing survives: a run's leftovers are killed when it ends, the whole PID namespace when
  the session ends, and the sandbox when the server dies (``--die-with-parent``).

What it does not: it shares the host's kernel, so a kernel exploit escapes it (a VM or gVisor
is the answer to that); runs of one item share its sandbox (a program can leave files for
its own later runs, or signal its own concurrent runs); memory is limited per process, not
per item (a program with ``processes`` processes may use that many times ``memory_mb``;
its processes are the out-of-memory killer's first choice); no seccomp filter.
``mode="none"`` isolates nothing: the same runner and rlimits (no process limit) as a plain
subprocess of the server, in a host temporary folder.
"""

from reward_server.sandbox._host import SANDBOX_ENV, SANDBOX_UID, find_bwrap
from reward_server.sandbox._languages import LANGUAGES, SANDBOX_PATH, Language, language
from reward_server.sandbox._sandbox import Sandbox
from reward_server.sandbox._session import Session
from reward_server.sandbox._types import (
    CompileResult,
    CompileStatus,
    Limits,
    RunResult,
    RunStatus,
    SandboxUnavailable,
)

__all__ = [
    "LANGUAGES",
    "SANDBOX_ENV",
    "SANDBOX_PATH",
    "SANDBOX_UID",
    "CompileResult",
    "CompileStatus",
    "Language",
    "Limits",
    "RunResult",
    "RunStatus",
    "Sandbox",
    "SandboxUnavailable",
    "Session",
    "find_bwrap",
    "language",
]
