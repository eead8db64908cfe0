"""Masked rewards in ``ppo-client train`` (issue 35): a rollout whose reward could not be
computed (None from a reward callable, ``null`` from the server) is left out of that
update; ``objective/masked_frac`` is their share; an update whose rows are all masked is
skipped with a warning.

The hand-computed maths of a small batch are in tests/unit/test_ppo_masks.py; here the
trainer runs whole: with a reward callable, and with ``ppo-client train`` against a real
server whose python verifier fails on a third of the items.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from helpers.models_files import python_verifier, verifier_function
from helpers.servers import serve
from helpers.training import (
    PPO_CLIENT,
    PROMPTS,
    TRL_METRICS,
    accelerate_env,
    accelerate_launch,
    ppo_client_env,
    ppo_config,
    read_jsonl,
)
from safetensors.torch import load_file
from server_proc import ServerProcess

from ppo_client import PPOTrainer
from ppo_client.data import batch_indices
from ppo_client.sizes import BatchSizes

ROOT = Path(__file__).resolve().parents[2]
BY_LABEL = verifier_function("by_label")


#: Tiny models run fastest on one thread, especially on a shared machine.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def finite_metrics(row: dict[str, Any]) -> None:
    for key, value in row.items():
        if isinstance(value, float):
            assert math.isfinite(value), (key, row)


def test_masked_rows_are_left_out_of_the_update_and_their_share_logged(
    gpt2_policy: Path, tmp_path: Path
) -> None:
    """A reward callable returns None for a third of the prompts: every step logs the
    share it masked, and its score metrics are the means over the other rows only."""
    masked_prompts = set(PROMPTS[::3])
    answers: list[float | None] = []  # every score the reward gave, in call order

    def reward(prompts: list[Any], responses: list[str]) -> list[float | None]:
        out = [
            None if p.strip() in masked_prompts else r.count(" ") / max(1, len(r)) + 0.25
            for p, r in zip(prompts, responses, strict=True)
        ]
        answers.extend(out)
        return out

    out = tmp_path / "run"
    cfg = ppo_config(
        gpt2_policy,
        out,
        total_episodes=8 * 4,
        num_sample_generations=4,
        num_samples_to_log=8,
        stop_token="eos",
        local_rollout_forward_batch_size=3,  # several reward calls per step
    )
    PPOTrainer(cfg, train_dataset=[{"prompt": p} for p in PROMPTS], reward_fn=reward).train()
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for step, row in enumerate(rows):
        given = answers[8 * step : 8 * (step + 1)]
        kept = [s for s in given if s is not None]
        assert row["objective/masked_frac"] == (8 - len(kept)) / 8
        # The raw score is the mean over the rows with a score (no transform here).
        assert row["objective/raw_scores"] == pytest.approx(sum(kept) / len(kept), abs=1e-6)
        for key in TRL_METRICS:
            assert key in row, key
        finite_metrics(row)
    fractions = [r["objective/masked_frac"] for r in rows]
    assert 0 < sum(fractions) / len(fractions) < 1
    samples = read_jsonl(out / "samples.jsonl")
    assert len(samples) == 32
    for sample in samples:
        masked = sample["query"].strip() in masked_prompts
        assert (sample["score"] is None) == masked, sample
        assert (sample["reward"] is None) == masked, sample
        assert sample.get("masked") == ("no_score" if masked else None), sample


def test_an_update_whose_rows_are_all_masked_is_skipped(
    gpt2_policy: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The first update's rows are all masked: it is skipped with a warning (the policy
    keeps its weights, no metric is NaN), the run goes on and learns from the next."""
    calls = {"items": 0}

    def reward(prompts: list[Any], responses: list[str]) -> list[float | None]:
        first = calls["items"] < 8
        calls["items"] += len(responses)
        return [None if first else r.count(" ") / max(1, len(r)) for r in responses]

    out = tmp_path / "run"
    cfg = ppo_config(gpt2_policy, out, total_episodes=8 * 2, save_steps=1)
    with caplog.at_level(logging.WARNING, logger="ppo_client.trainer"):
        PPOTrainer(cfg, train_dataset=[{"prompt": p} for p in PROMPTS], reward_fn=reward).train()
    assert any("update 1 skipped" in r.getMessage() for r in caplog.records), caplog.text
    first, second = read_jsonl(out / "metrics.jsonl")
    assert first["step"] == 1 and first["objective/masked_frac"] == 1.0
    assert "objective/scores" not in first and "loss/policy_avg" not in first
    assert first["episode"] == 8
    finite_metrics(first)
    assert second["objective/masked_frac"] == 0.0
    for key in TRL_METRICS:
        assert math.isfinite(second[key]), key
    # No optimiser step in the skipped update: checkpoint-1 holds the initial policy.
    start = load_file(gpt2_policy / "model.safetensors")
    after_first = load_file(out / "checkpoint-1" / "policy" / "model.safetensors")
    after_second = load_file(out / "checkpoint-2" / "policy" / "model.safetensors")
    assert all(torch.equal(start[k], after_first[k]) for k in start)
    assert not all(torch.equal(start[k], after_second[k]) for k in start)
    assert (out / "reward_curve.png").is_file()


def test_micro_batches_of_masked_rows_only_are_left_out_of_each_step(
    gpt2_policy: Path, tmp_path: Path
) -> None:
    """One rollout per micro-batch: a masked row's micro-batch has no loss, the others of
    its mini-batch count for all of them (scaled), a mini-batch of masked rows only takes
    no optimiser step."""
    masked_prompts = set(PROMPTS[::2])

    def reward(prompts: list[Any], responses: list[str]) -> list[float | None]:
        return [
            None if p.strip() in masked_prompts else r.count(" ") / max(1, len(r))
            for p, r in zip(prompts, responses, strict=True)
        ]

    cfg = ppo_config(
        gpt2_policy,
        tmp_path / "run",
        per_device_train_batch_size=1,
        gradient_accumulation_steps=2,
        num_mini_batches=4,
        total_episodes=8 * 3,
    )
    trainer = PPOTrainer(cfg, train_dataset=[{"prompt": p} for p in PROMPTS], reward_fn=reward)
    calls: list[tuple[tuple[int, int, int], bool, float]] = []
    micro_step = trainer._micro_step

    def spy(r: Any, a: Any, idx: torch.Tensor, stats: Any, at: Any, scale: float = 1.0) -> None:
        calls.append((at, bool(a.valid[idx].any()), scale))
        micro_step(r, a, idx, stats, at, scale)

    trainer._micro_step = spy  # type: ignore[method-assign]
    rows = trainer.train()
    assert [r["objective/masked_frac"] for r in rows] != [0.0] * 3
    steps: dict[int, list[tuple[tuple[int, int, int], bool, float]]] = {}
    update = 0
    for call in calls:  # each update starts again at (0, 0, 0) or later
        if not steps or call[0] <= steps[update][-1][0]:
            update += 1
            steps[update] = []
        steps[update].append(call)
    skipped = 0
    for update_calls in steps.values():
        minis: dict[tuple[int, int], list[tuple[bool, float]]] = {}
        for (epoch, mb, _), has_rows, scale in update_calls:
            minis.setdefault((epoch, mb), []).append((has_rows, scale))
        skipped += 2 * 4 - len(minis)  # mini-batches never run: all their rows masked
        for micro in minis.values():
            assert len(micro) == 2
            with_rows = sum(has for has, _ in micro)
            assert with_rows > 0
            assert {scale for _, scale in micro} == {2 / with_rows}
    assert skipped > 0  # half the prompts masked: some mini-batch of 2 has no row
    for row in rows:
        finite_metrics(row)


# ---------------------------------------------------------------- against a real server


@pytest.fixture(scope="module")
def failing_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server of a python verifier (``on_error: mask``) that raises on the items labelled
    ``raise`` and scores the others by the response's length (both runs below use it)."""
    check = python_verifier("check", BY_LABEL, on_error="mask", workers=2, timeout_s=30)
    with serve(models=[check], folder=tmp_path_factory.mktemp("failing")) as server:
        yield server


def test_ppo_client_train_with_a_verifier_that_fails_on_a_third_of_the_items(
    gpt2_policy: Path, failing_server: ServerProcess, tmp_path: Path
) -> None:
    """``ppo-client train`` against a server whose python verifier (``on_error: mask``)
    raises on the items labelled ``raise``, a third of the prompts: the run completes,
    ``objective/masked_frac`` is 1/3 over the run, each step's raw score is the mean of the
    server's scores of its other rows, and the samples show the masked rows with their
    reason."""
    prompts = PROMPTS[:24]
    data = tmp_path / "prompts.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": p, "answer": "raise" if k % 3 == 0 else "ok"}) + "\n"
            for k, p in enumerate(prompts)
        )
    )
    out = tmp_path / "out"
    config = tmp_path / "ppo.yaml"
    config.write_text(
        f"model_name_or_path: {gpt2_policy}\n"
        f"reward_url: {failing_server.url}\n"
        f"dataset_name: {data}\n"
        "label_column: answer\n"
        f"output_dir: {out}\n"
        "per_device_train_batch_size: 4\n"
        "gradient_accumulation_steps: 2\n"
        "local_rollout_forward_batch_size: 4\n"
        "total_episodes: 24\n"  # one pass over the prompts: 8 of the 24 rows masked
        "response_length: 8\n"
        "stop_token: eos\n"
        "reward_scale: 0.05\n"  # the verifier's score is the response's length
        "learning_rate: 1.0e-3\n"
        "num_sample_generations: 3\n"
        "num_samples_to_log: 8\n"
        "disable_tqdm: true\n"
    )
    env = ppo_client_env()
    proc = subprocess.run(
        [str(PPO_CLIENT), "train", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr + failing_server.log()
    assert "done: 3 steps" in proc.stdout

    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    fractions = [r["objective/masked_frac"] for r in rows]
    assert sum(fractions) / 3 == pytest.approx(1 / 3), fractions
    for row in rows:
        finite_metrics(row)
    samples = read_jsonl(out / "samples.jsonl")
    assert len(samples) == 24  # every row of every step
    for sample in samples:
        if sample["label"] == "raise":
            assert sample["score"] is None and sample["reward"] is None, sample
            assert sample["masked"] == "error", sample
        else:
            assert sample["score"] == float(len(sample["response"])), sample
    for row in rows:
        scored = [
            s["score"] for s in samples if s["step"] == row["step"] and s["score"] is not None
        ]
        assert row["objective/masked_frac"] == 1 - len(scored) / 8
        assert row["objective/raw_scores"] == pytest.approx(sum(scored) / len(scored), abs=1e-4)


@pytest.mark.slow
def test_accelerate_launch_with_a_rank_whose_rows_are_all_masked(
    gpt2_policy: Path, failing_server: ServerProcess, tmp_path: Path
) -> None:
    """Two CPU processes (gloo DDP) against the failing verifier, with running reward
    normalisation: in the first update every row of rank 1 is masked and one of rank 0's,
    in the second one row of rank 1. Both ranks go through every collective (no hang), the
    run completes, and the logged share is over both ranks' rows."""
    prompts = PROMPTS[:16]
    cfg = ppo_config(gpt2_policy, tmp_path / "unused", per_device_train_batch_size=2)
    sizes = BatchSizes.from_config(cfg, 2, len(prompts))  # 4 rows per rank and update
    rank = {
        (u, r): batch_indices(u, len(prompts), sizes, cfg.seed, r) for u in (0, 1) for r in (0, 1)
    }
    failing = {*rank[0, 1], rank[0, 0][0], rank[1, 1][0]}
    data = tmp_path / "prompts.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": p, "answer": "raise" if k in failing else "ok"}) + "\n"
            for k, p in enumerate(prompts)
        )
    )
    out = tmp_path / "out"
    config = tmp_path / "ppo.yaml"
    env = accelerate_env()
    config.write_text(
        f"model_name_or_path: {gpt2_policy}\n"
        f"reward_url: {failing_server.url}\n"
        f"dataset_name: {data}\n"
        "label_column: answer\n"
        f"output_dir: {out}\n"
        "per_device_train_batch_size: 2\n"
        "gradient_accumulation_steps: 2\n"
        "local_rollout_forward_batch_size: 4\n"
        "total_episodes: 16\n"  # 2 updates of 2 ranks x 4 rollouts
        "num_ppo_epochs: 1\n"
        "response_length: 6\n"
        "stop_token: eos\n"
        "reward_normalization: running\n"
        "disable_tqdm: true\n"
    )
    cmd = accelerate_launch(config)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=480)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-8000:]
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["objective/masked_frac"] for r in rows] == [5 / 8, 1 / 8]
    for row in rows:
        for key in TRL_METRICS:
            assert math.isfinite(row[key]), (key, row)
