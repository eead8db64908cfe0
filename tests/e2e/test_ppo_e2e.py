"""End to end, different tokenizers: ``ppo-client train`` (tiny GPT-2 policy, byte-level BPE)
against a live ``reward-server`` hosting a tiny BERT reward model (WordPiece)."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest
from helpers.training import (
    PPO_CLIENT,
    PROMPTS,
    TRL_METRICS,
    ppo_client_env,
    read_jsonl,
    write_prompts,
)
from server_proc import running_server
from transformers import AutoTokenizer

from reward_client import RewardClient


def test_tokenizers_differ(gpt2_policy: Path, bert_rm: Path) -> None:
    policy_tok = AutoTokenizer.from_pretrained(gpt2_policy)
    rm_tok = AutoTokenizer.from_pretrained(bert_rm)
    text = "the movie was great"
    assert policy_tok(text)["input_ids"] != rm_tok(text)["input_ids"]
    assert policy_tok.get_vocab() != rm_tok.get_vocab()


def test_ppo_client_trains_against_a_live_reward_server(
    gpt2_policy: Path, bert_rm: Path, tmp_path: Path
) -> None:
    data = write_prompts(tmp_path / "prompts.jsonl", PROMPTS[:32])
    out = tmp_path / "out"
    config = tmp_path / "ppo.yaml"
    with running_server(bert_rm, "--max-client-batch", "4") as server:
        config.write_text(
            f"model_name_or_path: {gpt2_policy}\n"
            f"reward_url: {server.url}\n"
            f"dataset_name: {data}\n"
            f"output_dir: {out}\n"
            "per_device_train_batch_size: 4\n"
            "gradient_accumulation_steps: 2\n"
            "local_rollout_forward_batch_size: 4\n"
            "total_episodes: 24\n"
            "response_length: 8\n"
            "stop_token: eos\n"
            "learning_rate: 1.0e-3\n"
            "save_steps: 2\n"
            "num_sample_generations: 3\n"
            "disable_tqdm: true\n"
        )
        proc = subprocess.run(
            [str(PPO_CLIENT), "train", "--config", str(config), "--num_ppo_epochs", "2"],
            capture_output=True,
            text=True,
            env=ppo_client_env(),
            timeout=240,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr + server.log()
        assert "done: 3 steps" in proc.stdout

        rows = read_jsonl(out / "metrics.jsonl")
        assert [r["step"] for r in rows] == [1, 2, 3]
        for row in rows:
            for key in [*TRL_METRICS, "reward/truncated_frac"]:
                assert math.isfinite(row[key]), (key, row)
        assert (out / "checkpoint-2" / "policy" / "model.safetensors").is_file()
        assert (out / "checkpoint-2" / "optimizer.pt").is_file()
        assert (out / "reward_curve.png").stat().st_size > 0
        assert (out / "model.safetensors").is_file()

        # The logged scores are the server's scores of the decoded text, re-tokenized by
        # the reward model's own (WordPiece) tokenizer.
        samples = read_jsonl(out / "samples.jsonl")
        assert samples
        with RewardClient(server.url) as client:
            again = client.score(
                queries=[s["query"] for s in samples], responses=[s["response"] for s in samples]
            )
        assert again == pytest.approx([s["score"] for s in samples], abs=1e-5)
        for sample in samples:
            assert "<|endoftext|>" not in sample["response"]

        # And the quick check of a running server.
        score = subprocess.run(
            [str(PPO_CLIENT), "score", "--reward-url", server.url, "a great film", "boring"],
            capture_output=True,
            text=True,
            env=ppo_client_env(),
            timeout=60,
        )
        assert score.returncode == 0, score.stderr
        printed = [float(line) for line in score.stdout.split()]
        with RewardClient(server.url) as client:
            assert printed == pytest.approx(
                client.score(texts=["a great film", "boring"]), abs=1e-5
            )


def test_train_cli_reports_config_errors(tmp_path: Path) -> None:
    proc = subprocess.run(
        [str(PPO_CLIENT), "train", "--learnig_rate", "1"],
        capture_output=True,
        text=True,
        env=ppo_client_env(),
        timeout=60,
    )
    assert proc.returncode == 2
    assert "did you mean 'learning_rate'" in proc.stderr


def test_score_cli_reports_an_unreachable_server() -> None:
    proc = subprocess.run(
        [
            str(PPO_CLIENT),
            "score",
            "--reward-url",
            "http://127.0.0.1:9",
            "--timeout",
            "2",
            "--max-retries",
            "0",
            "x",
        ],
        capture_output=True,
        text=True,
        env=ppo_client_env(),
        timeout=120,
    )
    assert proc.returncode == 1
    assert "ppo-client score:" in proc.stderr
