"""reward_server.sandbox: programs in each language, right, wrong, slow, crashing and not
compiling; the API's contracts; the probe; mode ``none``. Hostile programs are in
test_sandbox_hostile.py."""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import tempfile
import textwrap
from pathlib import Path

import psutil
import pytest

from reward_server.sandbox import (
    LANGUAGES,
    SANDBOX_PATH,
    CompileResult,
    Limits,
    RunResult,
    Sandbox,
    SandboxUnavailable,
    language,
)

# Generous wall-clock limits: a loaded machine must not turn a right answer into a timeout.
LIMITS = Limits(run_timeout_s=30.0, compile_timeout_s=120.0, memory_mb=512)
# The limits of a run meant to time out.
SHORT = Limits(run_timeout_s=1.5, memory_mb=512)

# Each program reads "a b" and prints a + b; it prints a - b when a == 13 (a wrong answer),
# crashes on "crash" and loops on "loop".
PROGRAMS: dict[str, dict[str, str]] = {
    "python": {
        "main.py": """
            line = input()
            if line == "crash":
                raise ValueError("boom")
            while line == "loop":
                pass
            a, b = map(int, line.split())
            print(a - b if a == 13 else a + b)
        """,
    },
    "c": {
        "main.c": """
            #include <stdio.h>
            #include <string.h>
            int main(void) {
                char line[64];
                if (!fgets(line, sizeof line, stdin)) return 2;
                if (strncmp(line, "crash", 5) == 0) { int *p = 0; *p = 1; }
                if (strncmp(line, "loop", 4) == 0) for (volatile int i = 0;; i++) {}
                long a, b;
                sscanf(line, "%ld %ld", &a, &b);
                printf("%ld\\n", a == 13 ? a - b : a + b);
                return 0;
            }
        """,
    },
    "cpp": {
        "main.cpp": """
            #include <cstdlib>
            #include <iostream>
            #include <string>
            int main() {
                std::string line;
                std::getline(std::cin, line);
                if (line == "crash") std::abort();
                if (line == "loop") for (volatile long i = 0;; i++) {}
                long a = std::stol(line), b = std::stol(line.substr(line.find(' ')));
                std::cout << (a == 13 ? a - b : a + b) << std::endl;
            }
        """,
    },
    "java": {
        "Main.java": """
            import java.util.Scanner;
            public class Main {
                public static void main(String[] args) {
                    String line = new Scanner(System.in).nextLine();
                    if (line.equals("crash")) throw new IllegalStateException("boom");
                    if (line.equals("loop")) while (true) {}
                    String[] p = line.split(" ");
                    long a = Long.parseLong(p[0]), b = Long.parseLong(p[1]);
                    System.out.println(a == 13 ? a - b : a + b);
                }
            }
        """,
    },
    "javascript": {
        "main.js": """
            const line = require("fs").readFileSync(0, "utf8").trim();
            if (line === "crash") throw new Error("boom");
            while (line === "loop") {}
            const [a, b] = line.split(" ").map(Number);
            console.log(a === 13 ? a - b : a + b);
        """,
    },
    "bash": {
        "main.sh": """
            read -r line
            [ "$line" = crash ] && exit 3
            while [ "$line" = loop ]; do :; done
            read -r a b <<< "$line"
            if [ "$a" = 13 ]; then echo $((a - b)); else echo $((a + b)); fi
        """,
    },
}
# A program that does not build (for javascript and python: does not parse).
BROKEN: dict[str, tuple[str, str]] = {
    "python": ("main.py", "def f(:\n    pass\n"),
    "c": ("main.c", "int main(void) { return undefined_name; }\n"),
    "cpp": ("main.cpp", "int main() { std::vector<int> v; }\n"),
    "java": ("Main.java", "public class Main { void f() { int x = ; } }\n"),
    "javascript": ("main.js", "function f( {\n"),
    "bash": ("main.sh", "if then fi\n"),
}
# What a crash looks like: (exit code, signal).
CRASH = {
    "python": (1, None),
    "c": (None, 11),
    "cpp": (None, 6),
    "java": (1, None),
    "javascript": (1, None),
    "bash": (3, None),
}


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox(workers=2)


def _dedent(files: dict[str, str]) -> dict[str, str]:
    return {name: textwrap.dedent(text).lstrip("\n") for name, text in files.items()}


def _run_item(
    sandbox: Sandbox,
    language_name: str,
    files: dict[str, str | bytes],
    inputs: list[str | bytes],
    limits: Limits = LIMITS,
    short: tuple[str | bytes, ...] = (),
) -> tuple[CompileResult, list[RunResult]]:
    """Build once, run each input (those in ``short`` under :data:`SHORT`), at once."""

    async def go() -> tuple[CompileResult, list[RunResult]]:
        async with sandbox.session(language_name, files, limits) as item:
            if not item.compile_result.ok:
                return item.compile_result, []
            runs = [item.run(text, limits=SHORT if text in short else None) for text in inputs]
            return item.compile_result, list(await asyncio.gather(*runs))

    return asyncio.run(go())


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_each_language_right_wrong_slow_crashing_and_broken(sandbox: Sandbox, name: str) -> None:
    assert sandbox.why_unavailable(name) is None
    cases = [(1, 2), (40, 2), (13, 3), (-5, 5)]
    inputs = [f"{a} {b}\n" for a, b in cases]
    built, results = _run_item(
        sandbox, name, _dedent(PROGRAMS[name]), [*inputs, "crash\n", "loop\n"], short=("loop\n",)
    )
    assert built.ok and built.status == "ok", built
    *answers, crash, loop = results
    expected = [a - b if a == 13 else a + b for a, b in cases]
    assert [r.status for r in answers] == ["ok"] * len(cases), answers
    assert [int(r.stdout) for r in answers] == expected  # 13 3 -> 10: the wrong answer
    assert all(r.exit_code == 0 and r.signal is None for r in answers)
    assert crash.status == "runtime_error", crash
    assert (crash.exit_code, crash.signal) == CRASH[name], crash
    assert loop.status == "timeout", loop

    source, text = BROKEN[name]
    built, results = _run_item(sandbox, name, {source: text}, ["1 2\n"], LIMITS)
    if LANGUAGES[name].compile is None and not LANGUAGES[name].warm:  # nothing to build
        assert built.ok and results[0].status == "runtime_error"
        assert "SyntaxError" in results[0].stderr
    else:
        assert (built.ok, built.status) == (False, "compile_error"), built
        assert built.stderr.strip() and results == []


def test_python_runs_like_python(sandbox: Sandbox) -> None:
    """The warm path behaves as ``python3 main.py``: __main__, __file__, argv, exit codes,
    exit(), atexit, threads, helper modules, data files, UTF-8."""
    files = _dedent(
        {
            "main.py": """
                import atexit, sys, threading
                import helper
                mode = input()
                print(__name__, __file__.endswith("main.py"), sys.argv[0].endswith("main.py"))
                print(helper.double(21), open("data/table.txt").read().strip())
                atexit.register(lambda: print("atexit ran"))
                threading.Thread(target=lambda: print("thread ran")).start()
                if mode == "exit3":
                    sys.exit(3)
                if mode == "exit":
                    exit()
                if mode == "message":
                    sys.exit("bad input")
                if mode == "utf8":
                    print(input()[::-1])
                if mode == "eof":
                    input()
            """,
            "helper.py": "def double(x):\n    return 2 * x\n",
            "data/table.txt": "row 1\n",
        }
    )
    built, (plain, three, bare_exit, message, utf8, eof) = _run_item(
        sandbox,
        "python",
        files,
        ["plain\n", "exit3\n", "exit\n", "message\n", "utf8\nçé€\n", "eof\n"],
    )
    assert built.ok
    assert plain.stdout == "__main__ True True\n42 row 1\nthread ran\natexit ran\n", plain
    assert (plain.status, plain.exit_code) == ("ok", 0)
    assert (three.status, three.exit_code) == ("runtime_error", 3)
    assert (bare_exit.status, bare_exit.exit_code) == ("ok", 0)
    assert (message.exit_code, message.stderr) == (1, "bad input\n")
    assert "\n€éç\n" in utf8.stdout
    assert eof.status == "runtime_error" and "EOFError" in eof.stderr
    assert 'File "<string>"' not in eof.stderr  # the runner's own frame is left out


def test_compiled_programs_with_helper_files(sandbox: Sandbox) -> None:
    files = _dedent(
        {
            "main.cpp": """
                #include <fstream>
                #include <iostream>
                #include "lib/add.h"
                int main() {
                    std::ifstream f("words.txt");
                    std::string w; f >> w;
                    std::cout << add(2, 3) << " " << w << std::endl;
                }
            """,
            "lib/add.h": "inline int add(int a, int b) { return a + b; }\n",
            "words.txt": "hello\n",
        }
    )
    built, (result,) = _run_item(sandbox, "c++", files, [""])
    assert built.ok, built
    assert (result.status, result.stdout) == ("ok", "5 hello\n")


def test_big_stdin_and_output_do_not_deadlock(sandbox: Sandbox) -> None:
    """4 MiB in and out at once: both pipes fill while the program runs."""
    data = ("0123456789abcdef" * 64 + "\n") * 4096  # 4 MiB
    code = "import sys\nfor line in sys.stdin:\n    sys.stdout.write(line)\n"
    limits = Limits(run_timeout_s=20.0, memory_mb=512, output_bytes=8 << 20)
    _, (result,) = _run_item(sandbox, "python", {"main.py": code}, [data], limits)
    assert result.status == "ok" and result.stdout == data and not result.stdout_truncated


def test_stderr_past_its_cap_is_truncated_not_fatal(sandbox: Sandbox) -> None:
    code = "import sys\nsys.stderr.write('e' * 300000)\nprint('done')\n"
    limits = Limits(run_timeout_s=10.0, memory_mb=512, output_bytes=100000)
    _, (result,) = _run_item(sandbox, "python", {"main.py": code}, [""], limits)
    assert (result.status, result.stdout) == ("ok", "done\n")
    assert result.stderr_truncated and len(result.stderr) == 100000


def test_per_run_limits_and_a_failed_build(sandbox: Sandbox) -> None:
    async def go() -> tuple[RunResult, RunResult, RunResult]:
        code = "import time\ntime.sleep(float(input()))\nprint('woke')\n"
        async with sandbox.session("python", {"main.py": code}, LIMITS) as item:
            fast = await item.run("0.01\n", limits=Limits(run_timeout_s=30.0, memory_mb=256))
            slow = await item.run("5\n", limits=Limits(run_timeout_s=0.5, memory_mb=256))
        async with sandbox.session("python", {"main.py": "def (:"}, LIMITS) as broken:
            assert not broken.compile_result.ok
            unbuilt = await broken.run("")
        return fast, slow, unbuilt

    fast, slow, unbuilt = asyncio.run(go())
    assert (fast.status, fast.stdout) == ("ok", "woke\n")
    assert slow.status == "timeout"
    assert unbuilt.status == "sandbox_error" and "not built" in unbuilt.message


def test_run_once(sandbox: Sandbox) -> None:
    async def go() -> tuple[tuple[CompileResult, RunResult | None], ...]:
        good = await sandbox.run_once("js", {"main.js": "console.log(6 * 7)"}, "", LIMITS)
        bad = await sandbox.run_once("c", {"main.c": "int main( {"}, "", LIMITS)
        return good, bad

    (built, ran), (broken, none) = asyncio.run(go())
    assert built.ok and ran is not None and ran.stdout == "42\n"
    assert broken.status == "compile_error" and none is None


def test_a_cancelled_run_leaves_nothing_and_the_item_goes_on(sandbox: Sandbox) -> None:
    async def go() -> tuple[list[str], RunResult]:
        code = "import time\nif input() == 'sleep':\n    time.sleep(8)\nprint('ok')\n"
        async with sandbox.session("python", {"main.py": code}, LIMITS) as item:
            assert item.pid is not None
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(item.run("sleep\n"), 0.5)
            left = await _settled(item.pid)
            return left, await item.run("go\n")

    left, after = asyncio.run(go())
    assert len(left) == 1, left  # the runner only
    assert (after.status, after.stdout) == ("ok", "ok\n")


async def _settled(pid: int) -> list[int]:
    """The processes under ``pid`` once the count stops falling (a second at most)."""
    found: list[int] = []
    for _ in range(50):
        found = [p.pid for p in psutil.Process(pid).children(recursive=True) if _alive(p)]
        if len(found) <= 1:
            break
        await asyncio.sleep(0.02)
    return found


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_session_needs_async_with(sandbox: Sandbox) -> None:
    item = sandbox.session("python", {"main.py": "print(1)"}, LIMITS)
    with pytest.raises(RuntimeError, match="async with"):
        asyncio.run(item.run(""))


@pytest.mark.parametrize(
    "files",
    [
        {"/etc/main.py": "x"},
        {"../main.py": "x"},
        {"main.py": "", "a/../../b": "x"},
        {"other.py": "x"},
    ],
)
def test_files_must_stay_in_the_work_dir(sandbox: Sandbox, files: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        sandbox.session("python", files, LIMITS)


def test_languages_by_name_and_alias() -> None:
    assert {"python", "cpp", "javascript", "c", "java", "rust", "bash"} <= set(LANGUAGES)
    for alias, name in [
        ("py", "python"),
        ("Python3", "python"),
        ("c++", "cpp"),
        ("js", "javascript"),
        ("node", "javascript"),
        ("rs", "rust"),
    ]:
        assert language(alias).name == name
    with pytest.raises(ValueError, match="supported: python"):
        language("cobol")


def test_rust_is_there_exactly_when_the_sandbox_reaches_rustc(sandbox: Sandbox) -> None:
    """rustup installs under /root, closed to the sandbox user: rust is available only with
    a rustc in the sandbox's PATH (a distribution's package)."""
    reason = sandbox.why_unavailable("rust")
    if shutil.which("rustc", path=SANDBOX_PATH) is None:
        assert reason is not None and "rustc" in reason
    else:
        assert reason is None
        built, (result,) = _run_item(
            sandbox, "rust", {"main.rs": 'fn main() { println!("{}", 6 * 7); }'}, [""]
        )
        assert built.ok and result.stdout == "42\n"


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="memory_mb"):
        Limits(memory_mb=0)
    with pytest.raises(ValueError, match="run_timeout_s"):
        Limits(run_timeout_s=-1)
    for bad in (math.nan, math.inf):  # a runner never gets a deadline that is not one
        with pytest.raises(ValueError, match="compile_timeout_s"):
            Limits(compile_timeout_s=bad)
        with pytest.raises(ValueError, match="cpu_s"):
            Limits(cpu_s=bad)
    assert Limits(run_timeout_s=3).cpu_limit_s == 3
    assert Limits(run_timeout_s=3, cpu_s=1.5).cpu_limit_s == 1.5


def test_probe_and_a_missing_bwrap(tmp_path: Path) -> None:
    assert Sandbox.probe() is None
    reason = Sandbox.probe("/nonexistent/bwrap")
    assert reason is not None and "/nonexistent/bwrap" in reason and "sandbox: none" in reason
    assert "\n" not in reason
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        Sandbox(mode="bwrap", bwrap="/nonexistent")
    # A bwrap that cannot make namespaces (here: one that only prints bwrap's error).
    folder = Path(tempfile.mkdtemp(prefix="fake-bwrap-", dir="/tmp"))
    try:
        folder.chmod(0o755)  # any user may run it
        fake = folder / "bwrap"
        fake.write_text(
            "#!/bin/sh\necho 'bwrap: No permissions to create a new namespace' >&2\nexit 1\n"
        )
        fake.chmod(0o755)
        reason = Sandbox.probe(str(fake))
        assert reason is not None and "No permissions to create a new namespace" in reason
        assert "user namespaces" in reason
        if os.geteuid() == 0:  # the sandbox user cannot reach a bwrap in a closed folder
            closed = tmp_path / "bwrap"
            shutil.copy(fake, closed)
            tmp_path.chmod(0o700)
            reason = Sandbox.probe(str(closed))
            assert reason is not None and "cannot be run by the sandbox user" in reason
    finally:
        shutil.rmtree(folder)


def test_workers_default_to_the_cores() -> None:
    assert Sandbox(mode="none").workers == os.cpu_count()
    with pytest.raises(ValueError):
        Sandbox(mode="none", workers=0)
    with pytest.raises(ValueError):
        Sandbox(mode="docker")  # type: ignore[arg-type]


def test_mode_none_runs_the_same_programs_with_rlimits() -> None:
    plain = Sandbox(mode="none", workers=2)
    files = _dedent(PROGRAMS["cpp"])
    limits = Limits(run_timeout_s=30.0, compile_timeout_s=120.0, memory_mb=256)
    built, (right, loop) = _run_item(
        plain, "cpp", files, ["2 3\n", "loop\n"], limits, short=("loop\n",)
    )
    assert built.ok and right.stdout == "5\n" and loop.status == "timeout"
    bomb = "x = bytearray(1 << 30)\n"
    _, (memory,) = _run_item(plain, "python", {"main.py": bomb}, [""], limits)
    assert memory.status == "memory_exceeded"
