"""The parts of ``rollout_engine: vllm`` that need no vLLM: the weights the engine gets
(a LoRA policy's merged without touching the trainer's), scores of rows sent out of order
put back in order, and the keys only the vLLM engine reads."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from helpers.training import ppo_config
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from ppo_client.config import ConfigError
from ppo_client.rollout import Scores
from ppo_client.streaming import reorder
from ppo_client.vllm_rollout import merged_weights


def test_a_full_policys_weights_are_its_state_dict(gpt2_policy: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(gpt2_policy)
    got = dict(merged_weights(model))
    want = model.state_dict()
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_a_lora_policys_weights_are_merged_and_its_base_is_untouched(gpt2_policy: Path) -> None:
    base = AutoModelForCausalLM.from_pretrained(gpt2_policy, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True)
    model = get_peft_model(base, config)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.add_(torch.randn(param.shape, generator=gen) * 0.5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    got = dict(merged_weights(model))
    want = copy.deepcopy(model).merge_and_unload().state_dict()
    assert got.keys() == want.keys()
    for key in want:
        assert torch.allclose(got[key], want[key], atol=1e-6), key
    # The adapter counts: a merged layer's weight is not its base weight.
    key = "transformer.h.0.attn.c_attn.weight"
    base_key = "base_model.model." + key.replace(".weight", ".base_layer.weight")
    assert not torch.allclose(got[key], before[base_key], atol=1e-3)
    after = model.state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before)


def test_scores_of_rows_sent_out_of_order_come_back_in_order() -> None:
    scored = Scores(
        [3.0, 1.0, 2.0, 0.0], [True, False, False, True], None, None, [0.3, 0.1, 0.2, 0.0]
    )
    back = reorder(scored, [3, 1, 2, 0])
    assert back.scores == [0.0, 1.0, 2.0, 3.0]
    assert back.truncated == [True, False, False, True]
    assert back.outcome_scores == [0.0, 0.1, 0.2, 0.3] and back.step_scores is None
    assert reorder(scored, [0, 1, 2, 3]) is scored


@pytest.mark.parametrize("key", ["vllm_memory_share", "rollout_is_cap"])
def test_vllm_keys_need_the_vllm_engine(key: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"{key}: only for rollout_engine: vllm"):
        ppo_config(tmp_path / "p", tmp_path / "o", **{key: 0.5})
    ppo_config(tmp_path / "p", tmp_path / "o", rollout_engine="vllm", **{key: 0.5})


@pytest.mark.parametrize("engine", ["transformers", "vllm"])
def test_both_engines_take_the_streaming_keys(engine: str, tmp_path: Path) -> None:
    cfg = ppo_config(
        tmp_path / "p",
        tmp_path / "o",
        rollout_engine=engine,
        stream_rewards=False,
        reward_stream_size=4,
    )
    assert (cfg.stream_rewards, cfg.reward_stream_size) == (False, 4)
