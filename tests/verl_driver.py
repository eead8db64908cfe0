"""Run verl's own reward managers with ``reward_client.integrations.verl`` and a server.

``tests/integration/test_verl.py`` runs this script in a subprocess with verl 0.9.1 on its PYTHONPATH
(``make setup`` installs verl without its pins into ``.venv/verl``; the test process itself
never imports verl). Usage: ``python verl_driver.py CASE.json RESULT.json``.

The case holds the server's URL, the policy tokenizer's folder and the samples (responses,
prompts and the ``extra_info`` of each). The script builds the DataProto a rollout leaves
behind, hands it to verl's legacy ``naive`` and ``batch`` managers and to the reward loop's
``naive`` manager (``compute_score_async`` and ``compute_score``), each made from a
``custom_reward_function`` config the way verl's trainer makes it, and writes what each
returned, with the warnings ``reward_client.integrations.verl`` logged, to the result file.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import verl
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl import DataProto
from verl.trainer.ppo.reward import get_custom_reward_fn, load_reward_manager
from verl.workers.reward_manager import BatchRewardManager, NaiveRewardManager

from reward_client.integrations import verl as adapter


class Records(logging.Handler):
    """Keeps the messages of the records it handles."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(f"{record.levelname}: {record.getMessage()}")


def plain(value: Any) -> Any:
    """``value`` with numpy and torch values made JSON-serialisable."""
    if isinstance(value, torch.Tensor | np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def reward_config(name: str, reward_kwargs: dict[str, Any]) -> Any:
    """verl 0.9's trainer config, reduced to what its reward code reads."""
    return OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://reward_client.integrations.verl",
                    "name": name,
                    "reward_kwargs": reward_kwargs,
                },
                "reward_manager": {"source": "register", "name": "naive"},
            }
        }
    )


def batch(case: dict[str, Any], tokenizer: Any) -> tuple[DataProto, list[int]]:
    """The DataProto a rollout of ``case``'s samples leaves, and each response's length."""
    pad = tokenizer.eos_token_id
    prompt_ids = [tokenizer.encode(p) for p in case["prompts"]]
    response_ids = [tokenizer.encode(r) for r in case["responses"]]
    p_len, r_len = max(map(len, prompt_ids)), max(map(len, response_ids)) + 2
    mask = [
        [0] * (p_len - len(p)) + [1] * (len(p) + len(r)) + [0] * (r_len - len(r))
        for p, r in zip(prompt_ids, response_ids, strict=True)
    ]
    extra_infos = copy.deepcopy(case["extra_infos"])
    for i in case["ndarray_prompts"]:  # a message list as read back from parquet
        extra_infos[i]["prompt"] = np.array(extra_infos[i]["prompt"], dtype=object)
    n = len(response_ids)
    data = DataProto.from_dict(
        tensors={
            "prompts": torch.tensor([[pad] * (p_len - len(p)) + p for p in prompt_ids]),
            "responses": torch.tensor([r + [pad] * (r_len - len(r)) for r in response_ids]),
            "attention_mask": torch.tensor(mask),
        },
        non_tensors={
            "data_source": np.array(["hh"] * n, dtype=object),
            "reward_model": np.array([{"ground_truth": "x"}] * n, dtype=object),
            "extra_info": np.array(extra_infos, dtype=object),
        },
    )
    return data, [len(r) for r in response_ids]


def legacy(case: dict[str, Any], tokenizer: Any) -> dict[str, Any]:
    """verl.workers.reward_manager's naive and batch managers, as their trainer builds them."""
    naive = NaiveRewardManager(
        tokenizer,
        num_examine=0,
        compute_score=get_custom_reward_fn(reward_config("compute_score", {})),
    )
    batch_manager = BatchRewardManager(
        tokenizer,
        num_examine=0,
        compute_score=get_custom_reward_fn(reward_config("compute_score_batch", {})),
        reward_url=case["url"],
        prompt_key="prompt",
        reward_details=True,
    )
    out = {}
    for name, manager in (("legacy_naive", naive), ("legacy_batch", batch_manager)):
        result = manager(batch(case, tokenizer)[0], return_dict=True)
        out[name] = {
            "rewards": plain(result["reward_tensor"]),
            "extra": plain(dict(result["reward_extra_info"])),
        }
    return out


async def reward_loop(case: dict[str, Any], tokenizer: Any, name: str) -> dict[str, Any]:
    """The reward loop's naive manager from ``load_reward_manager``, one task per sample.

    The manager is given a reward-router address, as verl does when its own reward model is
    on, so it passes ``reward_router_address`` and ``reward_model_tokenizer`` to the function.
    """
    config = reward_config(
        name,
        {
            "reward_url": case["url"],
            "prompt_key": "prompt",
            "reward_details": name.endswith("async"),
        },
    )
    data, _ = batch(case, tokenizer)
    manager = load_reward_manager(
        config, tokenizer, reward_router_address="127.0.0.1:1", reward_model_tokenizer=None
    )
    try:
        outputs = await asyncio.gather(
            *(manager.run_single(data[i : i + 1]) for i in range(len(data)))
        )
    finally:
        await adapter.aclose_clients()
    scores = [o["reward_score"] for o in outputs]
    return {
        "manager": type(manager).__module__ + "." + type(manager).__name__,
        "awaits": manager.is_async_reward_score,
        "scores": plain(scores),
        "extra": plain([o["reward_extra_info"] for o in outputs]),
        "rm_scores": plain(manager.assemble_rm_scores(data, scores)),
    }


def main(case_path: str, result_path: str) -> None:
    case = json.loads(Path(case_path).read_text())
    records = Records()
    logging.getLogger("reward_client.integrations.verl").addHandler(records)
    tokenizer = AutoTokenizer.from_pretrained(case["tokenizer"])
    data, lengths = batch(case, tokenizer)
    result: dict[str, Any] = {
        "verl": verl.__version__,
        "decoded": [
            tokenizer.decode(r[:n], skip_special_tokens=True)
            for r, n in zip(data.batch["responses"], lengths, strict=True)
        ],
        "lengths": lengths,
        **legacy(case, tokenizer),
    }
    for name in ("compute_score_async", "compute_score"):
        result[f"loop_{name}"] = asyncio.run(reward_loop(case, tokenizer, name))
    adapter.close_clients()
    result["warnings"] = records.messages
    Path(result_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
