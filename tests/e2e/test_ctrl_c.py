"""Ctrl-C and SIGTERM end every wait on the reward server promptly, at any moment.

The trainer is started against a reward server that is already gone (a loopback port with
nothing behind it: every request is refused, and the client would retry for the whole
600 s budget) and signalled at each of its start-up log lines and after random delays. It
must exit within 10 s each time, with the message and exit code of a stopped run, and
leave no process behind. The pieces that make that true are tested in process: a signal
during start-up is remembered past code that swallows it, closing a client wakes its
retries on other threads, and a signal during ``Popen`` cannot lose the child.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from helpers.training import PPO_CLIENT
from server_proc import free_port

from ppo_client import stopping
from reward_client import RetryEvent, RetryPolicy, RewardClient, RewardClientError
from reward_server.launcher import deferred_signals, held_for_children

EXIT_WITHIN_S = 10
#: Start-up lines to signal at: everything the trainer logs before its first reward request,
#: and its first retry of that request.
START_UP_LINES = (
    "ppo_client.models: value model loaded",
    "ppo_client.trainer: PPO:",
    "failed (attempt 1,",
)
RANDOM_RUNS = 5


@pytest.fixture(scope="module")
def gone_server_config(
    gpt2_policy: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    """A run whose reward server is gone, with the default 600 s retry budget."""
    folder = tmp_path_factory.mktemp("ctrl_c")
    data = folder / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"prompt {i}"}) + "\n" for i in range(8)))
    config = folder / "ppo.yaml"
    config.write_text(
        f"model_name_or_path: {gpt2_policy}\n"
        f"reward_url: http://127.0.0.1:{free_port()}\n"
        f"dataset_name: {data}\n"
        f"output_dir: {folder / 'out'}\n"
        "per_device_train_batch_size: 4\n"
        "gradient_accumulation_steps: 1\n"
        "local_rollout_forward_batch_size: 4\n"
        "total_episodes: 8\n"
        "response_length: 4\n"
        "num_ppo_epochs: 1\n"
        "disable_tqdm: true\n"
    )
    yield config


@dataclass
class Run:
    """One trainer process, its output lines, and what became of it after the signal."""

    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    @classmethod
    def start(cls, config: Path, out_dir: Path) -> Run:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(
            [str(PPO_CLIENT), "train", "--config", str(config), "--output_dir", str(out_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        run = cls(proc)
        run.reader = threading.Thread(target=run._read, daemon=True)
        run.reader.start()
        return run

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for_line(self, text: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            assert self.proc.poll() is None, f"exited before {text!r}:\n" + self.tail()
            assert time.monotonic() < deadline, f"no {text!r} in {timeout} s:\n" + self.tail()
            time.sleep(0.01)

    def signal_and_wait(self, sig: int) -> tuple[int | None, list[psutil.Process]]:
        """Send ``sig``; the exit code within EXIT_WITHIN_S (None if still running) and the
        processes it had started that are still alive then."""
        children = psutil.Process(self.proc.pid).children(recursive=True)
        self.proc.send_signal(sig)
        try:
            code: int | None = self.proc.wait(timeout=EXIT_WITHIN_S)
        except subprocess.TimeoutExpired:
            code = None
        _, alive = psutil.wait_procs(children, timeout=5)
        if code is None:
            self.proc.kill()
            self.proc.wait()
        assert self.reader is not None
        self.reader.join(timeout=10)
        return code, alive

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.lines[-n:])


def _stop_at(config: Path, out_dir: Path, sig: int, line: str | None, delay: float) -> str:
    """Start a trainer, send it ``sig`` at ``line`` (or after ``delay`` s); '' if it stopped
    as it should, else what went wrong."""
    run = Run.start(config, out_dir)
    try:
        if line is not None:
            run.wait_for_line(line)
        else:
            time.sleep(delay)
        code, alive = run.signal_and_wait(sig)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
    name = signal.Signals(sig).name
    where = f"{name} at {line!r}" if line is not None else f"{name} after {delay:.2f} s"
    if code is None:
        return f"{where}: still running {EXIT_WITHIN_S} s later:\n{run.tail()}"
    if alive:
        return f"{where}: left {[p.pid for p in alive]} running"
    stopped = [ln for ln in run.lines if ln.startswith("ppo-client train: stopped")]
    if code == -sig and not stopped:
        return ""  # the signal came while Python itself was starting: it ended the process
    if code != 128 + sig or len(stopped) != 1 or f"stopped by {name}" not in stopped[0]:
        return f"{where}: exit code {code}, message {stopped}:\n{run.tail()}"
    return ""


def test_a_signal_at_any_point_of_the_start_up_ends_the_trainer(
    gone_server_config: Path, tmp_path: Path
) -> None:
    """Acceptance: at each start-up log line and after random delays, with the server gone,
    the trainer exits within 10 s (130 for SIGINT, 143 for SIGTERM, one line saying so) and
    leaves nothing running."""
    # The first run also times the start-up, which sets the range of the random delays.
    first = Run.start(gone_server_config, tmp_path / "first")
    started = time.monotonic()
    first.wait_for_line(START_UP_LINES[-1])
    start_up_s = time.monotonic() - started
    code, alive = first.signal_and_wait(signal.SIGINT)
    assert code == 130 and not alive, first.tail()
    rng = random.Random(0)
    jobs: list[tuple[int, str | None, float]] = [
        (signal.SIGINT, line, 0.0) for line in START_UP_LINES[:-1]
    ]
    jobs.append((signal.SIGTERM, "failed (attempt 2,", 0.0))
    jobs += [(signal.SIGINT, None, rng.uniform(0.0, start_up_s)) for _ in range(RANDOM_RUNS)]
    # Two at a time: each trainer runs on one thread, and this machine has two cores.
    with ThreadPoolExecutor(2) as pool:
        outcomes = pool.map(
            lambda job: _stop_at(gone_server_config, tmp_path / f"run{job[0]}", *job[1]),
            enumerate(jobs),
        )
        problems = [outcome for outcome in outcomes if outcome]
    assert not problems, "\n\n".join(problems)


def test_a_swallowed_start_up_signal_still_stops_the_run() -> None:
    """A TrainingStopped raised during start-up and swallowed by some library's code is
    remembered: the run's StopSignals refuses to start the rollout."""
    with stopping.stop_at_once():
        # What a careless `except BaseException: pass` somewhere in start-up would do:
        with contextlib.suppress(stopping.TrainingStopped):
            signal.raise_signal(signal.SIGTERM)
        stop = stopping.StopSignals()
        with stop, pytest.raises(stopping.TrainingStopped) as info, stop.interruptible():
            pytest.fail("the rollout began after a signal")
        assert info.value.exit_code == 128 + signal.SIGTERM
    # The run is over: nothing is remembered for the next run of this process.
    with stopping.stop_at_once(), stopping.StopSignals() as stop:
        assert stop.requested is None


def test_an_in_process_train_command_gives_the_signal_handlers_back(tmp_path: Path) -> None:
    """``main(["train", ...])`` called from a program (a notebook, a test) leaves SIGINT and
    SIGTERM as it found them: later Ctrl-Cs and runs behave as before."""
    from ppo_client.cli import main

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    config = tmp_path / "ppo.yaml"
    config.write_text("no_such_key: 1\n")
    assert main(["train", "--config", str(config)]) == 2
    assert {sig: signal.getsignal(sig) for sig in before} == before


def test_a_signal_wrapped_by_an_import_is_still_a_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A SIGINT during ``import torch`` once came back as ``RuntimeError: Error calling
    __set_name__ ...`` with the stop as its cause (Python wraps errors raised in a class body's
    __set_name__): the train command still reports a stop with the signal's exit code, not a
    traceback and exit 1. Anything else still raises."""
    import ppo_client.trainer
    from ppo_client.cli import main

    def start_up_wrapping(signum: int) -> type:
        class Wrapping:
            def __init__(self, _config: object) -> None:
                try:
                    raise stopping.TrainingStopped(signum)
                except stopping.TrainingStopped as exc:
                    raise RuntimeError("Error calling __set_name__ on 'Field'") from exc

        return Wrapping

    config = tmp_path / "ppo.yaml"
    config.write_text(f"output_dir: {tmp_path / 'out'}\n")
    for signum in (signal.SIGINT, signal.SIGTERM):
        monkeypatch.setattr(ppo_client.trainer, "PPOTrainer", start_up_wrapping(signum))
        assert main(["train", "--config", str(config)]) == 128 + signum
        assert "stopped before the first update" in capsys.readouterr().err

    def crashing(_config: object) -> None:
        raise RuntimeError("a real bug")

    monkeypatch.setattr(ppo_client.trainer, "PPOTrainer", crashing)
    with pytest.raises(RuntimeError, match="a real bug"):
        main(["train", "--config", str(config)])
    wrapped = RuntimeError("outer")
    wrapped.__context__ = KeyboardInterrupt()
    assert isinstance(stopping.stop_in_chain(wrapped), KeyboardInterrupt)
    assert stopping.stop_in_chain(RuntimeError("alone")) is None


def test_training_stopped_passes_through_except_exception() -> None:
    """It is raised wherever a signal lands: retry loops' ``except Exception`` let it pass."""
    assert not issubclass(stopping.TrainingStopped, Exception)


def test_closing_the_client_ends_a_retry_waiting_on_another_thread() -> None:
    """A trainer stopped mid-reward closes its client: a call retrying a gone server on a
    worker thread (the overlapped reward) must end at once, not after its 600 s budget."""
    retries = threading.Event()

    def on_retry(event: RetryEvent) -> None:
        if event.next_delay_s > 1:  # about to pause: close() must cut that pause short
            retries.set()

    # Long pauses (up to 60 s): without close() waking it, the thread would sleep on.
    policy = RetryPolicy(timeout=600, backoff_base=30, backoff_max=60)
    client = RewardClient(f"http://127.0.0.1:{free_port()}", retry=policy, on_retry=on_retry)
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            client(["prompt"], ["response"])
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(target=call)
    worker.start()
    assert retries.wait(timeout=60), "the client never retried"
    client.close()
    worker.join(timeout=10)
    assert not worker.is_alive(), "the retry outlived close()"
    assert len(outcome) == 1 and isinstance(outcome[0], RewardClientError), outcome
    assert "closed" in str(outcome[0])


def test_deferred_signals_hand_the_signal_over_after_the_block() -> None:
    """A Ctrl-C inside the block does not cut it short; it is raised once the block (the
    assignment of the started child) is done, and the caller's finally can stop the child."""
    child: subprocess.Popen[bytes] | None = None
    reached_end = False
    # Python's own Ctrl-C handler, whatever the test runner installed (pytest-xdist's workers
    # ignore SIGINT).
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    with contextlib.ExitStack() as restore, pytest.raises(KeyboardInterrupt):
        restore.callback(signal.signal, signal.SIGINT, previous)
        try:
            with deferred_signals():
                signal.raise_signal(signal.SIGINT)
                child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                reached_end = True
        finally:
            if child is not None:
                child.kill()
                child.wait()
    assert reached_end and child is not None and child.returncode == -signal.SIGKILL


def test_a_signal_held_back_by_the_launcher_stops_the_trainer_once_it_can(
    gone_server_config: Path, tmp_path: Path
) -> None:
    """Started with SIGINT blocked (as the demo starts it), the trainer gets a signal sent at
    once only when its handlers are in place, and stops as a stopped run: the signal can
    neither kill it half-started nor be swallowed while its interpreter starts. Without
    the unblocking it would retry the gone server for 600 s."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    argv = [str(PPO_CLIENT), "train", "--config", str(gone_server_config)]
    with held_for_children():
        proc = subprocess.Popen(
            [*argv, "--output_dir", str(tmp_path / "out")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        proc.send_signal(signal.SIGINT)  # the signal is pending in the child from its exec
    # This process's own mask is back as it was.
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stopped = [ln for ln in out.splitlines() if ln.startswith("ppo-client train: stopped")]
    assert proc.returncode == 130, out[-3000:]
    assert len(stopped) == 1 and "before the first update: stopped by SIGINT" in stopped[0], out
