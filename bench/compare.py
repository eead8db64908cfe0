"""Two commits side by side in one run: ``python -m bench.run`` parts on a base commit (a git
worktree of it) and on this tree, alternating which goes first each round, then every target
of both and the ratio this tree / base.

    .venv/bin/python -m bench.compare --base eab3e0b --parts throughput,tenants,cache \\
        --rounds 2 --json bench/results/compare.json -- --repeats 1 --skip-ppo

Arguments after ``--`` go to every ``bench.run``. Both sides use this tree's virtual
environment; each side's own code comes first on ``PYTHONPATH`` (the servers the benchmark
starts inherit it). A ratio says how this tree did against the base on the same machine, in
the same minutes: a move of code that changes no behaviour keeps it near 1.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _run_side(tree: Path, parts: str, out: Path, extra: list[str]) -> dict[str, Any]:
    """One ``bench.run`` of ``parts`` on the code in ``tree``; its results."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-m", "bench.run", "--only", parts, "--no-markdown"]
    command += ["--results-dir", str(out.parent), "--name", out.name, *extra]
    print(f"$ (cd {tree} && {' '.join(command)})", flush=True)
    subprocess.run(command, cwd=tree, env=env, check=True)
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def _targets(results: dict[str, Any]) -> dict[str, float]:
    """Every target's median value in one run's results, by part and name."""
    out = {}
    for part, body in results.items():
        if isinstance(body, dict):
            for target in body.get("targets", []):
                out[f"{part}: {target['name']}"] = float(target["value"]["median"])
    return out


def compare(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per target: each side's values over rounds, their medians and new / base."""
    rows = []
    base = [_targets(r) for r in runs["base"]]
    new = [_targets(r) for r in runs["new"]]
    for name in base[0]:
        b = [t[name] for t in base if name in t]
        n = [t[name] for t in new if name in t]
        if not b or not n:
            continue
        b_med, n_med = statistics.median(b), statistics.median(n)
        ratio = n_med / b_med if b_med else float("nan")
        rows.append({"target": name, "base": b, "new": n, "ratio": ratio})
    return rows


def markdown(rows: list[dict[str, Any]], base: str, new: str) -> str:
    """The comparison as a Markdown table."""
    lines = [
        f"| target | base {base} | this tree {new} | this / base |",
        "|---|---:|---:|---:|",
    ]
    for row in rows:
        b = ", ".join(f"{v:.3g}" for v in row["base"])
        n = ", ".join(f"{v:.3g}" for v in row["new"])
        lines.append(f"| {row['target']} | {b} | {n} | {row['ratio']:.3f} |")
    return "\n".join(lines)


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    """Run both sides, print the table, write the JSON; 0."""
    args_in = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in args_in:
        cut = args_in.index("--")
        args_in, extra = args_in[:cut], args_in[cut + 1 :]
    p = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__)
    p.add_argument("--base", required=True, help="the commit to compare against")
    p.add_argument("--parts", default="throughput,tenants,cache")
    p.add_argument("--rounds", type=int, default=1, help="runs of each side (alternating)")
    p.add_argument("--json", type=Path, help="write the runs and the table here")
    args = p.parse_args(args_in)
    base_commit = _git("rev-parse", "--short", args.base)
    new_commit = _git("rev-parse", "--short", "HEAD") + ("+" if _git("status", "--short") else "")
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="bench-compare-") as tmp:
        worktree = Path(tmp) / "base"
        _git("worktree", "add", "--detach", str(worktree), base_commit)
        try:
            sides = {"base": worktree, "new": REPO}
            for i in range(args.rounds):
                order = ["base", "new"] if i % 2 == 0 else ["new", "base"]
                for side in order:
                    out = Path(tmp) / f"{side}-{i}.json"
                    runs[side].append(_run_side(sides[side], args.parts, out, extra))
        finally:
            _git("worktree", "remove", "--force", str(worktree))
    rows = compare(runs)
    table = markdown(rows, base_commit, new_commit)
    print(table)
    if args.json is not None:
        record = {"base": base_commit, "new": new_commit, "extra": extra, "rows": rows}
        args.json.write_text(json.dumps({**record, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
