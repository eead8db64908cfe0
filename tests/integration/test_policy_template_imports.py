"""Policy-template recovery imports no torch (checked in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_module_does_not_import_torch() -> None:
    code = "import sys, reward_server.text.policy_template; print('torch' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"
