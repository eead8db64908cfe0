"""Run verl's agent loop worker on a batch of agent rollouts, rewarded through its reward loop
by ``reward_client.integrations.verl`` and a reward server.

``tests/integration/test_verl_agent.py`` runs this script in a subprocess with verl 0.9.1 on
its PYTHONPATH. Usage: ``python verl_agent_driver.py CASE.json RESULT.json``.

Everything is verl's own but the LLM server: the trainer's generated config
(``_generated_ppo_trainer.yaml``) with the case's settings, an ``AgentLoopWorker`` built by
its own constructor (it loads the function tool from ``multi_turn.function_tool_path`` and
the agent loop named ``tool_agent`` from ``agent.agent_loop_config_path``: the case maps it
to ``reward_client.integrations.verl_agent.TrajectoryToolAgentLoop``), and a
``RewardLoopWorker`` built by its own constructor (its ``naive`` manager, the
``custom_reward_function``), called in this process where verl would call its Ray actor.
The LLM server is scripted: each sample's turns are texts, the next one picked by how many
tool results its prompt already holds. ``generate_sequences`` runs the loops, computes each
trajectory's reward as it finishes and assembles the batch; the result file holds what it
returned (per sample: the recorded trajectory, the reward in ``rm_scores``, the reward's
details) for each of the reward functions ``compute_score_async`` and ``compute_score``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import verl
from omegaconf import OmegaConf
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
from verl.workers.rollout.replica import TokenOutput

from reward_client.integrations import verl as adapter

#: verl's whole trainer config, as its hydra entry point composes it.
GENERATED = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
AGENT_LOOPS = (
    "- name: tool_agent\n"
    "  _target_: reward_client.integrations.verl_agent.TrajectoryToolAgentLoop\n"
)


class ScriptedServer:
    """Stands in for verl's LLM server client: ``scripts`` maps a word of a sample's prompt
    to its turns; the next turn is picked by the tool results the prompt already holds."""

    def __init__(self, tokenizer: Any, scripts: dict[str, list[str]]) -> None:
        self.tokenizer = tokenizer
        self.scripts = scripts

    async def generate(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any
    ) -> TokenOutput:
        text = self.tokenizer.decode(prompt_ids)
        turns = next(turns for word, turns in self.scripts.items() if word in text)
        turn = turns[text.count("<tool_response>\n")]
        ids = [*self.tokenizer.encode(turn, add_special_tokens=False), self.tokenizer.eos_token_id]
        return TokenOutput(token_ids=ids, log_probs=[0.0] * len(ids), stop_reason="completed")


class InProcess:
    """A Ray actor handle's ``compute_score.remote(data)`` for a RewardLoopWorker here."""

    def __init__(self, worker: RewardLoopWorker) -> None:
        self.worker = worker
        self.compute_score = self

    def remote(self, data: DataProto) -> Any:
        return self.worker.compute_score(data)


def trainer_config(case: dict[str, Any], folder: Path, function: str) -> Any:
    """verl's generated trainer config with the agent loop, the tool and the reward function."""
    (folder / "tools.py").write_text(case["tool_source"])
    (folder / "agent_loops.yaml").write_text(AGENT_LOOPS)
    settings = {
        "actor_rollout_ref": {
            "model": {"path": case["policy"]},
            "rollout": {
                "name": "vllm",
                "multi_turn": {
                    "enable": True,
                    "format": "hermes",
                    "max_assistant_turns": 4,
                    "function_tool_path": str(folder / "tools.py"),
                },
                "agent": {"agent_loop_config_path": str(folder / "agent_loops.yaml")},
            },
        },
        "data": {"max_prompt_length": 1024, "max_response_length": 256},
        "reward": {
            "custom_reward_function": {
                "path": "pkg://reward_client.integrations.verl",
                "name": function,
                "reward_kwargs": {"reward_url": case["url"], "reward_details": True},
            }
        },
    }
    return OmegaConf.merge(OmegaConf.load(GENERATED), OmegaConf.create(settings))


def objects(values: list[Any]) -> np.ndarray:
    """A numpy object array of ``values`` (verl's non-tensor columns)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


async def rollout(case: dict[str, Any], folder: Path, function: str) -> dict[str, Any]:
    """One batch through verl's agent loop worker, rewarded by ``function``."""
    config = trainer_config(case, folder, function)
    rewards = InProcess(RewardLoopWorker(config))
    worker = AgentLoopWorker(config, llm_client=None, reward_loop_worker_handles=[rewards])
    worker.llm_client = ScriptedServer(worker.tokenizer, case["scripts"])
    n = len(case["prompts"])
    batch = DataProto.from_dict(
        non_tensors={
            "raw_prompt": objects(case["prompts"]),
            "agent_name": objects(["tool_agent"] * n),
            "data_source": objects(["weather"] * n),
            "reward_model": objects([{"ground_truth": None}] * n),
            "extra_info": objects([{"index": i} for i in range(n)]),
            "index": np.arange(n),
        }
    )
    try:
        output = await worker.generate_sequences(batch)
    finally:
        await adapter.aclose_clients()
    columns = output.non_tensor_batch
    return {
        "trajectories": plain(columns["reward_trajectory"]),
        "rewards": plain(output.batch["rm_scores"].sum(-1)),
        "details": {key: plain(columns[key]) for key in ("score", "tokens", "truncated")},
        "num_turns": plain(columns["__num_turns__"]),
    }


def plain(value: Any) -> Any:
    """``value`` with numpy and torch values made JSON-serialisable."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def main(case_path: str, result_path: str) -> None:
    case = json.loads(Path(case_path).read_text())
    result: dict[str, Any] = {"verl": verl.__version__}
    for function in ("compute_score_async", "compute_score"):
        result[function] = asyncio.run(rollout(case, Path(case_path).parent, function))
    adapter.close_clients()
    Path(result_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])
