"""Charts of a benchmark results file, written next to it as SVG (the docs' Benchmarks page).

``python -m bench.charts bench/results/2026-12-01.json [...]`` renders files by hand;
``make bench`` (``bench.run``) renders the file it has just written. Each chart is drawn only
when its part is in the file: throughput against clients per server and latency
percentiles (``throughput``), texts per second per engine (``engines``).
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger("bench.charts")

#: How the throughput part names its servers (bench/throughput.py: S and N).
SERVERS = {"server": "reward-server", "naive": "naive server (one forward per request)"}


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend, with reproducible SVG output."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Fixed ids and no date in the SVG: re-rendering the same results gives the same file.
    matplotlib.rcParams["svg.hashsalt"] = "remote-reward"
    matplotlib.rcParams["svg.fonttype"] = "none"
    return plt


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    _pyplot().close(fig)
    return path


def _clients_axis(ax: Any, clients: Sequence[int]) -> None:
    """A log2 axis of client counts, ticked at the measured counts in plain numbers."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(set(clients)))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())


def _runs(throughput: dict[str, Any], server: str, per_request: int) -> list[dict[str, Any]]:
    rows = [r for r in throughput.get(server, []) if r.get("per_request") == per_request]
    return sorted(rows, key=lambda r: r["clients"])


def throughput_chart(throughput: dict[str, Any], out: Path) -> Path:
    """Texts per second against concurrent clients, one line per server and request size."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for server, label in SERVERS.items():
        for per_request in sorted({r["per_request"] for r in throughput.get(server, [])}):
            rows = _runs(throughput, server, per_request)
            ax.plot(
                [r["clients"] for r in rows],
                [r["texts_per_s"]["median"] for r in rows],
                marker="o",
                linestyle="-" if server == "server" else "--",
                label=f"{label}, {per_request} text(s)/request",
            )
    inprocess = throughput.get("inprocess", {}).get("texts_per_s", {}).get("median")
    if inprocess:
        ax.axhline(inprocess, color="grey", linewidth=1, label="in-process scoring (bound)")
    _clients_axis(ax, [r["clients"] for s in SERVERS for r in throughput.get(s, [])])
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("texts / s (median of repeats)")
    ax.set_title("Throughput against clients")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out)


def latency_chart(throughput: dict[str, Any], out: Path, per_request: int = 1) -> Path:
    """p50 and p99 request latency against concurrent clients, per server."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for server, label in SERVERS.items():
        rows = _runs(throughput, server, per_request)
        clients = [r["clients"] for r in rows]
        for pct, style in (("p50", "-"), ("p99", ":")):
            values = [r[f"{pct}_ms"]["median"] for r in rows]
            ax.plot(clients, values, marker="o", linestyle=style, label=f"{label} {pct}")
    _clients_axis(ax, [r["clients"] for s in SERVERS for r in throughput.get(s, [])])
    ax.set_yscale("log")
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("request latency (ms)")
    ax.set_title(f"Latency percentiles, {per_request} text(s) per request")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out)


def engines_chart(engines: dict[str, Any], out: Path) -> Path:
    """Texts per second of each engine variant, per dtype and workload (bars)."""
    plt = _pyplot()
    series = [
        (f"{dtype} {variant}", workloads)
        for dtype, variants in engines["texts_per_s"].items()
        for variant, workloads in variants.items()
    ]
    workloads = sorted({w for _, ws in series for w in ws})
    width = 0.8 / max(len(workloads), 1)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, workload in enumerate(workloads):
        xs = [j + i * width for j in range(len(series))]
        ys = [ws.get(workload, {}).get("median", 0.0) for _, ws in series]
        ax.bar(xs, ys, width=width, label=workload)
    ax.set_xticks([j + width * (len(workloads) - 1) / 2 for j in range(len(series))])
    ax.set_xticklabels([name for name, _ in series], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("texts / s")
    ax.set_title("Engines: texts per second (grpo: groups sharing a prompt)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out)


def render_charts(results_file: Path) -> list[Path]:
    """Draw the charts of ``results_file``'s parts beside it; return the files written."""
    results = json.loads(results_file.read_text(encoding="utf-8"))
    stem = results_file.with_suffix("")
    written: list[Path] = []
    throughput = results.get("throughput")
    if throughput and throughput.get("server"):
        written.append(throughput_chart(throughput, Path(f"{stem}-throughput.svg")))
        written.append(latency_chart(throughput, Path(f"{stem}-latency.svg")))
    engines = results.get("engines")
    if engines and engines.get("texts_per_s"):
        # 2026-12-01-engines.json (an --only engines run) -> 2026-12-01-engines.svg
        name = stem if stem.name.endswith("-engines") else Path(f"{stem}-engines")
        written.append(engines_chart(engines, Path(f"{name}.svg")))
    for path in written:
        logger.info("chart written: %s", path)
    return written


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", nargs="+", type=Path, help="bench/results/*.json files")
    for results_file in p.parse_args(argv).results:
        for path in render_charts(results_file):
            print(path)


if __name__ == "__main__":
    main()
