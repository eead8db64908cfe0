"""The HTTP, rendering and batching modules import no torch (checked in a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

#: The modules that load a model (torch, transformers, vLLM) and the Ray Serve entry point
#: (Ray); every other module of the server must import without torch.
NEEDS_TORCH = {
    "reward_server.engines.transformers",
    "reward_server.engines._process_reward",
    "reward_server.engines._judge",
    "reward_server.engines._vllm_judge",
    "reward_server.engines._checkpoint",
    "reward_server.engines.vllm",
    "reward_server.http.ray_serve",
}


def _server_modules() -> list[str]:
    root = Path(__file__).resolve().parents[2] / "reward_server"
    names = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


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
