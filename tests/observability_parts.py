"""What the observability tests share: the shipped alert rules, their thresholds and the
series they and the dashboard name, promtool, and the server they watch (a reward model and an
exact-match verifier scored together, two tenants)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from helpers.servers import serve
from server_proc import ServerProcess, require_counterpart

ROOT = Path(__file__).resolve().parents[1]
OBSERVABILITY = ROOT / "deploy" / "observability"
ALERTS = OBSERVABILITY / "alerts.yml"
DASHBOARD = OBSERVABILITY / "grafana" / "reward-server.json"


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"]
    return [rule for group in groups for rule in group["rules"]]


def promtool() -> str:
    """Debian's promtool; the calling test module skips without it (fails under ``make
    test``: ``REWARD_SERVER_TEST_PROMETHEUS=1``)."""
    found = shutil.which("promtool")
    require_counterpart(
        found is not None, "REWARD_SERVER_TEST_PROMETHEUS", "promtool (Debian's prometheus)"
    )
    assert found is not None
    return found


def run_promtool(promtool: str, *args: str, cwd: Path = OBSERVABILITY) -> str:
    """promtool's output; fails the test when it does not exit 0."""
    result = promtool_result(promtool, *args, cwd=cwd)
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result.stdout + result.stderr


def promtool_result(promtool: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """promtool run in ``cwd``, whatever its exit status."""
    return subprocess.run(
        [promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def metric_names(expr: str) -> set[str]:
    """The series names an expression selects (quoted label values left out)."""
    unquoted = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    tokens = re.findall(r"[A-Za-z_:][\w:]*", unquoted)
    return {t for t in tokens if t.startswith("reward_server_") or t == "up"}


def alert_threshold(alert: str, series: str) -> float:
    """The number ``series`` is compared with in ``alert``'s expression in the shipped rules."""
    (expr,) = [r["expr"] for r in alert_rules() if r.get("alert") == alert]
    found = re.search(rf"{series}[^<>]*[<>]=?\s*([0-9.]+)", expr)
    assert found, f"no threshold for {series} in {alert}: {expr}"
    return float(found.group(1))


@contextmanager
def composite_server(
    reward_model: Path, folder: Path, keys_yaml: str, verifier: str = "exact"
) -> Iterator[ServerProcess]:
    """A real server scoring with ``rm`` (the model at ``reward_model``) and an exact-match
    verifier named ``verifier`` together, behind the tenants' keys file ``keys_yaml``."""
    models = [
        {"name": "rm", "model": str(reward_model)},
        {"name": verifier, "kind": "verifier", "verifier": "exact", "workers": 1},
    ]
    (folder / "keys.yaml").write_text(keys_yaml, encoding="utf-8")
    keys = ("--api-keys", str(folder / "keys.yaml"))
    with serve(None, *keys, models=models, folder=folder, timeout=300) as srv:
        yield srv
