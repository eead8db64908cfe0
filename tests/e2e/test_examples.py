"""The examples of issue 5, run offline with tiny models."""

from __future__ import annotations

import math
import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
import torch
from helpers.training import write_prompts
from peft import LoraConfig, PeftModel, TaskType, get_peft_model
from server_proc import REWARD_SERVER, ServerProcess, free_port
from transformers import AutoModelForSequenceClassification, AutoTokenizer

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.usefixtures("one_torch_thread")
def test_ppo_remote_reward_example(
    gpt2_policy: Path, bert_server: ServerProcess, tmp_path: Path
) -> None:
    from examples.ppo_remote_reward import main

    data = write_prompts(tmp_path / "prompts.jsonl", ["the movie", "i", "a"] * 4)
    history = main(
        [
            "--model", str(gpt2_policy),
            "--reward-url", bert_server.url,
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


def peft_scores(base: Path, adapter: Path | None, texts: list[str]) -> list[float]:
    """In-process scores with peft's own forward pass, one unpadded text at a time."""
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForSequenceClassification.from_pretrained(base)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    model.eval()
    with torch.inference_mode():  # no EOS in these texts: the model's pooling is the last token
        return [
            float(model(input_ids=torch.tensor([tokenizer(t)["input_ids"]])).logits[0, 0])
            for t in texts
        ]


def test_serve_lora_reward_model_script(gpt2_rm: Path, lora_adapter: Path, tmp_path: Path) -> None:
    """The script serves the adapter unmerged and (MERGE=1) merged: the same scores, peft's."""
    texts = ["a great film", "the plot was slow and dull", "i"]
    script = ROOT / "examples" / "serve_lora_reward_model.sh"
    servers: dict[str, ServerProcess] = {}
    for merge in ("0", "1"):  # both at once: they load side by side
        env = {
            **os.environ,
            "BASE_MODEL": str(gpt2_rm),
            "ADAPTER": str(lora_adapter),
            "MERGE": merge,
            "REWARD_SERVER": str(REWARD_SERVER),
        }
        port, log = free_port(), tmp_path / f"server-{merge}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(script), "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT
            )
        servers[merge] = ServerProcess(proc, port, log)
    scores, argv, infos, codes = {}, {}, {}, {}
    try:
        for merge, server in servers.items():
            server.wait_ready(timeout=120)
            # The script exec's the server: its process is the server, with the flags it passed.
            argv[merge] = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().split(b"\0")
            infos[merge] = httpx.get(f"{server.url}/info", timeout=30).json()
            answer = httpx.post(f"{server.url}/score", json={"texts": texts}, timeout=60)
            assert answer.status_code == 200, answer.text
            scores[merge] = answer.json()["scores"]
    finally:
        for merge, server in servers.items():
            # SIGTERM reaches the server itself, which drains and exits 0.
            codes[merge] = server.stop(signal.SIGTERM)
    assert codes == {"0": 0, "1": 0}, [s.log() for s in servers.values()]
    assert b"--merge-adapter" not in argv["0"] and b"--merge-adapter" in argv["1"]
    assert {i["adapter"] for i in infos.values()} == {str(lora_adapter)}
    expected = peft_scores(gpt2_rm, lora_adapter, texts)
    without = peft_scores(gpt2_rm, None, texts)  # the adapter matters, or this proves nothing
    assert max(abs(a - b) for a, b in zip(expected, without, strict=True)) > 1e-2
    assert scores["0"] == pytest.approx(expected, abs=1e-4)
    assert scores["1"] == pytest.approx(scores["0"], abs=1e-4)
