"""Training runs in tests: PPO and TRL GRPO configs, prompts, the trainers' commands and logs.

``ppo_config`` is a short PPO run of a tiny policy (:class:`ppo_client.PPOConfig`, TRL's
names); ``grpo_config`` a short TRL ``GRPOConfig`` on CPU and ``grpo_trainer`` TRL's
``GRPOTrainer`` (TRL is imported when they are called: its trainer imports vLLM, which every
pytest worker would otherwise pay for as it collects the tests). ``ppo_client_env`` and
``accelerate_launch`` are the environment and command line of ``ppo-client train`` in a
subprocess, alone or under ``accelerate launch``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

import tiny_models
from ppo_client import PPOConfig
from reward_server.launcher import free_port

if TYPE_CHECKING:
    from trl import GRPOConfig, GRPOTrainer

#: The console scripts next to the running interpreter.
PPO_CLIENT = Path(sys.executable).parent / "ppo-client"
ACCELERATE = Path(sys.executable).parent / "accelerate"

#: The metrics every PPO step must log, with TRL's names.
TRL_METRICS = [
    "objective/scores",
    "objective/kl",
    "objective/entropy",
    "objective/non_score_reward",
    "objective/rlhf_reward",
    "policy/approxkl_avg",
    "policy/clipfrac_avg",
    "loss/policy_avg",
    "loss/value_avg",
    "val/clipfrac_avg",
    "policy/entropy_avg",
    "val/ratio",
    "val/ratio_var",
    "val/num_eos_tokens",
    "lr",
    "episode",
    "eps",
    "time/reward_wait_s",
    "step",
]

#: The prompts of the tests' PPO runs.
PROMPTS = tiny_models.make_corpus(48, seed=1, min_words=1, max_words=6)


def dataset() -> list[dict[str, Any]]:
    """PROMPTS as a dataset's rows (a ``prompt`` column)."""
    return [{"prompt": p} for p in PROMPTS]


def space_reward(prompts: list[Any], responses: list[str]) -> list[float]:
    """Fraction of the response's characters that are spaces: rewards word-like text."""
    return [r.count(" ") / max(1, len(r)) for r in responses]


def ppo_config(policy: Path, out: Path, **overrides: Any) -> PPOConfig:
    """A short PPO run of ``policy`` writing to ``out`` (two updates of 4 x 2 rollouts)."""
    values: dict[str, Any] = {
        "model_name_or_path": str(policy),
        "output_dir": str(out),
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 2,
        "num_mini_batches": 1,
        "local_rollout_forward_batch_size": 8,
        "num_ppo_epochs": 2,
        "total_episodes": 8 * 4,
        "response_length": 8,
        "learning_rate": 3e-3,
        "temperature": 1.0,
        "kl_coef": 0.01,
        "save_steps": 1000,
        "num_sample_generations": 0,
        "disable_tqdm": True,
    }
    values.update(overrides)
    return PPOConfig(**values)


def grpo_config(output_dir: Path, **overrides: Any) -> GRPOConfig:
    """TRL's ``GRPOConfig`` for a short run on CPU: 2 steps of 4 completions (2 per prompt)
    of at most 8 tokens, logged every step, nothing saved or reported, seed 0."""
    from trl import GRPOConfig

    values: dict[str, Any] = {
        "output_dir": str(output_dir),
        "max_steps": 2,
        "per_device_train_batch_size": 4,
        "num_generations": 2,
        "max_completion_length": 8,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "bf16": False,
        "seed": 0,
        "disable_tqdm": True,
    }
    values.update(overrides)
    return GRPOConfig(**values)


def grpo_trainer(**kwargs: Any) -> GRPOTrainer:
    """TRL's ``GRPOTrainer(**kwargs)``."""
    from trl import GRPOTrainer

    return GRPOTrainer(**kwargs)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of ``path`` (a trainer's metrics.jsonl or samples.jsonl)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def steps_of(path: Path) -> list[int]:
    """The steps a run logged in ``path`` (its metrics.jsonl) so far."""
    return [row["step"] for row in read_jsonl(path)] if path.exists() else []


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> Path:
    """``rows`` as JSON lines in ``path`` (a trainer's dataset file); returns ``path``."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_prompts(path: Path, prompts: Iterable[str]) -> Path:
    """A dataset file of ``prompts`` (a ``prompt`` column); returns ``path``."""
    return write_jsonl(path, ({"prompt": p} for p in prompts))


def ppo_client_env(**extra: str) -> dict[str, str]:
    """The environment of a trainer subprocess: one torch thread (the tiny models run fastest
    that way on a shared machine), unbuffered output, and ``extra``."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


def accelerate_env() -> dict[str, str]:
    """:func:`ppo_client_env` for ``accelerate launch``: CPU processes even where a GPU
    exists, and no tokenizer threads in the forked ranks."""
    return ppo_client_env(CUDA_VISIBLE_DEVICES="", TOKENIZERS_PARALLELISM="false")


def accelerate_launch(config: Path, processes: int = 2) -> list[str]:
    """``accelerate launch`` of ``ppo-client train --config config`` with ``processes``
    ranks on this machine (torchrun-style: the trainer picks gloo on a CPU-only box)."""
    return [
        str(ACCELERATE),
        "launch",
        "--multi_gpu",
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        "-m",
        "ppo_client",
        "train",
        "--config",
        str(config),
    ]


class ScoreCapture:
    """Every /score request body and answer that a reward function exchanges over
    :meth:`client` (or a client with :meth:`on_response` as a response hook), in order.

    ``strict``: a /score answer other than 200 fails the test (in the hook); otherwise only
    the 200s are recorded."""

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict
        self.exchanges: list[tuple[dict[str, Any], dict[str, Any]]] = []

    async def on_response(self, response: httpx.Response) -> None:
        await response.aread()
        if response.request.url.path != "/score":
            return
        if self.strict:
            assert response.status_code == 200, response.text
        if response.status_code == 200:
            self.exchanges.append((json.loads(response.request.content), response.json()))

    @property
    def answers(self) -> list[dict[str, Any]]:
        """The answers alone."""
        return [answer for _body, answer in self.exchanges]

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=60, event_hooks={"response": [self.on_response]})
