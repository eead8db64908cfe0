"""The trainer itself uses none of the reward client's old import paths (checked in a fresh
interpreter, where no other test imported them first)."""

from __future__ import annotations

import subprocess
import sys


def test_the_trainer_itself_uses_no_old_path() -> None:
    """ppo_client's own modules import the client from reward_client: no warning."""
    code = "import ppo_client.cli, ppo_client.reward, ppo_client.reporting, ppo_client.trainer"
    # -W's message field matches the start of the message: every warning of the shims.
    flags = ["-W", "error:ppo_client:DeprecationWarning"]
    result = subprocess.run(
        [sys.executable, *flags, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
