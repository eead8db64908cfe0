"""`make demo`: a policy trained by PPO against a reward model with another tokenizer.

Stages:
  1. reward model: all-MiniLM-L6-v2 (WordPiece) + a score head, trained with TRL's
     RewardTrainer on generated movie-review preference pairs (positive > negative);
  2. policy: a small GPT-2 with its own byte-level BPE tokenizer, trained to write review
     sentences of both sentiments;
  3. `reward-server` serves the reward model on 127.0.0.1;
  4. `ppo-client train` trains the policy against it over HTTP; samples before and after.

Both models are cached under the output folder, so a second run goes straight to PPO.
Run `python -m examples.demo --help` for the options.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# OpenMP threads that wait for work by sleeping, not spinning (read when torch loads): on a
# busy 2-core machine a spinning thread holds the core its partner needs, and a reward-model
# step took 7.1 s on two threads against 0.77 s with passive waiting (and 0.77 s on one).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from examples import demo_data, demo_models
from ppo_client.precision import Bf16Setting
from reward_server.launcher import deferred_signals, held_for_children, running_server

PPO_CLIENT = Path(sys.executable).parent / "ppo-client"
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
SAMPLE_PROMPTS = ["the movie was", "i thought the film", "the acting", "this film is", "i"]


@dataclass(frozen=True)
class Sizes:
    """How much work each stage does (the full demo, or a quick one for tests)."""

    rm_pairs: int = 600
    policy_sentences: int = 4000
    policy_steps: int = 400
    ppo_episodes: int = 1536
    ppo_batch: int = 32


FULL = Sizes()
QUICK = Sizes(rm_pairs=400, policy_sentences=2000, policy_steps=250, ppo_episodes=768, ppo_batch=32)


def stage(n: int, title: str, text: str, started: float) -> None:
    """Print a stage header (with the seconds since the demo ``started``) and a short explanation."""
    print(f"\n=== [{n}/4] {title} === ({time.monotonic() - started:.0f} s in)")
    for line in text.strip().splitlines():
        print(f"    {line.strip()}")
    sys.stdout.flush()


def ppo_config(out: Path, url: str, sizes: Sizes, seed: int) -> dict[str, object]:
    """The PPO run's configuration (TRL's key names)."""
    return {
        "model_name_or_path": str(out / "policy"),
        "reward_url": url,
        "dataset_name": str(out / "prompts.jsonl"),
        "output_dir": str(out / "ppo"),
        "seed": seed,
        "total_episodes": sizes.ppo_episodes,
        "per_device_train_batch_size": sizes.ppo_batch // 4,
        "gradient_accumulation_steps": 4,
        "num_mini_batches": 1,
        "num_ppo_epochs": 4,
        "local_rollout_forward_batch_size": sizes.ppo_batch,
        "learning_rate": 5e-4,
        "response_length": 16,
        "temperature": 1.0,
        "kl_coef": 0.05,
        "missing_eos_penalty": 1.0,
        "save_steps": 100_000,  # no intermediate checkpoints; the final model is saved
        "num_sample_generations": 4,
        "report_to": "none",
    }


def sample_and_score(policy_dir: Path, url: str, seed: int) -> list[tuple[str, str, float]]:
    """Sample one completion per demo prompt and score it through the server."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reward_client import RewardClient

    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    model = AutoModelForCausalLM.from_pretrained(policy_dir).eval()
    torch.manual_seed(seed)
    completions = []
    for prompt in SAMPLE_PROMPTS:
        ids = tokenizer(tokenizer.eos_token + prompt, return_tensors="pt")
        with torch.inference_mode():
            out = model.generate(
                **ids,
                do_sample=True,
                top_k=0,
                top_p=1.0,
                max_new_tokens=16,
                pad_token_id=tokenizer.eos_token_id,
            )
        completions.append(
            tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
        )
    with RewardClient(url) as client:
        scores = client(SAMPLE_PROMPTS, completions)
    return list(zip(SAMPLE_PROMPTS, completions, scores, strict=True))


def print_samples(title: str, samples: list[tuple[str, str, float]]) -> None:
    """Print prompt | completion -> score lines."""
    print(f"\n  {title}")
    for prompt, completion, score in samples:
        print(f"    {score:+6.2f}  {prompt} |{completion}")


def read_metrics(path: Path) -> list[dict[str, float]]:
    """The rows of a metrics.jsonl file."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_trainer(config_path: Path) -> int:
    """Run ``ppo-client train`` to its end; on Ctrl-C (or SIGTERM) stop it before returning.

    The terminal's Ctrl-C reaches the trainer too, and it stops by itself within a second or
    two (at the end of an update that has begun). A signal sent to this process only, or one
    that landed while the trainer was being started, does not reach it: after a grace period
    it gets a SIGTERM (the trainer's clean stop), then SIGKILL. A trainer ended by SIGINT or
    SIGTERM (killed by it before its handlers were in place, or stopped cleanly by them) is a
    stop, not a failure, even when this process never saw the signal: :class:`Stopped`.
    """
    trainer: subprocess.Popen[bytes] | None = None
    try:
        # deferred_signals: a signal cannot lose the handle between fork and return;
        # held_for_children: nor can the trainer's interpreter lose one as it starts.
        with deferred_signals(), held_for_children():
            # One torch thread each: the trainer and the server share this machine's cores.
            trainer = subprocess.Popen(
                [str(PPO_CLIENT), "train", "--config", str(config_path)], env=ONE_THREAD
            )
        code = trainer.wait()
    except KeyboardInterrupt:
        if trainer is not None:
            report_stop("trainer", trainer, stop_trainer(trainer))
        raise
    signum = stop_signal(code)
    if signum is not None:
        report_stop("trainer", trainer, code)
        raise Stopped(signum)
    return code


def stop_signal(code: int) -> int | None:
    """The signal (SIGINT or SIGTERM) a child's exit code says it was stopped by, else None:
    ``-N`` when the signal killed it, ``128 + N`` when it caught it and exited cleanly
    (``ppo-client train`` does, after a checkpoint)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        if code in (-signum, 128 + signum):
            return int(signum)
    return None


def stop_trainer(trainer: subprocess.Popen[bytes], grace: float = 5.0) -> int:
    """Wait ``grace`` s for a trainer that got the Ctrl-C, then SIGTERM, then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            return trainer.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                trainer.send_signal(sig)
            grace = 20.0  # a clean stop saves a checkpoint first
    return trainer.wait()


def report_stop(name: str, proc: subprocess.Popen[bytes], code: int) -> None:
    """One line per stopped child, in the order they were stopped."""
    print(f"    stopped the {name} (pid {proc.pid}, exit code {code})", file=sys.stderr)


class Stopped(KeyboardInterrupt):
    """The demo was stopped by ``signum`` (SIGINT or SIGTERM): it exits ``128 + signum``.

    A KeyboardInterrupt, so every ``except KeyboardInterrupt`` on the way out (the running
    server's, the trainer's) unwinds it the same way.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum: int, frame: object) -> None:
    raise Stopped(signum)


def main(argv: list[str] | None = None) -> int:
    """Run the four stages; return 0 when the score went up."""
    parser = argparse.ArgumentParser(
        prog="python -m examples.demo", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--out", type=Path, default=Path("runs/demo"), help="output and cache folder"
    )
    parser.add_argument("--quick", action="store_true", help="a smaller run (used by the tests)")
    parser.add_argument("--fresh", action="store_true", help="retrain the cached models too")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--bf16",
        choices=("auto", "true", "false"),
        default="auto",
        help="bf16 autocast when training the two models; auto: where the CPU has it natively",
    )
    args = parser.parse_args(argv)
    bf16: Bf16Setting = {"true": True, "false": False}.get(args.bf16, "auto")
    # Ctrl-C and a SIGTERM (e.g. from a supervisor) unwind the same way, so the server is
    # stopped; SIGINT is set here too, as a parent that ignored it would have left it ignored.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupt)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("ppo_client.precision").setLevel(logging.INFO)  # say what bf16 gave
    sizes = QUICK if args.quick else FULL
    out: Path = args.out
    started = time.monotonic()
    if args.fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)

    # --- 1. reward model ------------------------------------------------------------
    rm_dir, rm_meta = out / "reward_model", out / "reward_model" / "demo.json"
    stage(
        1,
        "reward model",
        """
        all-MiniLM-L6-v2 (BERT, WordPiece vocabulary of 30522) gets a one-logit score head,
        trained with TRL's RewardTrainer on preference pairs: chosen = a positive review
        sentence, rejected = the same sentence made negative. Loss: -log sigmoid(r_c - r_r).
    """,
        started,
    )
    if rm_meta.exists():
        accuracy = json.loads(rm_meta.read_text())["heldout_accuracy"]
        print(f"    cached in {rm_dir}")
    else:
        accuracy = demo_models.train_reward_model(
            rm_dir,
            demo_data.preference_pairs(sizes.rm_pairs, seed=args.seed + 1),
            demo_data.preference_pairs(200, seed=args.seed + 2),
            seed=args.seed,
            bf16=bf16,
        )
        rm_meta.write_text(json.dumps({"heldout_accuracy": accuracy}))
    print(f"    held-out pairwise accuracy: {accuracy:.1%} (200 pairs never seen in training)")

    # --- 2. policy ----------------------------------------------------------------
    policy_dir = out / "policy"
    stage(
        2,
        "policy",
        """
        A 2-layer GPT-2 with its own byte-level BPE tokenizer (600 tokens, trained here on
        the demo corpus) learns to write review sentences of BOTH sentiments, half and half.
        Its token ids mean nothing to the reward model: only text crosses over.
    """,
        started,
    )
    if (policy_dir / "config.json").exists():
        print(f"    cached in {policy_dir}")
    else:
        loss = demo_models.train_policy(
            policy_dir,
            [r.text for r in demo_data.corpus(sizes.policy_sentences, seed=args.seed + 3)],
            steps=sizes.policy_steps,
            seed=args.seed,
            bf16=bf16,
        )
        print(f"    final language-model loss: {loss:.3f}")
    with (out / "prompts.jsonl").open("w") as f:
        for row in demo_data.prompts(512, seed=args.seed + 4):
            f.write(json.dumps(row) + "\n")

    # --- 3. reward server -----------------------------------------------------------
    stage(
        3,
        "reward server",
        f"""
        reward-server --model {rm_dir} on 127.0.0.1: it tokenizes every text with the
        reward model's own WordPiece tokenizer and batches requests dynamically.
    """,
        started,
    )
    with running_server(
        rm_dir, "--max-wait-ms", "2", env=ONE_THREAD, log_path=out / "reward_server.log"
    ) as server:
        print(f"    serving at {server.url} (log: {out / 'reward_server.log'})")
        before = sample_and_score(policy_dir, server.url, args.seed)
        print_samples("samples BEFORE PPO (score from the reward server):", before)

        # --- 4. PPO -----------------------------------------------------------------
        stage(
            4,
            "PPO",
            """
            ppo-client train: sample from the policy, decode to text, POST /score, then
            KL-penalised rewards, GAE, clipped policy and value losses (TRL's PPO maths).
        """,
            started,
        )
        ppo_out = out / "ppo"
        if ppo_out.exists():
            shutil.rmtree(ppo_out)
        config_path = out / "ppo.yaml"
        config_path.write_text(
            "\n".join(
                f"{k}: {json.dumps(v)}"
                for k, v in ppo_config(out, server.url, sizes, args.seed).items()
            )
            + "\n"
        )
        try:
            code = run_trainer(config_path)
        except KeyboardInterrupt:
            # The trainer is stopped (run_trainer); the server goes second: a trainer
            # that outlived it would only wait for it.
            report_stop("reward server", server.proc, server.stop())
            raise
        if code != 0:
            print(f"ppo-client train failed (exit {code})", file=sys.stderr)
            return code
        after = sample_and_score(ppo_out, server.url, args.seed)
        print_samples("samples AFTER PPO:", after)

    for name in ("metrics.jsonl", "samples.jsonl", "reward_curve.png"):
        shutil.copy2(ppo_out / name, out / name)
    rows = read_metrics(out / "metrics.jsonl")
    k = max(1, len(rows) // 5)
    first = mean(r["objective/scores"] for r in rows[:k])
    last = mean(r["objective/scores"] for r in rows[-k:])
    print("\n=== summary ===")
    print(f"    reward model held-out accuracy : {accuracy:.1%}")
    print(f"    PPO steps                      : {len(rows)}")
    print(f"    mean score, first {k} steps     : {first:+.3f}")
    print(f"    mean score, last {k} steps      : {last:+.3f}")
    print(f"    final KL to the reference      : {rows[-1]['objective/kl']:.3f}")
    print(f"    files: {out}/metrics.jsonl, samples.jsonl, reward_curve.png")
    print(f"    wall time: {time.monotonic() - started:.0f} s")
    if last <= first:
        print("    the score did not rise: see runs/demo/metrics.jsonl", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as exc:
        # The trainer, then the server, were stopped while unwinding (run_trainer, the PPO
        # stage, running_server's exit): nothing is left running. 130 for SIGINT, 143 for
        # SIGTERM, as a shell reports a job ended by that signal.
        print("\ninterrupted: the trainer and the reward server were stopped", file=sys.stderr)
        sys.exit(128 + (exc.signum if isinstance(exc, Stopped) else signal.SIGINT))
