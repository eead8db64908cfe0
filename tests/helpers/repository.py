"""Where things are: the repository and its library packages."""

from __future__ import annotations

from pathlib import Path

#: The repository's root.
ROOT = Path(__file__).resolve().parents[2]
#: The library packages (what the structure limits and the repeated-code check hold).
PACKAGES = ("reward_client", "reward_server", "ppo_client", "settings_cli")
