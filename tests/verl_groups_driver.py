"""verl's ``batch`` reward manager scoring a GRPO rollout batch through
``reward_client.integrations.verl.compute_score_batch``, which sends the batch's groups.

Run by ``tests/integration/test_verl_groups.py`` in a subprocess with verl 0.9.1 on its
PYTHONPATH (as ``verl_driver.py`` is). Usage: ``python verl_groups_driver.py CASE.json
RESULT.json``. The batch is built as verl's trainer builds it: a ``uid`` per prompt, then
``DataProto.repeat(n, interleave=True)``, so each prompt's ``n`` responses sit together and
share its ``extra_info`` (which holds the prompt and, as verl's preprocessing writes it, the
dataset row's ``index``). The result holds each response's reward (from verl's token-level
reward tensor) and the uids.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl import DataProto
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.workers.reward_manager import BatchRewardManager

from reward_client.integrations import verl as adapter


def rollout(case: dict[str, Any], tokenizer: Any) -> DataProto:
    """The batch verl's trainer has after generating ``n`` responses per prompt."""
    n, prompts = case["n"], case["prompts"]
    batch = DataProto.from_dict(
        tensors={"row": torch.arange(len(prompts))},
        non_tensors={
            "data_source": np.array(["groups"] * len(prompts), dtype=object),
            "reward_model": np.array([{"ground_truth": "x"} for _ in prompts], dtype=object),
            "extra_info": np.array(
                [{"prompt": p, "index": i} for i, p in enumerate(prompts)], dtype=object
            ),
            "uid": np.array([f"uid-{i}" for i in range(len(prompts))], dtype=object),
        },
    )
    batch = batch.repeat(repeat_times=n, interleave=True)
    pad = tokenizer.eos_token_id
    prompt_ids = tokenizer.encode("p")
    response_ids = [tokenizer.encode(r) for r in case["responses"]]
    width = max(map(len, response_ids)) + 1
    mask = [[1] * (len(prompt_ids) + len(r)) + [0] * (width - len(r)) for r in response_ids]
    return DataProto.from_dict(
        tensors={
            "prompts": torch.tensor([prompt_ids] * len(response_ids)),
            "responses": torch.tensor([r + [pad] * (width - len(r)) for r in response_ids]),
            "attention_mask": torch.tensor(mask),
        },
        non_tensors=batch.non_tensor_batch,
    )


def main(case_path: str, result_path: str) -> None:
    case = json.loads(Path(case_path).read_text())
    tokenizer = AutoTokenizer.from_pretrained(case["tokenizer"])
    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://reward_client.integrations.verl",
                    "name": "compute_score_batch",
                    "reward_kwargs": {},
                }
            }
        }
    )
    manager = BatchRewardManager(
        tokenizer,
        num_examine=0,
        compute_score=get_custom_reward_fn(config),
        reward_url=case["url"],
        prompt_key="prompt",
        **case.get("reward_kwargs", {}),
    )
    data = rollout(case, tokenizer)
    rewards = manager(data).sum(dim=-1).tolist()
    adapter.close_clients()
    result = {
        "rewards": rewards,
        "uids": [str(u) for u in data.non_tensor_batch["uid"]],
        "decoded": [
            tokenizer.decode(r[r != tokenizer.eos_token_id], skip_special_tokens=True)
            for r in data.batch["responses"]
        ],
    }
    Path(result_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
