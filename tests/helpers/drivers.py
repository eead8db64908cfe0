"""Counterparts that live in folders of their own inside the venv, on no path (verl, bfcl-eval,
Prime Intellect's verifiers:
their pins clash with this venv's; ``make setup`` installs them there): a test runs a driver
script of tests/ in a subprocess whose PYTHONPATH holds that folder, hands it a case as a
JSON file and reads its result from another.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from server_proc import require_counterpart

#: Where ``make setup`` installs verl 0.9.1 without its pins.
VERL_DIR = Path(sys.prefix) / "verl"
#: Where ``make setup`` installs Prime Intellect's verifiers 0.4 (it pins ``openai<3``).
VERIFIERS_DIR = Path(sys.prefix) / "verifiers"


def require_verifiers() -> str:
    """verifiers' PYTHONPATH entry; skips, or fails under REWARD_SERVER_TEST_VERIFIERS=1,
    without it."""
    found = (VERIFIERS_DIR / "verifiers" / "v1" / "__init__.py").is_file()
    require_counterpart(
        found,
        "REWARD_SERVER_TEST_VERIFIERS",
        f"verifiers 0.4 (make setup puts it in {VERIFIERS_DIR})",
    )
    return str(VERIFIERS_DIR)


def verl_pythonpath() -> str | None:
    """The PYTHONPATH entry that makes verl importable ("" if it already is), None without it."""
    if (VERL_DIR / "verl" / "__init__.py").is_file():
        return str(VERL_DIR)
    return "" if importlib.util.find_spec("verl") is not None else None


def require_verl() -> str:
    """verl's PYTHONPATH entry; skips, or fails under REWARD_SERVER_TEST_VERL=1, without verl."""
    path = verl_pythonpath()
    require_counterpart(
        path is not None,
        "REWARD_SERVER_TEST_VERL",
        f"verl 0.9.1 (make setup puts it in {VERL_DIR})",
    )
    assert path is not None
    return path


def with_pythonpath(entry: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (this process's environment when None) with ``entry`` first on PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (entry, env.get("PYTHONPATH", "")) if p)
    return env


def run_driver(
    driver: Path,
    case: Any,
    folder: Path,
    path_entry: str,
    *,
    env: dict[str, str] | None = None,
    case_name: str = "case.json",
) -> Any:
    """``python driver CASE RESULT``: ``case`` written as JSON in ``folder / case_name``,
    ``path_entry`` first on the subprocess's PYTHONPATH (``env``: more of its variables); the
    driver must exit 0 within 240 s; returns what it wrote to ``folder / "result.json"``."""
    (folder / case_name).write_text(json.dumps(case))
    done = subprocess.run(
        [sys.executable, str(driver), str(folder / case_name), str(folder / "result.json")],
        env=with_pythonpath(path_entry, {**os.environ, **(env or {})}),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((folder / "result.json").read_text())
