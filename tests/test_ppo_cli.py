"""`ppo-client train` configuration precedence: flags > environment > YAML."""

from __future__ import annotations

from pathlib import Path

from ppo_client.cli import env_overrides
from ppo_client.config import PPOConfig


def test_environment_overrides_yaml_and_flags_override_environment(tmp_path: Path) -> None:
    path = tmp_path / "ppo.yaml"
    path.write_text("model_name_or_path: m\nreward_url: http://from-yaml:8000\nreward_api_key: y\n")
    env = {"REWARD_URL": "http://a:8000,http://b:8000", "REWARD_API_KEY": "k"}

    config = PPOConfig.from_yaml(path, env_overrides(env))
    assert config.reward_url == ["http://a:8000", "http://b:8000"]
    assert config.reward_api_key == "k"

    flags = ["--reward_url", "http://from-flag:8000"]
    config = PPOConfig.from_yaml(path, [*env_overrides(env), *flags])
    assert config.reward_url in ("http://from-flag:8000", ["http://from-flag:8000"])
    assert config.reward_api_key == "k"


def test_empty_environment_variables_count_as_unset(tmp_path: Path) -> None:
    path = tmp_path / "ppo.yaml"
    path.write_text("model_name_or_path: m\nreward_url: http://from-yaml:8000\nreward_api_key: y\n")
    config = PPOConfig.from_yaml(path, env_overrides({"REWARD_URL": "", "REWARD_API_KEY": ""}))
    assert config.reward_url in ("http://from-yaml:8000", ["http://from-yaml:8000"])
    assert config.reward_api_key == "y"
