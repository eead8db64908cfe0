"""A reasoning policy's thinking, stripped or kept (issue 48, acceptance 7): items per second
of a reward model and of a judge on responses that are a ~2,000-token ``<think>`` trace and
a ~100-token answer, with ``reasoning: strip`` (the default: the thinking removed before
rendering and tokenizing) against ``reasoning: keep`` (all of it scored).

Two real servers, each started once with two entries of one model (``strip`` and ``keep``):

- **reward**: a random Llama-style reward model (``LlamaForSequenceClassification``, hidden
  256 and 4 layers by default, 4,096 positions). Not MiniLM, as the other parts use: its
  512-token limit would cut a kept 2,100-token response to its last 512 tokens, so ``keep``
  would be measured on a quarter of what it scores on a model that reads it all;
- **judge**: a random Llama-style causal LM of the same size in ``mode: logprobs`` ("Yes"
  and "No" as score tokens), the template of ``bench/judges.py``.

Both share one byte-level BPE tokenizer trained on the benchmark's words, and the items'
token counts are that tokenizer's (the thinking block with its tags, the answer apart; the
real counts are in the results). Each round builds fresh conversations (a question, then the
response) and sends them as one ``/score`` request to each (server, entry), in turns
(rotated each round) so that a drift of the machine's load hits them alike; the score
cache is off. Figures: items/s per (model, entry) and the strip/keep ratio paired by round
(median, min and max over rounds), the tokens each item was scored on (the answer's
``tokens``), and a check that a stripped response scores as its bare answer. Run it with
``python -m bench.run --only reasoning`` (its own block of ``BENCHMARKS.md``) or
``python -m bench.reasoning``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from bench.common import machine_info, model_server_env, report_part, start_part, summary

logger = logging.getLogger(__name__)

TEMPLATE = (
    "Question: {{ prompt }}\nAnswer: {{ response }}\nIs the answer correct? Reply Yes or No.\n"
)
MODELS = ("reward", "judge")
MODES = ("strip", "keep")
OPEN, CLOSE = "<think>", "</think>"


@dataclass
class ReasoningBenchConfig:
    """What the reasoning benchmark measures."""

    items: int = 16  # conversations per request (one request per entry and round)
    rounds: int = 7
    thinking_tokens: int = 2000  # the thinking block, tags included
    answer_tokens: int = 100
    hidden: int = 256
    layers: int = 4
    max_positions: int = 4096
    vocab_size: int = 2048
    threads: int = os.cpu_count() or 1
    start_timeout: float = 300.0
    seed: int = 0


def quick_config(**given: Any) -> ReasoningBenchConfig:
    """A smoke test of the code (seconds, not figures): 2 items of a 120-token trace and a
    20-token answer, one round, a one-layer model of one 64-wide head."""
    small = {"items": 2, "rounds": 1, "thinking_tokens": 120, "answer_tokens": 20}
    small |= {"hidden": 64, "layers": 1, "max_positions": 512, "vocab_size": 600}
    return replace(ReasoningBenchConfig(), **{**small, **given})


def _tokenizer(cfg: ReasoningBenchConfig) -> Any:
    """The byte-level BPE both models share: chat markup, "Yes" and "No" single tokens."""
    import tiny_models
    from bench.models import make_prompts

    tok = tiny_models.byte_bpe_tokenizer(
        make_prompts(4000, seed=cfg.seed + 3, min_words=4, max_words=40),
        cfg.vocab_size,
        eos="</s>",
        bos="<s>",
        extra_special=tiny_models.CHAT_SPECIAL_TOKENS,
        chat_template=tiny_models.POLICY_CHAT_TEMPLATE,
        model_max_length=cfg.max_positions,
    )
    tok.add_tokens(["Yes", "No"])
    return tok


def save_models(folder: Path, cfg: ReasoningBenchConfig) -> dict[str, dict[str, Any]]:
    """The reward model and the judge (random Llama-style, 64-wide heads) in ``folder``."""
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        LlamaConfig,
    )

    import tiny_models

    tok = _tokenizer(cfg)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=cfg.hidden, intermediate_size=2 * cfg.hidden,
        num_hidden_layers=cfg.layers, num_attention_heads=max(1, cfg.hidden // 64),
        num_key_value_heads=max(1, cfg.hidden // 128), max_position_embeddings=cfg.max_positions,
        tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, num_labels=1,
    )  # fmt: skip
    built: dict[str, dict[str, Any]] = {}
    for name, auto in (
        ("reward", AutoModelForSequenceClassification),
        ("judge", AutoModelForCausalLM),
    ):
        torch.manual_seed(cfg.seed)
        model = auto.from_config(config)
        if name == "reward":  # scores of O(1), as bench/models.py's Llama reward model
            gen = torch.Generator().manual_seed(cfg.seed + 1)
            with torch.no_grad():
                head = model.score.weight
                head.copy_(torch.randn(head.shape, generator=gen) / cfg.hidden**0.5)
        path = tiny_models.save(folder / name, model, tok)
        built[name] = {
            "path": str(path),
            "architecture": type(model).__name__,
            "parameters": sum(p.numel() for p in model.parameters()),
        }
    return built


class _Writer:
    """Seeded words of the benchmark's vocabulary fitted to a number of tokens."""

    def __init__(self, tokenizer: Any) -> None:
        from bench.models import words

        self.tok = tokenizer
        self.vocab = words()
        pieces = tokenizer([" " + w for w in self.vocab], add_special_tokens=False)["input_ids"]
        self.cost = {w: len(ids) for w, ids in zip(self.vocab, pieces, strict=True)}
        self.filler = next(w for w in self.vocab if self.cost[w] == 1)

    def count(self, text: str) -> int:
        return len(self.tok(text, add_special_tokens=False)["input_ids"])

    def fit(self, rng: random.Random, target: int, before: str = "", after: str = "") -> str:
        """``before`` + words + ``after``, ``target`` tokens in all (as near as words allow)."""
        chosen: list[str] = []
        used = self.count(before + after)
        while used < target:
            chosen.append(rng.choice(self.vocab))
            used += self.cost[chosen[-1]]
        for _ in range(32):  # the estimate is near: a few words more or fewer
            got = self.count(before + " ".join(chosen) + after)
            if got == target:
                break
            if got > target and len(chosen) > 1:
                chosen.pop()
            else:
                chosen.append(self.filler)
        return before + " ".join(chosen) + after


def make_items(writer: _Writer, cfg: ReasoningBenchConfig, seed: int) -> dict[str, Any]:
    """``cfg.items`` conversations (a question, then a thinking block and an answer), with
    each part's token count."""
    rng = random.Random(seed)
    conversations: list[list[dict[str, str]]] = []
    answers: list[str] = []
    counts: dict[str, list[int]] = {"question": [], "thinking": [], "answer": []}
    for _ in range(cfg.items):
        question = f"What is {rng.randint(10, 999)} times {rng.randint(10, 999)}? Explain."
        thinking = writer.fit(rng, cfg.thinking_tokens, f"{OPEN}\n", f"\n{CLOSE}\n\n")
        answer = writer.fit(rng, cfg.answer_tokens)
        conversations.append(
            [
                {"role": "user", "content": question},
                {"role": "assistant", "content": thinking + answer},
            ]
        )
        answers.append(answer)
        for key, text in (("question", question), ("thinking", thinking), ("answer", answer)):
            counts[key].append(writer.count(text))
    return {"conversations": conversations, "answers": answers, "counts": counts}


def _models_file(model: str, built: dict[str, Any], path: Path) -> Path:
    import yaml

    entries = []
    for mode in MODES:
        entry: dict[str, Any] = {"name": f"{model}-{mode}", "model": built["path"]}
        entry["reasoning"] = mode
        if model == "judge":
            entry |= {"kind": "judge", "template": TEMPLATE}
            entry["score_tokens"] = {"Yes": 1.0, "No": 0.0}
        entries.append(entry)
    path.write_text(yaml.safe_dump({"models": entries}), encoding="utf-8")
    return path


@contextlib.contextmanager
def _servers(
    cfg: ReasoningBenchConfig, built: dict[str, dict[str, Any]], tmp: Path
) -> Iterator[dict[str, str]]:
    """One real server per model (both entries), started one after the other; their URLs."""
    from reward_server.launcher import running_server

    env = model_server_env(cfg.threads)
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}
        for model in MODELS:
            path = _models_file(model, built[model], tmp / f"{model}.yaml")
            began = time.perf_counter()
            server = stack.enter_context(
                running_server(
                    None, "--models", str(path), "--max-wait-ms", "1", env=env,
                    timeout=cfg.start_timeout,
                )
            )  # fmt: skip
            urls[model] = server.url
            logger.info("reasoning: %s server ready in %.0f s", model, time.perf_counter() - began)
        yield urls


def _score(url: str, entry: str, conversations: list[Any]) -> dict[str, Any]:
    r = httpx.post(
        f"{url}/score", json={"conversations": conversations, "model": entry}, timeout=3600
    )
    if r.status_code != 200:
        raise RuntimeError(f"/score of {entry} answered {r.status_code}: {r.text[:500]}")
    return dict(r.json())


def _strip_check(url: str, model: str, conversation: list[dict[str, str]], answer: str) -> bool:
    """Whether the strip entry scores a response as its bare answer (score and tokens)."""
    full = _score(url, f"{model}-strip", [conversation])
    bare = _score(
        url, f"{model}-strip", [[conversation[0], {**conversation[1], "content": answer}]]
    )
    same_score = abs(float(full["scores"][0]) - float(bare["scores"][0])) <= 1e-5
    return same_score and full["tokens"] == bare["tokens"]


def run_reasoning_bench(cfg: ReasoningBenchConfig) -> dict[str, Any]:
    """Items/s of each (model, reasoning) entry, the strip/keep ratios, tokens per item."""
    from transformers import AutoTokenizer

    load_before = [round(x, 2) for x in os.getloadavg()]
    keys = [(m, mode) for m in MODELS for mode in MODES]
    seconds: dict[str, list[float]] = {f"{m}/{mode}": [] for m, mode in keys}
    tokens: dict[str, list[int]] = {f"{m}/{mode}": [] for m, mode in keys}
    truncated: dict[str, int] = dict.fromkeys(seconds, 0)
    counts: dict[str, list[int]] = {"question": [], "thinking": [], "answer": []}
    loads: list[float] = []
    checks: dict[str, bool] = {}
    with tempfile.TemporaryDirectory(prefix="bench-reasoning-") as tmp:
        built = save_models(Path(tmp), cfg)
        writer = _Writer(AutoTokenizer.from_pretrained(built["reward"]["path"]))
        with _servers(cfg, built, Path(tmp)) as urls:
            warm = make_items(writer, replace(cfg, items=2), cfg.seed - 1)
            for model, mode in keys:  # warm each entry; check strip against the bare answer
                _score(urls[model], f"{model}-{mode}", warm["conversations"])
            for model in MODELS:
                first, answer = warm["conversations"][0], warm["answers"][0]
                checks[model] = _strip_check(urls[model], model, first, answer)
            for r in range(cfg.rounds):
                body = make_items(writer, cfg, cfg.seed + r)
                for key, values in body["counts"].items():
                    counts[key] += values
                turn = keys[r % len(keys) :] + keys[: r % len(keys)]
                for model, mode in turn:
                    began = time.perf_counter()
                    data = _score(urls[model], f"{model}-{mode}", body["conversations"])
                    seconds[f"{model}/{mode}"].append(time.perf_counter() - began)
                    tokens[f"{model}/{mode}"] += data["tokens"]
                    truncated[f"{model}/{mode}"] += sum(bool(t) for t in data["truncated"])
                loads.append(round(os.getloadavg()[0], 2))
                logger.info("reasoning: round %d/%d done (load %.2f)", r + 1, cfg.rounds, loads[-1])
    return _assemble(cfg, built, seconds, tokens, truncated, counts, checks, load_before, loads)


def _assemble(
    cfg: ReasoningBenchConfig,
    built: dict[str, dict[str, Any]],
    seconds: dict[str, list[float]],
    tokens: dict[str, list[int]],
    truncated: dict[str, int],
    counts: dict[str, list[int]],
    checks: dict[str, bool],
    load_before: list[float],
    loads: list[float],
) -> dict[str, Any]:
    figures = {
        key: {
            "items_per_s": summary(cfg.items / s for s in values),
            "tokens_per_item": summary(tokens[key]),
            "truncated_items": truncated[key],
        }
        for key, values in seconds.items()
    }
    ratios = {
        model: summary(
            keep / strip
            for strip, keep in zip(seconds[f"{model}/strip"], seconds[f"{model}/keep"], strict=True)
        )
        for model in MODELS
    }  # strip's items/s over keep's, round by round: keep's seconds over strip's
    models = {name: {k: v for k, v in info.items() if k != "path"} for name, info in built.items()}
    return {
        "config": asdict(cfg),
        "machine": machine_info(),
        "models": models,
        "item_tokens": {key: summary(values) for key, values in counts.items()},
        "figures": figures,
        "strip_over_keep": ratios,
        "tokens_keep_over_strip": {
            model: statistics.median(tokens[f"{model}/keep"])
            / statistics.median(tokens[f"{model}/strip"])
            for model in MODELS
        },
        "strip_scores_as_answer": checks,
        "load_average_before": load_before,
        "load_average_by_round": loads,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }


def render(result: dict[str, Any]) -> str:
    """The figures as a Markdown table."""
    cfg, machine, items = result["config"], result["machine"], result["item_tokens"]
    params = {m: result["models"][m]["parameters"] / 1e6 for m in MODELS}
    loads = result["load_average_by_round"]
    lines = [
        f"Responses: a thinking block of {items['thinking']['median']:.0f} tokens (tags "
        f"included) and an answer of {items['answer']['median']:.0f} tokens, after a "
        f"{items['question']['median']:.0f}-token question (medians, the models' tokenizer). "
        f"Reward model: random Llama (hidden {cfg['hidden']}, {cfg['layers']} layers, "
        f"{params['reward']:.1f}M parameters, {cfg['max_positions']} positions); judge: the "
        f"same as a causal LM in logprobs mode ({params['judge']:.1f}M parameters). "
        f"{cfg['items']} conversations per request, {cfg['rounds']} round(s) in turns, score "
        f"cache off, {cfg['threads']} math thread(s) per server, {machine['cpu']} "
        f"({machine['cores']} cores); load average {result['load_average_before'][0]:.2f} "
        f"before, {min(loads):.2f}-{max(loads):.2f} during, "
        f"{result['load_average_after'][0]:.2f} after",
        "",
        "| model | reasoning | tokens scored per item | items/s (median) | min-max "
        "| strip/keep (per round) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for model in MODELS:
        ratio = result["strip_over_keep"][model]
        for mode in MODES:
            fig = result["figures"][f"{model}/{mode}"]
            rate, toks = fig["items_per_s"], fig["tokens_per_item"]["median"]
            cell = (
                f"{ratio['median']:.1f}x ({ratio['min']:.1f}-{ratio['max']:.1f})"
                if mode == "strip"
                else ""
            )
            lines.append(
                f"| {model} | {mode} | {toks:.0f} | {rate['median']:.2f} | "
                f"{rate['min']:.2f}-{rate['max']:.2f} | {cell} |"
            )
    checks, more = result["strip_scores_as_answer"], result["tokens_keep_over_strip"]
    lines += [
        "",
        "Tokens scored, keep over strip: "
        + ", ".join(f"{m} {more[m]:.1f}x" for m in MODELS)
        + ". A stripped response scores as its bare answer (score within 1e-5, same tokens): "
        + ", ".join(f"{m} {'yes' if checks[m] else '**no**'}" for m in MODELS)
        + "; items truncated: "
        + ", ".join(f"{k} {fig['truncated_items']}" for k, fig in result["figures"].items()),
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    doc = (__doc__ or "").split("\n")[0]
    p = argparse.ArgumentParser(prog="python -m bench.reasoning", description=doc)
    p.add_argument("--items", type=int, help="conversations per request (default 16)")
    p.add_argument("--rounds", type=int, help="rounds, entries in turns (default 7)")
    p.add_argument("--thinking-tokens", type=int, help="the thinking block (default 2000)")
    p.add_argument("--answer-tokens", type=int, help="the answer (default 100)")
    p.add_argument("--quick", action="store_true", help="a smoke test (seconds, not figures)")
    p.add_argument("--json", type=Path, help="also write every figure to this file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start_part(logging.INFO)
    given = {
        "items": args.items,
        "rounds": args.rounds,
        "thinking_tokens": args.thinking_tokens,
        "answer_tokens": args.answer_tokens,
    }
    given = {k: v for k, v in given.items() if v is not None}
    cfg = quick_config(**given) if args.quick else replace(ReasoningBenchConfig(), **given)
    result = run_reasoning_bench(cfg)
    report_part(result, render(result), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
