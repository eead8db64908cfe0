"""Small helpers shared by the benchmark modules (no torch import: the load generator uses it)."""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import re
import statistics
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: Environment that keeps a process that never runs a model from spawning math threads.
NO_MATH_THREADS = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def server_env(threads: int) -> dict[str, str]:
    """Environment of a benchmark's reward server: ``threads`` math threads, no tokenizer
    threads of its own."""
    return {
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }


def model_server_env(threads: int) -> dict[str, str]:
    """Environment of a reward server whose model speed is what a benchmark measures.

    :func:`server_env` with no score cache: these workloads send the same texts round after
    round (and the cache is on by default), so cached answers would be timed instead of
    forward passes. The score cache has its own benchmark (bench/score_cache.py).
    """
    return {**server_env(threads), "REWARD_SERVER_SCORE_CACHE_SIZE": "0"}


def summary(values: Iterable[float]) -> dict[str, float]:
    """Median with min and max of repeated measurements (NaN when there are none)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    return {
        "median": statistics.median(vals),
        "min": min(vals),
        "max": max(vals),
        "n": len(vals),
    }


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text exposition -> ``{"name{labels}": value}`` (comments skipped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        try:
            out[name + (labels or "")] = float(value)
        except ValueError:
            continue
    return out


def metric_sum(samples: Mapping[str, float], name: str, **labels: str) -> float:
    """Sum of every sample named ``name`` whose labels include ``labels``."""
    total = 0.0
    for key, value in samples.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total


def machine_info() -> dict[str, Any]:
    """CPU, cores, memory, OS and load average of this machine."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_gib = math.nan
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_gib = int(line.split()[1]) / 1024 / 1024
                    break
    except OSError:
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else (math.nan,) * 3
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_gib, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "load_average": [round(x, 2) for x in load],
    }


def versions() -> dict[str, str]:
    """Versions of the libraries the figures depend on, and the git commit."""
    from importlib import metadata

    out: dict[str, str] = {}
    for dist in ("torch", "transformers", "tokenizers", "fastapi", "uvicorn", "httpx", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "not installed"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        out["git"] = commit + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        out["git"] = "unknown"
    return out


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and its reaped children, seconds."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def start_part(level: int = logging.INFO) -> None:
    """What a part's own command (``python -m bench.<part>``) starts with: log lines on
    stderr, httpx's one line per request left out."""
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)


def served_model(given: str | None) -> str:
    """The reward model a part's own command serves: ``given``, or MiniLM with a seeded
    head (built once into the benchmark's cache)."""
    from bench.models import prepare_minilm_reward_model

    return given or str(prepare_minilm_reward_model())


def report_part(result: dict[str, Any], markdown: str, json_path: Path | None) -> None:
    """What a part's own command (``python -m bench.<part>``) ends with: its Markdown block
    on stdout and, with ``--json``, every figure in that file."""
    print(markdown)
    if json_path is not None:
        json_path.write_text(json.dumps(result, indent=2) + "\n")
