"""The tests' warm launcher (``tests/warm_launcher.py``; ``server_proc.start_server(...,
warm=True)``): servers forked from one process that has imported torch and transformers
behave as the console script's do, to the caller (its handle, signals, return codes, output)
and to clients (scores, settings)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import psutil
import pytest
import warm_launcher
from server_proc import running_server, start_server
from warm_launcher import WarmProcess

TEXTS = ["a kind answer", "a rude answer"]
#: The file the launcher's process runs.
WARM_LAUNCHER = Path(warm_launcher.__file__).resolve()


def scores(url: str, **headers: str) -> httpx.Response:
    return httpx.post(f"{url}/score", json={"texts": TEXTS}, headers=headers, timeout=60)


def test_a_warm_server_scores_as_the_console_scripts_does(bert_rm: Path) -> None:
    with running_server(bert_rm, warm=False) as cold:
        assert isinstance(cold.proc, subprocess.Popen)
        expected = scores(cold.url).json()["scores"]
    with running_server(bert_rm, warm=True) as warm:
        assert isinstance(warm.proc, WarmProcess)
        assert scores(warm.url).json()["scores"] == expected
        assert "Application startup complete" in warm.log()  # its output went to its log
    assert warm.proc.returncode == 0  # SIGTERM: drained and exited cleanly


def test_warm_servers_come_from_one_launcher_not_the_caller(bert_rm: Path) -> None:
    with running_server(bert_rm, warm=True) as one, running_server(bert_rm, warm=True) as two:
        parents = {psutil.Process(s.proc.pid).ppid() for s in (one, two)}
        assert len(parents) == 1 and os.getpid() not in parents
        launcher = psutil.Process(parents.pop())
        assert str(WARM_LAUNCHER) in launcher.cmdline()
        # named as the console script in ps, top and pkill; the launcher is not
        assert {psutil.Process(s.proc.pid).name() for s in (one, two)} == {"reward-server"}
        assert launcher.name() != "reward-server"


def test_return_codes_are_the_console_scripts(bert_rm: Path) -> None:
    killed = start_server(bert_rm, warm=True)
    killed.wait_ready(60)
    assert killed.stop(signal.SIGKILL) == -signal.SIGKILL
    interrupted = start_server(bert_rm, warm=True)  # Ctrl-C: a clean stop, as a cold one
    interrupted.wait_ready(60)
    assert interrupted.stop(signal.SIGINT) == 0
    usage = start_server(bert_rm, "--no-such-flag", warm=True)
    assert usage.proc.wait(timeout=60) == 2  # argparse's code for a usage error
    assert "unrecognized arguments: --no-such-flag" in usage.log()
    with pytest.raises(subprocess.TimeoutExpired):  # as Popen.wait, for a server still up
        (running := start_server(bert_rm, warm=True)).proc.wait(timeout=0.01)
    running.stop()


def test_server_settings_in_the_environment_apply(bert_rm: Path) -> None:
    with running_server(bert_rm, env={"REWARD_SERVER_API_KEY": "sesame"}, warm=True) as server:
        assert isinstance(server.proc, WarmProcess)
        assert scores(server.url).status_code == 401
        assert scores(server.url, Authorization="Bearer sesame").status_code == 200


def test_another_environment_starts_cold(bert_rm: Path) -> None:
    """The launcher's libraries read some variables at import: a server that needs others
    than the launcher had runs the console script instead, and still serves."""
    threads = str(os.cpu_count() or 1)
    with running_server(bert_rm, env={"OMP_NUM_THREADS": threads + "0"}, warm=True) as server:
        assert isinstance(server.proc, subprocess.Popen)
        assert scores(server.url).status_code == 200


def test_the_launcher_ends_with_its_caller(bert_rm: Path, tmp_path: Path) -> None:
    """A process that used warm starts leaves no launcher behind when it exits."""
    script = textwrap.dedent(f"""
        import psutil
        import sys
        sys.path.insert(0, {str(WARM_LAUNCHER.parent)!r})
        from server_proc import running_server
        with running_server({str(bert_rm)!r}, warm=True) as server:
            print(psutil.Process(server.proc.pid).ppid(), flush=True)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=180, check=True
    )
    launcher = int(done.stdout.split()[-1])
    with contextlib.suppress(psutil.NoSuchProcess):  # gone already
        psutil.Process(launcher).wait(timeout=30)  # psutil.TimeoutExpired if it lives on


def test_a_killed_launcher_loses_no_server(bert_rm: Path) -> None:
    """Its servers run on and still stop; the next warm start gets a new launcher."""
    with running_server(bert_rm, warm=True) as orphan:
        launcher = psutil.Process(psutil.Process(orphan.proc.pid).ppid())
        launcher.kill()
        launcher.wait(timeout=30)
        assert scores(orphan.url).status_code == 200  # the server serves on
        with running_server(bert_rm, warm=True) as after:
            assert isinstance(after.proc, WarmProcess)
            assert psutil.Process(after.proc.pid).ppid() != launcher.pid
    assert orphan.proc.returncode == WarmProcess.LOST_RETURNCODE  # stopped, code unknown
    assert ended(orphan.proc.pid)


def ended(pid: int) -> bool:
    """Gone, or a zombie that its new parent has not reaped yet."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
