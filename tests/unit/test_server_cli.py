"""The ``reward-server`` command line: flags, environment, load failures (as processes, and a
configured server: test_server_cli_process.py).

SIGTERM's drain is tested in tests/e2e/test_reliability_faults.py (every input form, one server)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.server_cli import LOAD_FAILURES, assert_one_error_line, load_failure_args

from reward_server import cli
from reward_server.cli import build_parser, parse_settings
from reward_server.config import CPU_BATCH_TOKENS, GPU_BATCH_TOKENS, ServerSettings


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No REWARD_SERVER_* variables from the outer environment."""
    import os

    for name in list(os.environ):
        if name.startswith("REWARD_SERVER_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_every_settings_field_is_a_flag_with_help() -> None:
    parser = build_parser()
    help_text = parser.format_help()
    options = {a.dest: a for a in parser._actions}
    for name, field in ServerSettings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        assert flag in help_text, flag
        assert f"REWARD_SERVER_{name.upper()}" in help_text
        assert options[name].help and field.description
    for flag in (
        "--model --adapter --merge-adapter --host --port --dtype --device --max-length "
        "--truncation-side --no-truncate --label-index --chat-template --max-batch-tokens "
        "--max-batch-size --max-wait-ms --max-client-batch --max-queue --max-body-bytes "
        "--api-key --trust-remote-code --log-level"
    ).split():
        assert flag in help_text, flag
    assert "default: 127.0.0.1" in help_text  # defaults are shown


def test_flags_override_environment(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("REWARD_SERVER_MODEL", "from-env")
    clean_env.setenv("REWARD_SERVER_PORT", "9001")
    clean_env.setenv("REWARD_SERVER_NO_TRUNCATE", "true")
    clean_env.setenv("REWARD_SERVER_MAX_WAIT_MS", "7.5")
    s = parse_settings(["--port", "9002", "--dtype", "float32"])
    assert s.model == "from-env"
    assert s.port == 9002  # flag beats env
    assert s.no_truncate is True and s.max_wait_ms == 7.5  # env fills the rest
    assert s.dtype == "float32"
    assert s.host == "127.0.0.1" and s.max_batch_tokens is None  # defaults (per device)
    s = parse_settings(["--model", "m", "--api-key", "hidden-key-42", "--merge-adapter"])
    assert s.model == "m" and s.api_key is not None and s.merge_adapter is True
    assert "hidden-key-42" not in repr(s) and "hidden-key-42" not in str(s)


def test_batch_token_budget_defaults_per_device() -> None:
    s = ServerSettings(model="m")
    assert s.batch_token_budget("cpu", 512) == CPU_BATCH_TOKENS
    assert s.batch_token_budget("cuda:0", 512) == GPU_BATCH_TOKENS
    assert CPU_BATCH_TOKENS < GPU_BATCH_TOKENS
    # never below the model's max length, so one text of the longest kind fits a pass
    assert s.batch_token_budget("cpu", 32768) == 32768
    # a given value wins on any device, even under max_length (the server warns then)
    given = ServerSettings(model="m", max_batch_tokens=300)
    assert given.batch_token_budget("cpu", 512) == given.batch_token_budget("cuda", 512) == 300


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        ([], "--model is required"),
        (["--model", "m", "--dtype", "float8"], "invalid choice"),
        (["--model", "m", "--device", "tpu"], "--device"),
        (["--model", "m", "--max-batch-size", "0"], "--max-batch-size"),
        # pydantic converts and checks the text, as for REWARD_SERVER_PORT=x
        (["--model", "m", "--port", "x"], "--port: Input should be a valid integer"),
    ],
)
def test_bad_flags_are_usage_errors(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], needle: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_settings(argv)
    assert exit_info.value.code == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("case", LOAD_FAILURES)
def test_model_load_failure_is_one_line_and_exit_1(
    case: str,
    tmp_path: Path,
    gpt2_rm: Path,
    clean_env: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The CLI's main() in process (the console script runs it; see the test below)."""
    clean_env.setattr(cli, "_configure_logging", lambda level: None)  # pytest owns logging
    args = load_failure_args(case, tmp_path, gpt2_rm)
    assert cli.main([*args, "--port", "1", "--log-level", "warning"]) == 1
    assert_one_error_line(capsys.readouterr().err, case, args[1])


# --------------------------------------------------------------------------- a configured server
