"""One spelling of flags and booleans in ``reward-server`` and ``ppo-client train``: both
commands' flags come from their pydantic models through ``settings_cli``, so a form that
works (or fails) in one works (or fails) alike in the other."""

from __future__ import annotations

import os

import pytest

from ppo_client import cli as ppo_cli
from ppo_client.config import ConfigError, PPOConfig
from reward_server.cli import build_parser, parse_settings
from reward_server.config import ServerSettings
from settings_cli import EPILOG


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No REWARD_SERVER_* variables from the outer environment."""
    for name in list(os.environ):
        if name.startswith("REWARD_SERVER_"):
            monkeypatch.delenv(name)


def server(*flags: str) -> ServerSettings:
    return parse_settings(["--model", "m", *flags])


def trainer(*flags: str) -> PPOConfig:
    return PPOConfig.from_args(list(flags))


#: (the forms of a boolean, as a template over the flag's words, and the value they give)
SWITCH_FORMS = [
    ([], False),
    (["--{dashed}"], True),
    (["--{snake}"], True),
    (["--no-{dashed}"], False),
    (["--no_{snake}"], False),
    (["--{dashed}", "false"], False),
    (["--{dashed}", "true"], True),
    (["--{dashed}=yes"], True),
    (["--{snake}=0"], False),
    (["--{dashed}", "--no-{dashed}"], False),  # the last one wins
]


def _forms(template: list[str], name: str) -> list[str]:
    return [t.format(dashed=name.replace("_", "-"), snake=name) for t in template]


@pytest.mark.parametrize(("template", "value"), SWITCH_FORMS)
def test_a_boolean_is_spelt_alike_in_both(template: list[str], value: bool) -> None:
    assert server(*_forms(template, "merge_adapter")).merge_adapter is value
    assert trainer(*_forms(template, "use_peft")).use_peft is value
    assert server(*_forms(template, "trust_remote_code")).trust_remote_code is value
    assert trainer(*_forms(template, "trust_remote_code")).trust_remote_code is value


def test_a_boolean_on_by_default_is_turned_off_alike() -> None:
    assert server().enable_prefix_caching is True and trainer().stream_rewards is True
    assert server("--no-enable-prefix-caching").enable_prefix_caching is False
    assert trainer("--no-stream-rewards").stream_rewards is False
    assert server("--enable-prefix-caching", "off").enable_prefix_caching is False
    assert trainer("--stream-rewards", "off").stream_rewards is False


def test_the_opposite_of_a_no_flag_is_the_flag_without_no() -> None:
    assert server("--no-truncate").no_truncate is True
    assert server("--no-truncate", "--truncate").no_truncate is False
    assert server("--no_truncate=false").no_truncate is False


def test_a_boolean_that_may_be_another_value() -> None:
    assert trainer("--bf16", "auto").bf16 == "auto"
    assert trainer("--bf16").bf16 is True and trainer("--no-bf16").bf16 is False
    assert trainer("--overlap-reward", "none").overlap_reward is None


def test_a_negation_takes_no_value(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        server("--no-merge-adapter", "true")
    assert exit_info.value.code == 2
    assert "--no-merge-adapter takes no value" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--no-use-peft takes no value"):
        trainer("--no-use-peft", "true")


def test_values_in_both_spellings_and_forms() -> None:
    for flags in (["--max-batch-size", "8"], ["--max_batch_size=8"], ["--max-batch-size=8"]):
        assert server(*flags).max_batch_size == 8
    for flags in (["--num-ppo-epochs", "2"], ["--num_ppo_epochs=2"], ["--num-ppo-epochs=2"]):
        assert trainer(*flags).num_ppo_epochs == 2


def test_none_unsets_a_field_that_may_be_unset() -> None:
    for word in ("none", "null", "None"):
        assert server("--max-length", word).max_length is None
        assert trainer("--max-prompt-length", word).max_prompt_length is None
    # a text field that may not be unset keeps the word: the chat template "none"
    assert server("--chat-template", "none").chat_template == "none"


def test_no_abbreviations_in_either(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        server("--max-queu", "8")
    assert "unrecognized arguments: --max-queu" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="unknown config key 'num_ppo_epoch'"):
        trainer("--num-ppo-epoch", "2")


def test_lists_repeat_and_mappings_read_as_yaml() -> None:
    value = 'b={"x": 1, "y": 2}'  # a comma inside a value stays in it
    settings = server("--engine-arg", "a=1", "--engine_arg", value)
    assert settings.engine_arg == ["a=1", value]
    config = trainer(
        "--rollout-engine", "vllm", "--vllm-engine-args", "{enforce_eager: false, seed: 3}"
    )
    assert config.vllm_engine_args == {"enforce_eager": False, "seed": 3}


def test_both_helps_show_one_spelling_the_same_way(capsys: pytest.CaptureFixture[str]) -> None:
    server_help = " ".join(build_parser().format_help().split())
    with pytest.raises(SystemExit):
        ppo_cli.main(["train", "--help"])
    trainer_help = " ".join(capsys.readouterr().out.split())
    assert "--merge-adapter [BOOL], --no-merge-adapter" in server_help
    assert "--no-truncate [BOOL], --truncate" in server_help
    assert "--use-peft [BOOL], --no-use-peft" in trainer_help
    assert "--bf16 [BOOL|auto], --no-bf16" in trainer_help
    assert "--max-batch-size INT" in server_help and "--num-ppo-epochs INT" in trainer_help
    for text in (server_help, trainer_help):
        assert " ".join(EPILOG.split()) in text
        assert "--max_batch_size" not in text and "--num_ppo_epochs" not in text
    # defaults alike: a boolean's is on or off, an unset one's none
    assert "[default: off; env REWARD_SERVER_MERGE_ADAPTER]" in server_help
    assert "[default: on; env REWARD_SERVER_ENABLE_PREFIX_CACHING]" in server_help
    assert "[default: off]" in trainer_help and "[default: none]" in trainer_help
