"""README stays in sync with the code it documents."""

from __future__ import annotations

from pathlib import Path

from ppo_client.config import PPOConfig
from reward_server.config import flags_markdown

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_server_flag_table_is_generated_from_settings() -> None:
    assert flags_markdown().strip() in README


def test_every_ppo_config_key_is_documented() -> None:
    missing = [name for name in PPOConfig.field_names() if f"`{name}`" not in README]
    assert not missing, f"PPOConfig keys missing from README: {missing}"


def test_the_two_commands_are_shown() -> None:
    assert "make demo" in README and "make test" in README
