"""The HTTP, rendering and batching modules import no torch (checked in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys

from test_server_structure import NEEDS_TORCH, _server_modules


def test_http_rendering_and_batching_modules_import_no_torch() -> None:
    light = [name for name in _server_modules() if name not in NEEDS_TORCH]
    assert "reward_server.scoring.pipeline" in light and "reward_server.http.app" in light
    code = (
        "import sys\n"
        + "".join(f"import {name}\n" for name in light)
        + "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
