"""Render benchmark results as Markdown tables and put them into BENCHMARKS.md."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

BEGIN = "<!-- bench:results:begin (written by `make bench`; edit outside these markers) -->"
END = "<!-- bench:results:end -->"
#: The engine part's own block, inside the results block (``--only engines`` rewrites it alone).
ENGINES_BEGIN = "<!-- bench:engines:begin -->"
ENGINES_END = "<!-- bench:engines:end -->"


def fmt(value: Any, digits: int = 1) -> str:
    """``{"median", "min", "max"}`` -> ``"12.3 (11.0–13.1)"``; a number -> ``"12.3"``."""
    if isinstance(value, dict):
        med = value.get("median", math.nan)
        lo, hi = value.get("min", math.nan), value.get("max", math.nan)
        if med != med:  # NaN
            return "–"
        if value.get("n", 2) <= 1 or (lo == hi):
            return f"{med:.{digits}f}"
        return f"{med:.{digits}f} ({lo:.{digits}f}–{hi:.{digits}f})"
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def render(results: dict[str, Any]) -> str:
    """All tables of one run as Markdown."""
    out: list[str] = []
    meta = results["meta"]
    m = meta["machine"]
    v = meta["versions"]
    out.append(f"### Run of {meta['date']}\n")
    out.append(
        _table(
            ["run", "value"],
            [
                ["command", f"`{meta['command']}`"],
                ["machine", f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {m['os']}"],
                [
                    "load average (1/5/15 min)",
                    f"start {' / '.join(map(str, m['load_average']))}; "
                    f"end {' / '.join(map(str, meta['load_average_end']))}",
                ],
                [
                    "versions",
                    ", ".join(f"{k} {val}" for k, val in v.items() if k != "git")
                    + f"; python {m['python']}; commit {v.get('git', '?')}",
                ],
                ["threads", meta["threads"]],
                ["wall time", f"{meta['wall_s'] / 60:.1f} min"],
            ],
        )
    )
    tp = results.get("throughput")
    if tp:
        out.append(_throughput(tp))
    ppo = results.get("ppo")
    if ppo:
        out.append(_ppo(ppo))
    targets = [*(tp or {}).get("targets", []), *(ppo or {}).get("targets", [])]
    if targets:
        out.append("#### Targets\n")
        out.append(_targets(targets))
    if results.get("engines"):
        out.append(f"{ENGINES_BEGIN}\n\n{render_engines(results).strip()}\n\n{ENGINES_END}")
    return "\n\n".join(out) + "\n"


def _targets(targets: list[dict[str, Any]]) -> str:
    return _table(
        ["target", "measured: median (min–max over rounds)", "goal", "holds"],
        [
            [
                t["name"],
                fmt(t["value"], 2),
                f"{t['op']} {t['threshold']}",
                "yes" if t["holds"] else "**no**",
            ]
            for t in targets
        ],
    )


def render_engines(results: dict[str, Any], *, with_meta: bool = False) -> str:
    """The engine comparison and the trainer pattern as Markdown (``with_meta``: with the
    run's date, command, load and wall time, for a run of this part alone)."""
    out: list[str] = []
    eng, trainer = results["engines"], results.get("trainer_pattern")
    if with_meta:
        meta = results["meta"]
        m = meta["machine"]
        out.append(
            f"### Engines: run of {meta['date']}\n\n`{meta['command']}` on {m['cpu']}, "
            f"{m['cores']} cores; load average (1/5/15 min) at the start "
            f"{' / '.join(map(str, m['load_average']))}, at the end "
            f"{' / '.join(map(str, meta['load_average_end']))}; commit "
            f"{meta['versions'].get('git', '?')}; {meta['wall_s'] / 60:.1f} min."
        )
    out.append(_engines(eng))
    if trainer:
        out.append(_trainer(trainer))
    targets = [*eng.get("targets", []), *(trainer or {}).get("targets", [])]
    if targets:
        out.append("#### Engine targets\n")
        out.append(_targets(targets))
    return "\n\n".join(out) + "\n"


def _engines(eng: dict[str, Any]) -> str:
    cfg, texts, model = eng["config"], eng["texts"], eng["model"]
    params = model.get("parameters")
    grpo, distinct = texts.get("grpo", {}), texts.get("distinct", {})
    send = "one call per batch" if cfg["grpo_send"] == "batch" else "one call per group"
    parts = [
        f"#### Engines: transformers vs vLLM ({model.get('architecture', '?')}"
        + (f", {params / 1e6:.0f}M parameters" if params else "")
        + ", random weights)\n\n"
        f"Through the real server and `RewardClient`, {cfg['rounds']} round(s), fresh texts each "
        f"round. GRPO: {cfg['groups']} groups × {cfg['group_size']} completions sharing a "
        f"{cfg['prompt_tokens']}-token prompt ({grpo.get('mean_tokens', math.nan):.0f} tokens "
        f"per text on average), {send}. Distinct: {cfg['distinct_texts']} texts of "
        f"{distinct.get('min_tokens', '?')}–{distinct.get('max_tokens', '?')} tokens (mean "
        f"{distinct.get('mean_tokens', math.nan):.0f}), one call. Server flags: "
        f"`{' '.join(cfg['server_args']) or '(defaults)'}`; vLLM servers also "
        f"`{' '.join(cfg['vllm_args']) or '(nothing)'}`"
        + (
            f" and `VLLM_CPU_NUM_OF_RESERVED_CPU={cfg['vllm_reserved_cpus']}`."
            if cfg.get("vllm_reserved_cpus") is not None
            else " (vLLM's default CPU reservation)."
        )
    ]
    rows = []
    for dtype, variants in eng["texts_per_s"].items():
        for variant, by_w in variants.items():
            ratio = {w: eng["ratios"].get(f"{w} {dtype} {variant}/transformers") for w in by_w}
            rows.append(
                [
                    dtype,
                    variant,
                    fmt(by_w.get("grpo")),
                    fmt(ratio.get("grpo"), 2) if ratio.get("grpo") else "1",
                    fmt(by_w.get("distinct")),
                    fmt(ratio.get("distinct"), 2) if ratio.get("distinct") else "1",
                ]
            )
    parts.append(
        _table(
            ["dtype", "engine", "GRPO texts/s", "GRPO / transformers", "distinct texts/s",
             "distinct / transformers"],
            rows,
        )
    )  # fmt: skip
    cost = eng.get("bf16_cost") or {}
    if cost:
        parts.append(
            "What bfloat16 costs in score precision (the same texts scored in float32 and "
            "bfloat16 by the same engine; relative to the standard deviation of the float32 "
            "scores):\n"
        )
        parts.append(
            _table(
                ["engine", "texts", "max abs diff", "mean abs diff", "score std (fp32)",
                 "max / std", "mean / std"],
                [
                    [name, str(c["n"]), f"{c['max_abs']:.3g}", f"{c['mean_abs']:.3g}",
                     f"{c['score_std']:.3g}", f"{c['max_rel_std']:.3g}", f"{c['mean_rel_std']:.3g}"]
                    for name, c in cost.items()
                ],
            )
        )  # fmt: skip
    gap = eng.get("engine_gap") or {}
    if gap:
        parts.append(
            "Largest score difference from the transformers engine on the same texts and "
            "dtype: " + ", ".join(f"{k} {v:.2g}" for k, v in gap.items()) + "."
        )
    return "\n\n".join(parts)


def _trainer(tr: dict[str, Any]) -> str:
    cfg = tr["config"]
    rows = [
        [name, fmt(val), fmt(tr["ratios"].get(f"{name} / L{cfg['chunk']}"), 2) if name != f"L{cfg['chunk']}" else "1"]
        for name, val in tr["texts_per_s"].items()
    ]  # fmt: skip
    return "\n\n".join(
        [
            f"#### The trainer's pattern (transformers engine)\n\n"
            f"{tr['text_tokens']['n']} texts of the plain mix (mean "
            f"{tr['text_tokens']['mean']:.0f} tokens) in chunks of {cfg['chunk']}, "
            f"{cfg['rounds']} round(s). L{cfg['chunk']}: each chunk tokenized, sorted and scored "
            f"in process in batches of {tr['best_batch_size']} (best of "
            f"{', '.join(tr['sweep'])}); the server: one `RewardClient` sending the chunks back "
            "to back, the same texts in one request, and two clients sending every other chunk.",
            _table(["pattern", "texts/s", f"/ L{cfg['chunk']}"], rows),
        ]
    )


def _throughput(tp: dict[str, Any]) -> str:
    parts: list[str] = []
    cfg = tp["config"]
    tok = tp["text_tokens"]
    model = tp["model"]
    parts.append(
        f"#### Throughput and latency: {model.get('architecture', '?')} "
        f"({model.get('dtype', '?')}, {model.get('device', '?')})\n\n"
        f"{tok['n']} seeded texts of {tok['min']}–{tok['max']} tokens (mean {tok['mean']:.0f}), "
        f"uniform; {cfg['repeats']} rounds. Each load run measures a window of "
        f"max({cfg['duration_s']:.0f} s, {cfg['window_rounds']} × clients × texts per request "
        f"/ L's rate) (at most {cfg['max_duration_s']:.0f} s) after a warm-up of at least "
        f"{cfg['warmup_s']:.0f} s in which every client got an answer. S and N texts/s are the "
        "texts each server's model finished in the window, read from its own counters; "
        "latency is over the requests answered in it. Padding efficiency is "
        "the mean over forward passes of real / padded tokens. "
        f"Server flags: `{' '.join(cfg['server_args']) or '(defaults)'}`; batching limits "
        f"max_batch_tokens {model.get('max_batch_tokens')}, max_batch_size "
        f"{model.get('max_batch_size')}, max_wait_ms {model.get('max_wait_ms')}."
    )
    ip = tp["inprocess"]
    parts.append(
        f"**L sweep** (the first {cfg.get('sweep_texts', tok['n'])} texts, length-sorted, best of "
        "2 passes per batch size):\n"
    )
    parts.append(
        _table(
            ["batch size", "texts/s", "padding efficiency"],
            [
                [
                    str(r["batch_size"])
                    + (" (best)" if r["batch_size"] == ip["best_batch_size"] else ""),
                    fmt(r["texts_per_s"]),
                    fmt(r["padding_efficiency"], 2),
                ]
                for r in ip["sweep"]
            ],
        )
    )
    parts.append(
        f"L at batch size {ip['best_batch_size']}: **{fmt(ip['texts_per_s'])} texts/s**, "
        f"padding efficiency {fmt(ip['padding_efficiency'], 2)}; one text alone: "
        f"p50 {fmt(ip['single_text_ms']['p50'], 1)} ms, p99 {fmt(ip['single_text_ms']['p99'], 1)} ms."
    )
    if tp.get("batching_gain_bound"):
        parts.append(
            "What batching can win on this machine at all (L at its best batch size over L at "
            f"batch size 1, same sweep): **{tp['batching_gain_bound']:.2f}×**."
        )
    cost, shapes = tp.get("pass_cost"), tp.get("inprocess_16_windows")
    if cost and shapes:
        parts.append(
            f"A forward pass costs {cost['overhead_ms']:.1f} ms + {cost['per_token_ms']:.3f} ms "
            f"per padded token (the batcher's Theil-Sen fit over the sweep's passes), so one "
            f"pass is worth {cost['overhead_tokens']:.0f} padded tokens. The server's batching "
            "without HTTP (texts in arrival order, 16 at a time, each window cut by the "
            f"batcher's rule): {fmt(shapes['texts_per_s'])} texts/s, padding efficiency "
            f"{fmt(shapes['padding_efficiency'], 2)}, {shapes['mean_batch_rows']:.1f} rows per "
            f"pass; over L at batch size 1 that bounds S/N at 16 × 1 by "
            f"**{tp['s_over_n_16x1_bound']:.2f}**."
        )
    naive = {(r["clients"], r["per_request"]): r for r in tp["naive"]}
    rows = []
    for s in tp["server"]:
        key = (s["clients"], s["per_request"])
        n = naive.get(key, {})
        ck = f"{key[0]}x{key[1]}"
        rows.append(
            [
                f"{key[0]} × {key[1]}",
                fmt(s.get("texts_per_s")),
                fmt(n.get("texts_per_s")),
                fmt(tp["ratios"].get(f"S/L {ck}"), 2),
                fmt(tp["ratios"].get(f"S/N {ck}"), 2),
                fmt(s.get("p50_ms"), 0),
                fmt(s.get("p99_ms"), 0),
                fmt(n.get("p50_ms"), 0),
                fmt(n.get("p99_ms"), 0),
                fmt(s.get("padding_efficiency"), 2),
                fmt(n.get("padding_efficiency"), 2),
                fmt(s.get("mean_batch_rows"), 1),
                fmt(s.get("busy_frac"), 2),
            ]
        )
    parts.append("**S (reward server) and N (naive server)** under closed-loop clients:\n")
    parts.append(
        _table(
            [
                "clients × texts/request",
                "S texts/s",
                "N texts/s",
                "S/L",
                "S/N",
                "S p50 ms",
                "S p99 ms",
                "N p50 ms",
                "N p99 ms",
                "S padding eff.",
                "N padding eff.",
                "S rows/batch",
                "S model busy",
            ],
            rows,
        )
    )
    failed = sum(r.get("failed", 0) for r in [*tp["server"], *tp["naive"]])
    parts.append(
        f"Single text at 1 client: S p50 minus L's time for the same text, median over "
        f"requests: **{fmt(tp['latency_overhead_ms'], 1)} ms** (S p50 − L p50 over the same "
        f"texts: {fmt(tp['p50_minus_l_p50_ms'], 1)} ms). Failed requests in all windows: "
        f"{failed}."
    )
    return "\n\n".join(parts)


def _ppo(ppo: dict[str, Any]) -> str:
    cfg = ppo["config"]
    parts = [
        "#### PPO step time\n\n"
        f"Tiny GPT-2 policy, MiniLM reward model, batch "
        f"{cfg['per_device_train_batch_size'] * cfg['num_mini_batches']} "
        f"(rollout chunks of {cfg['rollout_chunk']}), response length "
        f"{cfg['response_length']}, {cfg['num_ppo_epochs']} PPO epochs; "
        f"{cfg['rounds']} rounds × {cfg['steps']} steps per variant after "
        f"{cfg['warmup_steps']} warm-up step(s); same seed, max gap between variants' mean "
        f"scores {ppo['score_gap']:.1e}."
    ]
    defaults = ppo.get("defaults")
    if defaults:
        parts[0] += (
            " The trainer's default (`overlap_reward` unset): "
            + ", ".join(f"{where} → {name.split('/')[1]}" for where, name in defaults.items())
            + "."
        )
    parts.append(
        _table(
            ["variant", "step s", "reward wait s (not hidden)"],
            [
                [name, fmt(val, 3), fmt(ppo["reward_wait_s"].get(name), 3)]
                for name, val in ppo["step_s"].items()
            ],
        )
    )
    parts.append(
        _table(
            ["ratio (paired steps)", "median (min–max)"],
            [[name, fmt(val, 3)] for name, val in ppo["ratios"].items()],
        )
    )
    return "\n\n".join(parts)


def update_block(path: Path, name: str, section: str, heading: str) -> None:
    """Replace only the ``<!-- bench:NAME:begin -->`` block of ``path`` (a new one goes at
    the end of the page under ``heading``). Markers count only as whole lines."""
    begin, end = f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"
    block = f"{begin}\n\n{section.strip()}\n\n{end}"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    pattern = re.compile(
        "^" + re.escape(begin) + r"$.*?^" + re.escape(end) + "$", re.DOTALL | re.MULTILINE
    )
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip() + f"\n\n## {heading}\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")


def update_engines_block(path: Path, section: str) -> None:
    """Replace only the engine block of ``path`` (added at the end of the results block, or
    of the page, when there is none yet)."""
    block = f"{ENGINES_BEGIN}\n\n{section.strip()}\n\n{ENGINES_END}"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    # The markers count only as whole lines: prose may quote them (BENCHMARKS.md does).
    pattern = re.compile(
        "^" + re.escape(ENGINES_BEGIN) + r"$.*?^" + re.escape(ENGINES_END) + "$",
        re.DOTALL | re.MULTILINE,
    )
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    elif END in text:
        text = text.replace(END, f"{block}\n\n{END}")
    else:
        text = text.rstrip() + "\n\n## Engines\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")


def update_markdown(path: Path, section: str) -> None:
    """Replace the generated section of ``path`` (between the markers), creating it if needed."""
    block = f"{BEGIN}\n\n{section.strip()}\n\n{END}"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(BEGIN) + r".*?" + re.escape(END), re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip() + "\n\n## Latest results\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")
