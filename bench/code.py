"""The code part: tests per second per core, programs run in the sandbox against bare
subprocesses (issue 33, acceptance 4).

Two item shapes, per language: a **trivial** item (one test) and a **20-test** item (read two
integers, print their sum: stdin/stdout, the shape of APPS or CodeContests). Each item is
built once (compiled languages) and run on each of its tests; every output is checked.

- **sandboxed**: ``reward_server.sandbox`` as the code verifier uses it: one session per item
  (a bwrap sandbox with a warm runner, the build, then each test started by the runner), the
  tests of an item at once, ``workers`` = the machine's cores;
- **bare**: the limit, no isolation at all: the same build command in a temporary folder
  (on ``/dev/shm``, a tmpfs like the sandbox's),
  then one fresh process per test (``python3 main.py``, ``./main``, ``node main.js``, ``java
  Main``, with the same flags and the sandbox's environment), ``cores`` processes at once.

Figures are tests per second per core (wall clock, all cores busy), medians over rounds
(modes alternate within a round, so a drift of the machine's load hits them alike). The
**per-test cost** is the marginal cost of one more test of an item, in core-milliseconds:
``cores x (T(20-test items) - T(trivial items)) / (items x 19)``; for bare Python, a test
costs a whole interpreter start. Goals: on the 20-test item, sandboxed >= 0.8x bare for every
language; Python's per-test cost sandboxed at most a third of a bare ``python`` start.
``python -m bench.code --help``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import machine_info, report_part, start_part, summary
from reward_server.sandbox import LANGUAGES, SANDBOX_ENV, Limits, Sandbox

logger = logging.getLogger(__name__)

#: Sum of two integers read from stdin, per language.
PROGRAMS = {
    "python": "a, b = map(int, input().split())\nprint(a + b)\n",
    "c": '#include <stdio.h>\nint main(void) { long a, b; scanf("%ld %ld", &a, &b); '
    'printf("%ld\\n", a + b); return 0; }\n',
    "cpp": "#include <iostream>\nint main() { long a, b; std::cin >> a >> b; "
    "std::cout << a + b << std::endl; }\n",
    "javascript": 'const [a, b] = require("fs").readFileSync(0, "utf8").trim().split(/\\s+/)'
    ".map(Number);\nconsole.log(a + b);\n",
    "java": "import java.util.Scanner;\npublic class Main { public static void main(String[] x) "
    "{ Scanner s = new Scanner(System.in); System.out.println(s.nextLong() + s.nextLong()); } }\n",
    "bash": "read -r a b\necho $((a + b))\n",
}
LIMITS = Limits(run_timeout_s=20.0, compile_timeout_s=120.0)
_TMPFS = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
ITEM_TARGET = 0.8  # sandboxed / bare on the 20-test item, every language
PYTHON_TARGET = 1 / 3  # Python's per-test cost sandboxed / a bare python start


@dataclass
class CodeBenchConfig:
    """What the code benchmark measures."""

    languages: tuple[str, ...] = ("python", "c", "cpp", "javascript", "java")
    items: int = 12
    """Items per measurement (each shape, each mode)."""
    tests: int = 20
    """Tests of the many-test item."""
    rounds: int = 3
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    seed: int = 0


Item = list[tuple[str, str]]  # (stdin, expected stdout) per test


def make_items(count: int, tests: int, rng: random.Random) -> list[Item]:
    out = []
    for _ in range(count):
        pairs = [(rng.randint(-(10**9), 10**9), rng.randint(-(10**9), 10**9)) for _ in range(tests)]
        out.append([(f"{a} {b}\n", f"{a + b}") for a, b in pairs])
    return out


async def run_sandboxed(sandbox: Sandbox, lang: str, items: list[Item]) -> tuple[float, int]:
    """Seconds to run every item in the sandbox, and wrong outputs."""
    sessions = asyncio.Semaphore(2 * sandbox.workers)  # builds overlap the others' tests
    files = {LANGUAGES[lang].source: PROGRAMS[lang]}

    async def one(item: Item) -> int:
        async with sessions, sandbox.session(lang, files, LIMITS) as session:
            if not session.compile_result.ok:
                raise RuntimeError(f"{lang} did not build: {session.compile_result.stderr}")
            results = await asyncio.gather(*(session.run(stdin) for stdin, _ in item))
        return sum(r.stdout.strip() != want for r, (_, want) in zip(results, item, strict=True))

    began = time.perf_counter()
    wrong = await asyncio.gather(*(one(item) for item in items))
    return time.perf_counter() - began, sum(wrong)


async def run_bare(python: str, lang: str, items: list[Item], workers: int) -> tuple[float, int]:
    """Seconds to build each item and run each test as a fresh process, no isolation."""
    spec = LANGUAGES[lang]
    slots = asyncio.Semaphore(workers)
    # The sandbox's environment: a host's (CA bundles for node, say) would slow starts down.
    env = {**SANDBOX_ENV, **dict(spec.env), "TMPDIR": _TMPFS or tempfile.gettempdir()}

    async def process(argv: list[str], cwd: str, stdin: bytes) -> tuple[int, bytes]:
        async with slots:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env=env,
                # Its own session, as each sandboxed job has: with the kernel's autogroup
                # scheduling, a session is a group with its own share of a loaded machine.
                start_new_session=True,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, _ = await proc.communicate(stdin)
            return proc.returncode or 0, out

    async def one(item: Item) -> int:
        # A tmpfs, as the sandbox's work directory is (a compiler's temporary files on a
        # disk would slow the bare builds down, not the sandboxed ones).
        with tempfile.TemporaryDirectory(prefix="bench-code-", dir=_TMPFS) as folder:
            Path(folder, spec.source).write_text(PROGRAMS[lang], encoding="utf-8")
            values = {"prog": folder, "source": spec.source, "python": python}
            values["memory_mb"] = str(LIMITS.memory_mb)
            if spec.compile is not None:
                code, _ = await process([p.format(**values) for p in spec.compile], folder, b"")
                if code != 0:
                    raise RuntimeError(f"{lang} did not build")
            argv = [p.format(**values) for p in spec.run]
            outs = await asyncio.gather(*(process(argv, folder, s.encode()) for s, _ in item))
        return sum(o.decode().strip() != want for (_, o), (_, want) in zip(outs, item, strict=True))

    began = time.perf_counter()
    wrong = await asyncio.gather(*(one(item) for item in items))
    return time.perf_counter() - began, sum(wrong)


def run_code_bench(cfg: CodeBenchConfig) -> dict[str, Any]:
    """Tests per second per core of each language, shape and mode; ratios and targets."""
    sandbox = Sandbox(workers=cfg.workers)
    cores = cfg.workers
    rng = random.Random(cfg.seed)
    figures: dict[str, Any] = {}
    wrong = 0
    targets = []
    for lang in cfg.languages:
        seconds: dict[str, list[float]] = {}
        # One warm-up item per mode: the page cache holds the toolchain afterwards.
        asyncio.run(run_sandboxed(sandbox, lang, make_items(1, 1, rng)))
        asyncio.run(run_bare(sandbox.python, lang, make_items(1, 1, rng), cores))
        for r in range(cfg.rounds):
            for shape, tests in (("trivial", 1), ("item", cfg.tests)):
                items = make_items(cfg.items, tests, rng)
                for mode in ("sandboxed", "bare") if r % 2 == 0 else ("bare", "sandboxed"):
                    if mode == "sandboxed":
                        took, bad = asyncio.run(run_sandboxed(sandbox, lang, items))
                    else:
                        took, bad = asyncio.run(run_bare(sandbox.python, lang, items, cores))
                    seconds.setdefault(f"{mode}/{shape}", []).append(took)
                    wrong += bad
            logger.info("%s: round %d/%d done", lang, r + 1, cfg.rounds)
        figures[lang] = _figures(seconds, cfg, cores)
        ratio = figures[lang]["ratio_rounds"]["item"]
        targets.append(
            _target(f"{lang}: {cfg.tests}-test item, sandboxed / bare", ratio, ">=", ITEM_TARGET)
        )
        if lang == "python":
            cost = figures[lang]["python_cost_rounds"]
            targets.append(
                _target(
                    "python: per-test cost sandboxed / a bare python start",
                    cost,
                    "<=",
                    PYTHON_TARGET,
                )
            )
    return {
        "config": asdict(cfg),
        "machine": machine_info(),
        "python": sandbox.python,
        "languages": figures,
        "wrong_outputs": wrong,
        "targets": targets,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
    }


def _figures(seconds: dict[str, list[float]], cfg: CodeBenchConfig, cores: int) -> dict[str, Any]:
    """Tests/s per core, ratios and per-test costs from the seconds of each round."""
    n_tests = {"trivial": 1, "item": cfg.tests}
    rate = {
        key: [cfg.items * n_tests[key.split("/")[1]] / s / cores for s in values]
        for key, values in seconds.items()
    }
    ratio_rounds = {
        shape: [
            s / b for s, b in zip(rate[f"sandboxed/{shape}"], rate[f"bare/{shape}"], strict=True)
        ]
        for shape in n_tests
    }
    per_test_ms = {
        mode: [
            1000 * cores * (many - one) / (cfg.items * (cfg.tests - 1))
            for many, one in zip(seconds[f"{mode}/item"], seconds[f"{mode}/trivial"], strict=True)
        ]
        if cfg.tests > 1
        else []
        for mode in ("sandboxed", "bare")
    }
    # A bare Python test costs a whole interpreter start: the trivial item's cost per test.
    bare_start_ms = [1000 * cores * s / cfg.items for s in seconds["bare/trivial"]]
    return {
        "tests_per_s_per_core": {key: summary(values) for key, values in rate.items()},
        "ratio": {shape: summary(values) for shape, values in ratio_rounds.items()},
        "ratio_rounds": ratio_rounds,
        "per_test_core_ms": {mode: summary(values) for mode, values in per_test_ms.items()},
        "bare_trivial_core_ms": summary(bare_start_ms),
        "python_cost_rounds": [
            s / b for s, b in zip(per_test_ms["sandboxed"], bare_start_ms, strict=False)
        ],
    }


def _target(name: str, values: list[float], op: str, threshold: float) -> dict[str, Any]:
    fig = summary(values)
    holds = fig["median"] >= threshold if op == ">=" else fig["median"] <= threshold
    return {
        "name": name,
        "value": fig,
        "op": op,
        "threshold": round(threshold, 3),
        "holds": bool(holds),
    }


def render(result: dict[str, Any]) -> str:
    """The figures as Markdown."""
    cfg, machine = result["config"], result["machine"]
    lines = [
        f"{cfg['items']} items per measurement, trivial (1 test) and {cfg['tests']}-test "
        f"items (two integers in, their sum out), {cfg['rounds']} rounds; "
        f"{machine['cpu']} ({machine['cores']} cores), {cfg['workers']} workers; Python "
        f"{result['python']}. Tests per second per core (median, min-max); the per-test cost "
        "is the marginal cost of one more test of an item.",
        "",
        f"| language | trivial: sandboxed | bare | ratio | {cfg['tests']}-test: sandboxed | bare "
        "| ratio "
        "| per test, sandboxed (core-ms) | bare |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for lang, fig in result["languages"].items():
        rate, ratio, cost = fig["tests_per_s_per_core"], fig["ratio"], fig["per_test_core_ms"]
        lines.append(
            f"| {lang} | {_fmt(rate['sandboxed/trivial'])} | {_fmt(rate['bare/trivial'])} | "
            f"{ratio['trivial']['median']:.2f}x | {_fmt(rate['sandboxed/item'])} | "
            f"{_fmt(rate['bare/item'])} | **{ratio['item']['median']:.2f}x** | "
            f"{cost['sandboxed']['median']:.1f} | {cost['bare']['median']:.1f} |"
        )
    lines.append("")
    for t in result["targets"]:
        lines.append(
            f"- {t['name']}: {t['value']['median']:.2f} (goal {t['op']} {t['threshold']}): "
            f"{'holds' if t['holds'] else '**missed**'}"
        )
    lines.append(f"- wrong outputs: {result['wrong_outputs']} (every output is checked)")
    return "\n".join(lines)


def _fmt(fig: dict[str, float]) -> str:
    return f"{fig['median']:.1f} ({fig['min']:.1f}-{fig['max']:.1f})"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.code", description=__doc__.split("\n")[0])
    p.add_argument("--languages", default="python,c,cpp,javascript,java")
    p.add_argument("--items", type=int, default=12, help="items per measurement")
    p.add_argument("--tests", type=int, default=20, help="tests of the many-test item")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--quick", action="store_true", help="a smoke test: python, 2 items, 3 tests")
    p.add_argument("--json", type=Path, help="also write every figure to this file")
    return p


def quick_config(workers: int | None = None) -> CodeBenchConfig:
    """A smoke test of the code, not a measurement: Python, 2 items of 3 tests, one round."""
    return CodeBenchConfig(
        languages=("python",), items=2, tests=3, rounds=1, workers=workers or os.cpu_count() or 1
    )


def config_from(args: argparse.Namespace) -> CodeBenchConfig:
    if args.quick:
        return quick_config(args.workers)
    languages = tuple(x.strip() for x in args.languages.split(",") if x.strip())
    return CodeBenchConfig(
        languages=languages,
        items=args.items,
        tests=args.tests,
        rounds=args.rounds,
        workers=args.workers,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    start_part(logging.INFO)
    result = run_code_bench(config_from(args))
    report_part(result, render(result), args.json)
    return 1 if result["wrong_outputs"] else 0


if __name__ == "__main__":
    sys.exit(main())
