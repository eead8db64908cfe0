"""Long runs: a trainer that has to stop (the reward server never comes back, SIGTERM)
checkpoints its last completed update first, and a resumed run logs every step once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from server_proc import ServerProcess, free_port, start_server
from test_reliability_faults import PPO_CLIENT, _env, steps_of, wait_for
from test_trainer import dataset, read_jsonl

from ppo_client.checkpoint import STATE_FILE, list_checkpoints

N_STEPS = 40
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
            env=_env(),
        )


@pytest.mark.parametrize("how", ["server_never_back", "sigterm"])
def test_stop_checkpoints_the_last_update_and_a_resumed_run_logs_each_step_once(
    how: str, gpt2_policy: Path, bert_rm: Path, tmp_path: Path
) -> None:
    port = free_port()
    server: ServerProcess | None = start_server(bert_rm, port=port)
    log = tmp_path / "trainer.log"
    out = tmp_path / "out"
    metrics = out / "metrics.jsonl"
    run: subprocess.Popen[bytes] | None = None
    try:
        server.wait_ready(90)
        config = write_config(tmp_path, gpt2_policy, server.url)
        run = train(config, log)
        proc = run

        def under_way() -> bool:
            assert proc.poll() is None, log.read_text()[-5000:]
            return len(steps_of(metrics)) >= 3

        wait_for(under_way, 180, "the first steps")
        began = time.monotonic()
        if how == "server_never_back":
            server.stop(signal.SIGKILL)
            server = None
            assert run.wait(timeout=BUDGET_S + 30) == 1, log.read_text()[-5000:]
        else:
            run.send_signal(signal.SIGTERM)
            assert run.wait(timeout=30) == 128 + signal.SIGTERM, log.read_text()[-5000:]
        stopped_after = time.monotonic() - began
        text = log.read_text()
        done = steps_of(metrics)
        assert done == list(range(1, len(done) + 1)) and len(done) < N_STEPS
        # The checkpoint is of the last completed (logged) update; none was due by save_steps.
        checkpoints = list_checkpoints(out)
        assert [c.name for c in checkpoints] == [f"checkpoint-{done[-1]}"], text[-3000:]
        state = json.loads((checkpoints[-1] / STATE_FILE).read_text())
        assert state["step"] == done[-1]
        assert f"stopped at step {done[-1]}" in text
        assert "resume with --resume_from_checkpoint latest" in text
        if how == "server_never_back":
            assert stopped_after <= BUDGET_S + 30
            assert f"of the {BUDGET_S} s retry budget" in text  # it waited, saying so
            server = start_server(bert_rm, port=port)  # back, on the same port
            server.wait_ready(90)
        run = train(config, log, "--resume_from_checkpoint", "latest")
        assert run.wait(timeout=300) == 0, log.read_text()[-5000:]
    finally:
        if run is not None and run.poll() is None:
            run.kill()
            run.wait()
        if server is not None:
            server.stop()
    rows = read_jsonl(metrics)
    assert [r["step"] for r in rows] == list(range(1, N_STEPS + 1))  # each step once
    assert f"done: {N_STEPS} steps" in log.read_text()
