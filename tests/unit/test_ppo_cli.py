"""`ppo-client train` configuration: flags > environment > YAML, flag forms, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from ppo_client import cli
from ppo_client.config import ConfigError, PPOConfig
from settings_cli import flag

YAML = "model_name_or_path: m\nreward_url: http://from-yaml:8000\nreward_api_key: y\n"


def train_config(path: Path, *flags: str) -> PPOConfig:
    """The config ``ppo-client train --config PATH FLAGS...`` would run with."""
    args, rest = cli.build_parser().parse_known_args(["train", "--config", str(path), *flags])
    return cli.train_config(args, rest)


@pytest.fixture
def yaml_path(tmp_path: Path) -> Path:
    path = tmp_path / "ppo.yaml"
    path.write_text(YAML)
    return path


def with_env(monkeypatch: pytest.MonkeyPatch, **variables: str) -> None:
    for name, value in variables.items():
        monkeypatch.setenv(name, value)


def test_environment_overrides_yaml_and_flags_override_environment(
    yaml_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_env(monkeypatch, REWARD_URL="http://a:8000,http://b:8000", REWARD_API_KEY="k")

    config = train_config(yaml_path)
    assert config.reward_url == ["http://a:8000", "http://b:8000"]
    assert config.reward_api_key == "k"

    config = train_config(yaml_path, "--reward_url", "http://from-flag:8000")
    assert config.reward_url in ("http://from-flag:8000", ["http://from-flag:8000"])
    assert config.reward_api_key == "k"


def test_empty_environment_variables_count_as_unset(
    yaml_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_env(monkeypatch, REWARD_URL="", REWARD_API_KEY="")
    config = train_config(yaml_path)
    assert config.reward_url in ("http://from-yaml:8000", ["http://from-yaml:8000"])
    assert config.reward_api_key == "y"


def test_only_the_reward_variables_are_read_from_the_environment(
    yaml_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_env(monkeypatch, OUTPUT_DIR="/elsewhere", SEED="7", REWARD_URL="http://env:8000")
    config = train_config(yaml_path)
    assert (config.output_dir, config.seed) == ("ppo_output", 42)
    # Constructing a config in Python reads no environment at all.
    assert PPOConfig().reward_url is None


def test_flag_forms(tmp_path: Path) -> None:
    path = tmp_path / "ppo.yaml"
    path.write_text(YAML + "use_peft: true\nmax_prompt_length: 64\n")
    config = train_config(
        path,
        "--learning_rate=1e-5",  # --key=value
        "--use-peft",  # dashes read as underscores; a value follows
        "false",
        "--bf16",  # a bare boolean flag is true
        "--max_prompt_length",  # a null word gives null for a key that may be null
        "none",
        "--lora_target_modules",
        "q_proj,v_proj",  # a comma-separated list
        "--report_to",
        "[tensorboard, wandb]",  # a YAML list
        "--reward_baseline",
        "-0.5",
        "--output_dir",
        "123",  # a text key keeps the text as typed
        "--per_device_train_batch_size",
        "8.0",
    )
    assert config.learning_rate == 1e-5
    assert (config.use_peft, config.bf16, config.max_prompt_length) == (False, True, None)
    assert config.lora_target_modules == ["q_proj", "v_proj"]
    assert config.report_to == ["tensorboard", "wandb"]
    assert (config.reward_baseline, config.output_dir) == (-0.5, "123")
    assert config.per_device_train_batch_size == 8
    assert PPOConfig.from_args(["--lora_target_modules", "all-linear"]).lora_target_modules == (
        "all-linear"
    )
    assert PPOConfig(output_dir=tmp_path).output_dir == str(tmp_path)  # a path is its text


def test_reward_retry_timeout() -> None:
    assert PPOConfig().reward_retry_timeout == 600.0
    assert PPOConfig.from_args(["--reward_retry_timeout", "30"]).reward_retry_timeout == 30.0
    assert PPOConfig().reward_max_retries is None  # no count limit unless asked for
    with pytest.raises(ConfigError, match="reward_retry_timeout must be >= 0"):
        PPOConfig(reward_retry_timeout=-1)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--learnig-rate", "1"],
            "unknown config key 'learnig_rate'; did you mean 'learning_rate'",
        ),
        (["--num_ppo_epochs", "0"], "num_ppo_epochs must be >= 1, got 0"),
        (["--temperature", "0"], "temperature must be > 0"),
        (["--save_steps", "0"], "save_steps must be > 0"),
        (["--total_episodes", "0"], "total_episodes must be >= 1"),
        (["--seed", "yes"], "seed: expected int, got 'yes'"),
        (["--stop_token", "bos"], "stop_token: expected 'eos' | null, got 'bos'"),
        (["--missing_eos_penalty", "-1"], "missing_eos_penalty must be a positive value"),
        (["--stop_token", "eos", "--stop_token_id", "2"], "not both"),
        (["--kl_coef"], "expected one argument"),
        (["stray"], "expected --key value, got 'stray'"),
    ],
)
def test_bad_flags_are_config_errors(args: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        PPOConfig.from_args(args)


def test_yaml_errors(tmp_path: Path) -> None:
    path = tmp_path / "ppo.yaml"
    path.write_text("seed: yes\n")  # YAML 1.1 reads yes as true: not a number
    with pytest.raises(ConfigError, match="seed: expected int, got True"):
        PPOConfig.from_yaml(path)
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        PPOConfig.from_yaml(path)
    path.write_text("learning-rate: 0.1\nbatch_size: 4\n")  # a derived size is not a key
    with pytest.raises(ConfigError, match="unknown config key 'batch_size'"):
        PPOConfig.from_yaml(path)


def test_train_exits_2_on_a_config_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["train", "--learnig_rate", "1"]) == 2
    assert "did you mean 'learning_rate'" in capsys.readouterr().err
    assert cli.main(["train", "--config", str(tmp_path / "missing.yaml")]) == 2
    with pytest.raises(SystemExit) as exc:
        cli.main(["train", "--kl_coef"])
    assert exc.value.code == 2


def test_help_lists_every_key(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    out = capsys.readouterr().out
    # as reward-server's: --learning-rate shown, --learning_rate taken too (the epilog says so)
    missing = [name for name in PPOConfig.field_names() if f"{flag(name)} " not in out]
    assert not missing
    assert "also spelt with underscores" in " ".join(out.split())
