"""The examples of issue 5, run offline with tiny models."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
import torch
from peft import LoraConfig, TaskType, get_peft_model
from server_proc import REWARD_SERVER, ServerProcess, free_port, running_server
from transformers import AutoModelForSequenceClassification

ROOT = Path(__file__).resolve().parents[1]


def test_ppo_remote_reward_example(gpt2_policy: Path, bert_rm: Path, tmp_path: Path) -> None:
    from examples.ppo_remote_reward import main

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["the movie", "i", "a"] * 4))
    torch.set_num_threads(1)
    with running_server(bert_rm) as server:
        history = main(
            [
                "--model", str(gpt2_policy),
                "--reward-url", server.url,
                "--dataset", str(data),
                "--output-dir", str(tmp_path / "out"),
                "--",
                "--total_episodes", "8",
                "--per_device_train_batch_size", "4",
                "--response_length", "6",
                "--save_steps", "100",
            ]
        )  # fmt: skip
    assert len(history) == 2
    assert all(math.isfinite(row["objective/scores"]) for row in history)
    assert (tmp_path / "out" / "metrics.jsonl").exists()


@pytest.fixture(scope="module")
def lora_adapter(gpt2_rm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A LoRA adapter with a trained-looking (perturbed) score head on the GPT-2 RM."""
    model = get_peft_model(
        AutoModelForSequenceClassification.from_pretrained(gpt2_rm),
        LoraConfig(task_type=TaskType.SEQ_CLS, r=4, target_modules=["c_attn"], fan_in_fan_out=True),
    )
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                param.add_(torch.randn(param.shape, generator=gen) * 0.3)
    path = tmp_path_factory.mktemp("lora_example")
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize("merge", ["0", "1"], ids=["unmerged", "merged"])
def test_serve_lora_reward_model_script(
    gpt2_rm: Path, lora_adapter: Path, merge: str, tmp_path: Path
) -> None:
    port = free_port()
    env = {
        **os.environ,
        "BASE_MODEL": str(gpt2_rm),
        "ADAPTER": str(lora_adapter),
        "MERGE": merge,
        "REWARD_SERVER": str(REWARD_SERVER),
    }
    script = ROOT / "examples" / "serve_lora_reward_model.sh"
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(script), "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    server = ServerProcess(proc, port, log)
    try:
        server.wait_ready(timeout=60)
        info = httpx.get(f"{server.url}/info").json()
        assert info["adapter"] == str(lora_adapter)
        scored = httpx.post(f"{server.url}/score", json={"texts": ["a great film"]}).json()
        assert math.isfinite(scored["scores"][0])
    finally:
        # The script exec's the server, so SIGTERM reaches it and it drains and exits 0.
        assert server.stop(signal.SIGTERM) == 0, server.log()
