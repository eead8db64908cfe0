"""Server start-up, cold against warm: how long ``reward-server`` takes from the start call
until ``/health`` answers, and the CPU its process spent by then, when it runs the console
script (cold) and when the test suite's warm launcher (``tests/warm_launcher.py``) forks it
from its process that has imported torch, transformers and the server once: what that test
machinery saves the suite.

    python -m bench.startup [--model PATH] [--starts 5] [--threads 1]

The first warm start also starts the warm process (its imports); it is reported apart and
not in the warm figures. Cold and warm starts alternate so that both see the same machine.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import psutil

from bench.common import machine_info, server_env, summary
from reward_server.launcher import running_server, spawn_process

logger = logging.getLogger(__name__)

#: The folder of the test suite's helpers, warm_launcher.py among them.
TESTS = Path(__file__).resolve().parents[1] / "tests"


def _warm_launcher() -> ModuleType:
    """The tests' ``warm_launcher`` module, as the tests import it (one launcher per process)."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    return importlib.import_module("warm_launcher")


def _start_once(model: Path, *, warm: bool) -> dict[str, float]:
    """Seconds from the start call to a healthy server, and the server's CPU seconds then."""
    launcher = _warm_launcher()
    spawn = launcher.spawn if warm else spawn_process
    started = time.perf_counter()
    with running_server(model, timeout=180, spawn=spawn) as server:
        ready = time.perf_counter() - started
        times = psutil.Process(server.proc.pid).cpu_times()
        if isinstance(server.proc, launcher.WarmProcess) != warm:
            raise RuntimeError(f"a start asked {'warm' if warm else 'cold'} was not")
    return {"ready_s": ready, "cpu_s": times.user + times.system}


def run_startup_bench(model: Path, *, starts: int, threads: int) -> dict[str, Any]:
    """``starts`` cold and ``starts`` warm starts of ``model``'s server, alternating."""
    # The servers' environment is this process's own: a warm launcher starts servers with
    # its caller's environment (plus REWARD_SERVER_* settings) only.
    os.environ.update(server_env(threads))
    first_warm = _start_once(model, warm=True)  # starts the warm process too
    cold: list[dict[str, float]] = []
    warm: list[dict[str, float]] = []
    for _ in range(starts):
        cold.append(_start_once(model, warm=False))
        warm.append(_start_once(model, warm=True))
    figures: dict[str, Any] = {"machine": machine_info(), "model": str(model), "starts": starts}
    figures["first_warm"] = first_warm
    for name, rows in (("cold", cold), ("warm", warm)):
        figures[name] = {key: summary(row[key] for row in rows) for key in ("ready_s", "cpu_s")}
    for key in ("ready_s", "cpu_s"):
        figures[f"cold/warm {key}"] = (
            figures["cold"][key]["median"] / figures["warm"][key]["median"]
        )
    return figures


def render(figures: dict[str, Any]) -> str:
    """The figures as a Markdown table."""
    lines = [
        "| start | ready (s, median) | server CPU by then (s, median) |",
        "| --- | --- | --- |",
    ]
    for name in ("cold", "warm"):
        row = figures[name]
        lines.append(f"| {name} | {row['ready_s']['median']:.2f} | {row['cpu_s']['median']:.2f} |")
    first = figures["first_warm"]
    lines.append(f"| first warm (with the launcher's imports) | {first['ready_s']:.2f} | - |")
    lines.append(
        f"\ncold/warm: {figures['cold/warm ready_s']:.1f}x the time to ready, "
        f"{figures['cold/warm cpu_s']:.1f}x the server's CPU; {figures['starts']} starts each, "
        f"{figures['machine'].get('cpu', '?')}."
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__)
    p.add_argument("--model", type=Path, default=None, help="default: the MiniLM reward model")
    p.add_argument("--starts", type=int, default=5, help="cold and warm starts each")
    p.add_argument("--threads", type=int, default=1, help="the servers' math threads")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    if args.model is None:
        from bench.models import prepare_minilm_reward_model

        args.model = prepare_minilm_reward_model()
    figures = run_startup_bench(args.model, starts=args.starts, threads=args.threads)
    print(json.dumps(figures, indent=1, default=str))
    print(render(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
