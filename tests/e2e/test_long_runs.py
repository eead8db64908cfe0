"""Long runs: a trainer that has to stop (SIGTERM, the reward server never comes back)
checkpoints its last completed update first, and a resumed run logs every step once.

One chain of real processes shows both: stopped by SIGTERM, resumed, stopped by a server
that never comes back, resumed again to the end. (In process, the crash and resume maths
are tests/e2e/test_trainer.py's test_resume_continues_from_the_checkpoint.)
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

from helpers.training import PPO_CLIENT, dataset, ppo_client_env, read_jsonl, steps_of
from server_proc import free_port, start_server, wait_until

from ppo_client.checkpoint import STATE_FILE, list_checkpoints

N_STEPS = 30
BUDGET_S = 5


def write_config(tmp_path: Path, policy: Path, url: str) -> Path:
    """Default settings apart from the sizes of a quick run and a 5 s retry budget."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in dataset()))
    config = tmp_path / "ppo.yaml"
    config.write_text(
        f"model_name_or_path: {policy}\n"
        f"reward_url: {url}\n"
        f"dataset_name: {data}\n"
        f"output_dir: {tmp_path / 'out'}\n"
        "per_device_train_batch_size: 4\n"
        "gradient_accumulation_steps: 1\n"
        "local_rollout_forward_batch_size: 4\n"
        f"total_episodes: {4 * N_STEPS}\n"
        "response_length: 8\n"
        "num_ppo_epochs: 1\n"
        f"reward_retry_timeout: {BUDGET_S}\n"
        "disable_tqdm: true\n"
    )
    return config


def train(config: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(PPO_CLIENT), "train", "--config", str(config), *extra],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=ppo_client_env(),
        )


def stopped(run: subprocess.Popen[bytes], log: Path, metrics: Path, code: int) -> list[int]:
    """Wait for ``run`` to exit with ``code``; the steps logged so far, with the checks that
    hold for every stop: each step once, the last one checkpointed, the user told so."""
    assert run.wait(timeout=300) == code, log.read_text()[-5000:]
    done = steps_of(metrics)
    assert done == list(range(1, len(done) + 1)) and len(done) < N_STEPS
    # The newest checkpoint is of the last completed (logged) update; none was due by
    # save_steps.
    newest = list_checkpoints(metrics.parent)[-1]
    assert newest.name == f"checkpoint-{done[-1]}", log.read_text()[-3000:]
    assert json.loads((newest / STATE_FILE).read_text())["step"] == done[-1]
    text = log.read_text()
    assert f"stopped at step {done[-1]}" in text
    assert "resume with --resume_from_checkpoint latest" in text
    return done


def test_stops_checkpoint_the_last_update_and_resumed_runs_log_each_step_once(
    gpt2_policy: Path, bert_rm: Path, tmp_path: Path
) -> None:
    port = free_port()
    servers = [start_server(bert_rm, port=port)]
    metrics = tmp_path / "out" / "metrics.jsonl"
    logs = [tmp_path / f"trainer-{i}.log" for i in range(3)]
    run: subprocess.Popen[bytes] | None = None

    def after_step(step: int) -> bool:
        assert run is not None and run.poll() is None, run and logs[-1].read_text()[-5000:]
        return len(steps_of(metrics)) >= step

    try:
        servers[0].wait_ready(90)
        config = write_config(tmp_path, gpt2_policy, servers[0].url)
        # SIGTERM: the run stops at once (or at the end of the update under way).
        run = train(config, logs[0])
        wait_until(lambda: after_step(3), 180, "the first steps")
        run.send_signal(signal.SIGTERM)
        first = stopped(run, logs[0], metrics, 128 + signal.SIGTERM)
        # Resumed; then the server goes for good: the client waits out its 5 s budget.
        run = train(config, logs[1], "--resume_from_checkpoint", "latest")
        wait_until(lambda: after_step(first[-1] + 2), 180, "steps of the resumed run")
        servers[0].stop(signal.SIGKILL)
        second = stopped(run, logs[1], metrics, 1)
        assert f"of the {BUDGET_S} s retry budget" in logs[1].read_text()  # waited, saying so
        assert f"retry_timeout {BUDGET_S} s" in logs[1].read_text()  # and gave up on it
        assert len(second) > len(first)
        # The server back on the same port: the run resumes to the end.
        servers.append(start_server(bert_rm, port=port))
        servers[-1].wait_ready(90)
        run = train(config, logs[2], "--resume_from_checkpoint", "latest")
        assert run.wait(timeout=300) == 0, logs[2].read_text()[-5000:]
    finally:
        if run is not None and run.poll() is None:
            run.kill()
            run.wait()
        for server in servers:
            server.stop()
    rows = read_jsonl(metrics)
    assert [r["step"] for r in rows] == list(range(1, N_STEPS + 1))  # each step once
    assert f"done: {N_STEPS} steps" in logs[2].read_text()
    assert {c.name for c in list_checkpoints(metrics.parent)} >= {
        f"checkpoint-{first[-1]}",
        f"checkpoint-{second[-1]}",
    }
