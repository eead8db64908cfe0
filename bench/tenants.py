"""Two tenants on one server (issue 23, acceptance 1; issue 49, acceptance 1): does a tenant
that floods the server leave the other's latency alone, and what does fair scheduling cost in
throughput? For each kind of model (``--kind``): a reward model, a python verifier, a code
verifier, a remote component (:mod:`bench.tenant_kinds`).

One real ``reward-server`` (MiniLM on CPU, or the kind's models file) with a keys file of two
tenants, A and B, of equal weight (``--b-weight``: B's, a policy to compare) and no limits.
Every client is closed loop (its next request as soon as the answer comes) and sends
``per_request`` texts per ``/score``; A runs ``a_clients`` clients, B ``b_clients`` (10 to 1
by default: A sends ten times B's load). Phases, each a warm-up and
a measured window:

- **B alone**: B's clients only: B's latency with the server to itself;
- **A + B**: both tenants: B's latency while A floods, and the total items/s;
- **one tenant**: the same clients, all with A's key (one tenant, no fairness to keep):
  the throughput baseline, and B's client's latency as it would be without tenants;
- **A alone**: A's clients only (for reference).

Rounds repeat the phases in alternating order, so a drift of the machine's load hits them
alike; each figure is the median over rounds. Every text is sent once (a request number
leads it), so no cache answers anything. The targets: B's p50 and p99 with A
flooding at most 2x B's alone; items/s of A + B at least 0.9 of one tenant's.
``python -m bench.tenants --help``; ``python -m bench.run --only tenants``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.common import (
    NO_MATH_THREADS,
    machine_info,
    percentile,
    report_part,
    served_model,
    server_env,
    start_part,
    summary,
)
from bench.tenant_kinds import KINDS, Body, kind_server

logger = logging.getLogger(__name__)

#: Targets: B's latency with A flooding over B's alone (at most), and the items/s of both
#: tenants over one tenant's with the same clients (at least).
LATENCY_TARGET = 2.0
THROUGHPUT_TARGET = 0.9

#: The tenants' keys (made up for the run; the server sees only their SHA-256).
KEYS = {"A": "bench-tenant-a-key-3f9c2e71", "B": "bench-tenant-b-key-81d0a4c6"}

PHASES = ("B alone", "A + B", "one tenant", "A alone")


@dataclass
class TenantsBenchConfig:
    """What the tenants benchmark measures."""

    model_path: str = ""
    kind: str = "model"
    a_clients: int = 10
    b_clients: int = 1
    #: B's weight in the keys file (A's is 1).
    b_weight: float = 1.0
    per_request: int = 16
    n_texts: int = 256
    min_tokens: int = 16
    max_tokens: int = 128
    warmup_s: float = 3.0
    duration_s: float = 15.0
    rounds: int = 2
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    seed: int = 0
    server_args: tuple[str, ...] = ()


def quick_config(**given: Any) -> TenantsBenchConfig:
    """A smoke test of the code (seconds), not a measurement."""
    sizes: dict[str, Any] = {"a_clients": 3, "per_request": 4, "n_texts": 32}
    sizes.update(warmup_s=0.3, duration_s=1.0, rounds=1, max_tokens=48)
    return TenantsBenchConfig(**{**sizes, **given})


@dataclass(slots=True)
class _Record:
    who: str  # the client's tenant as the bench sees it (B's client stays "B" in one tenant)
    start: float
    end: float
    items: int
    ok: bool


def keys_file(path: Path, b_weight: float = 1.0) -> Path:
    """The keys file of tenants A (weight 1) and B (``b_weight``), no limits."""
    from reward_server.config.tenants import hash_key

    lines = ["tenants:"]
    for name, key in KEYS.items():
        weight = b_weight if name == "B" else 1.0
        lines += [
            f"  - name: {name}",
            f'    key_sha256: "{hash_key(key)}"',
            f"    weight: {weight:g}",
        ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


async def _phase(
    url: str,
    body: Body,
    clients: list[tuple[str, str]],
    cfg: TenantsBenchConfig,
    serial: list[int],
) -> tuple[list[_Record], float]:
    """Run ``clients`` (each: its name in the figures, the key it sends) closed loop for a
    warm-up (at least ``warmup_s`` and until every client has its answer) and a window (at
    least ``duration_s`` and until a request of every client ended in it); return the
    records of requests that ended in the window, and its length."""
    records: list[_Record] = []
    answered = [False] * len(clients)
    stop = False
    n = len(clients) + 2
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=600) as client:

        async def worker(i: int, who: str, key: str) -> None:
            headers = {"Authorization": f"Bearer {key}"}
            while not stop:
                k = serial[0]
                serial[0] += 1
                t0 = time.perf_counter()
                ok = False
                with contextlib.suppress(httpx.HTTPError):
                    r = await client.post("/score", json=body(k), headers=headers)
                    ok = r.status_code == 200
                    if not ok:
                        logger.warning("%s: /score answered %d: %s", who, r.status_code, r.text)
                records.append(_Record(who, t0, time.perf_counter(), cfg.per_request, ok))
                answered[i] = True

        tasks = [asyncio.create_task(worker(i, *c)) for i, c in enumerate(clients)]
        try:
            began = time.perf_counter()
            await asyncio.sleep(cfg.warmup_s)
            while not all(answered) and time.perf_counter() - began < 120:
                await asyncio.sleep(0.01)
            w0 = time.perf_counter()
            first = len(records)
            await asyncio.sleep(cfg.duration_s)
            while (
                sum(1 for r in records[first:] if r.ok) < len(clients)
                and time.perf_counter() - w0 < 120
            ):
                await asyncio.sleep(0.01)
            w1 = time.perf_counter()
        finally:
            stop = True
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    return [r for r in records if w0 <= r.end <= w1], w1 - w0


def _figures(records: list[_Record], window_s: float) -> dict[str, Any]:
    """Items/s of the phase and each client group's latency percentiles (ms)."""
    good = [r for r in records if r.ok]
    out: dict[str, Any] = {
        "items_per_s": sum(r.items for r in good) / window_s,
        "failed": sum(not r.ok for r in records),
    }
    for who in sorted({r.who for r in good}):
        lat = [(r.end - r.start) * 1000.0 for r in good if r.who == who]
        out[who] = {
            "requests": len(lat),
            "p50_ms": percentile(lat, 50),
            "p99_ms": percentile(lat, 99),
        }
    return out


def _clients(phase: str, cfg: TenantsBenchConfig) -> list[tuple[str, str]]:
    a = [("A", KEYS["A"])] * cfg.a_clients
    b = [("B", KEYS["B"])] * cfg.b_clients
    if phase == "B alone":
        return b
    if phase == "A alone":
        return a
    if phase == "one tenant":
        return a + [("B", KEYS["A"])] * cfg.b_clients  # B's clients, A's key
    return a + b


def run_tenants_bench(cfg: TenantsBenchConfig) -> dict[str, Any]:
    """Every phase on one real server, ``cfg.rounds`` times; figures and targets."""
    if cfg.kind not in KINDS:
        raise ValueError(f"unknown kind {cfg.kind!r}; one of {', '.join(KINDS)}")
    model = None
    env = server_env(cfg.threads)
    if cfg.kind == "model":
        from transformers import AutoTokenizer

        from bench.models import make_texts

        tokenizer = AutoTokenizer.from_pretrained(cfg.model_path)
        texts, _ = make_texts(
            tokenizer,
            cfg.n_texts,
            min_tokens=cfg.min_tokens,
            max_tokens=cfg.max_tokens,
            seed=cfg.seed,
        )
        model = (cfg.model_path, texts)
    else:
        env = dict(NO_MATH_THREADS)  # no model: the server's threads stay free
    runs: dict[str, list[dict[str, Any]]] = {p: [] for p in PHASES}
    serial = [0]
    with tempfile.TemporaryDirectory(prefix="bench-tenants-") as tmp:
        keys = keys_file(Path(tmp) / "keys.yaml", cfg.b_weight)
        args = ("--api-keys", str(keys), *cfg.server_args)
        served = kind_server(cfg.kind, Path(tmp), args, env, cfg.per_request, model)
        with served as (server, body):
            for r in range(cfg.rounds):
                order = PHASES if r % 2 == 0 else tuple(reversed(PHASES))
                for phase in order:
                    records, window_s = asyncio.run(
                        _phase(server.url, body, _clients(phase, cfg), cfg, serial)
                    )
                    runs[phase].append(_figures(records, window_s))
                    logger.info("round %d/%d, %s: %s", r + 1, cfg.rounds, phase, runs[phase][-1])
    return _assemble(cfg, runs)


def _assemble(cfg: TenantsBenchConfig, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Medians over rounds, the ratios per round and the targets."""
    rounds = range(cfg.rounds)

    def per_round(phase: str, who: str, key: str) -> list[float]:
        return [runs[phase][i].get(who, {}).get(key, float("nan")) for i in rounds]

    def ratio(num: list[float], den: list[float]) -> dict[str, float]:
        return summary(a / b for a, b in zip(num, den, strict=True) if b > 0)

    alone = {k: per_round("B alone", "B", k) for k in ("p50_ms", "p99_ms")}
    flooded = {k: per_round("A + B", "B", k) for k in ("p50_ms", "p99_ms")}
    items = {p: [runs[p][i]["items_per_s"] for i in rounds] for p in PHASES}
    p50 = ratio(flooded["p50_ms"], alone["p50_ms"])
    p99 = ratio(flooded["p99_ms"], alone["p99_ms"])
    throughput = ratio(items["A + B"], items["one tenant"])
    targets = [
        _target("B's p50 with A flooding / B alone", p50, "<=", LATENCY_TARGET),
        _target("B's p99 with A flooding / B alone", p99, "<=", LATENCY_TARGET),
        _target("items/s, A + B / one tenant", throughput, ">=", THROUGHPUT_TARGET),
    ]
    phases: dict[str, Any] = {}
    for phase in PHASES:
        fig: dict[str, Any] = {"items_per_s": summary(items[phase])}
        for who in ("A", "B"):
            if any(who in run for run in runs[phase]):
                fig[who] = {k: summary(per_round(phase, who, k)) for k in ("p50_ms", "p99_ms")}
                fig[who]["requests"] = sum(
                    run.get(who, {}).get("requests", 0) for run in runs[phase]
                )
        fig["failed"] = sum(run["failed"] for run in runs[phase])
        phases[phase] = fig
    return {
        "config": asdict(cfg),
        "machine": machine_info(),
        "phases": phases,
        "ratios": {
            "b_p50_flooded_vs_alone": p50,
            "b_p99_flooded_vs_alone": p99,
            "items_per_s_two_tenants_vs_one": throughput,
            "items_per_s_two_tenants_vs_a_alone": ratio(items["A + B"], items["A alone"]),
            "b_p50_one_tenant_vs_alone": ratio(
                per_round("one tenant", "B", "p50_ms"), alone["p50_ms"]
            ),
            "b_p99_one_tenant_vs_alone": ratio(
                per_round("one tenant", "B", "p99_ms"), alone["p99_ms"]
            ),
        },
        "targets": targets,
    }


def _target(name: str, value: dict[str, float], op: str, threshold: float) -> dict[str, Any]:
    med = value["median"]
    holds = med <= threshold if op == "<=" else med >= threshold
    return {"name": name, "value": value, "op": op, "threshold": threshold, "holds": bool(holds)}


def render(result: dict[str, Any]) -> str:
    """The figures as Markdown."""
    cfg, machine = result["config"], result["machine"]
    kind = cfg.get("kind", "model")
    served = {
        "model": "MiniLM on CPU",
        "python": "a python verifier (2 worker processes)",
        "code": "a code verifier (bubblewrap)",
        "remote": "a remote component",
    }[kind]
    items = (
        f"{cfg['per_request']} texts of {cfg['min_tokens']}-{cfg['max_tokens']} tokens"
        if kind == "model"
        else f"{cfg['per_request']} items"
    )
    weights = (
        "of equal weight"
        if cfg.get("b_weight", 1.0) == 1.0
        else f"of weights 1 (A) and {cfg['b_weight']:g} (B)"
    )
    lines = [
        f"One server, {served}, tenants A and B {weights} (a keys file); closed loop, "
        f"{items} per request; A: {cfg['a_clients']} clients, B: {cfg['b_clients']}. "
        f"{cfg['rounds']} rounds of {cfg['duration_s']:g} s windows (medians over rounds); "
        f"{machine['cpu']} ({machine['cores']} cores).",
        "",
        "| phase | items/s | B p50 (ms) | B p99 (ms) | A p50 (ms) | A p99 (ms) |",
        "|---|---:|---:|---:|---:|---:|",
    ]

    def cell(fig: dict[str, Any], who: str, key: str) -> str:
        return f"{fig[who][key]['median']:.0f}" if who in fig else ""

    labels = {
        "B alone": "B alone",
        "A + B": "A + B (two tenants)",
        "one tenant": "same clients, one tenant",
        "A alone": "A alone",
    }
    for phase, fig in result["phases"].items():
        lines.append(
            f"| {labels[phase]} | {fig['items_per_s']['median']:.0f} | "
            f"{cell(fig, 'B', 'p50_ms')} | {cell(fig, 'B', 'p99_ms')} | "
            f"{cell(fig, 'A', 'p50_ms')} | {cell(fig, 'A', 'p99_ms')} |"
        )
    lines += ["", "| target | value (median; min-max) | goal | |", "|---|---:|---:|---|"]
    for t in result["targets"]:
        v = t["value"]
        lines.append(
            f"| {t['name']} | {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f}) | "
            f"{t['op']} {t['threshold']} | {'holds' if t['holds'] else '**missed**'} |"
        )
    r = result["ratios"]
    lines += [
        "",
        f"Without tenants (every client one tenant), B's client waits "
        f"{r['b_p50_one_tenant_vs_alone']['median']:.1f}x (p50) and "
        f"{r['b_p99_one_tenant_vs_alone']['median']:.1f}x (p99) its latency alone.",
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.tenants", description=__doc__.split("\n")[0])
    p.add_argument("--model", help="reward model folder (default: MiniLM with a seeded head)")
    p.add_argument(
        "--kind", choices=KINDS, default="model", help="what the tenants share (default: model)"
    )
    p.add_argument("--a-clients", type=int, default=10)
    p.add_argument("--b-clients", type=int, default=1)
    p.add_argument("--b-weight", type=float, default=1.0, help="B's weight (A's is 1)")
    p.add_argument("--per-request", type=int, default=16)
    p.add_argument("--duration", type=float, default=15.0, help="seconds of each window")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--quick", action="store_true", help="a smoke test: seconds, not figures")
    p.add_argument("--json", type=Path, help="also write every figure to this file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start_part()
    given: dict[str, Any] = {"kind": args.kind, "threads": args.threads}
    given["model_path"] = served_model(args.model) if args.kind == "model" else ""
    if args.quick:
        cfg = quick_config(**given)
    else:
        cfg = TenantsBenchConfig(
            **given,
            a_clients=args.a_clients,
            b_clients=args.b_clients,
            b_weight=args.b_weight,
            per_request=args.per_request,
            duration_s=args.duration,
            rounds=args.rounds,
        )
    result = run_tenants_bench(cfg)
    report_part(result, render(result), args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
