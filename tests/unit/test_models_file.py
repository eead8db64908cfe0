"""The models file of ``reward-server --models``: parsing, validation messages, the flags
it excludes and the per-model options it gives the engines (no models loaded)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from reward_server.cli import parse_settings
from reward_server.config import LoadOptions, ServerSettings
from reward_server.config.models_file import ModelsFileError, parse_models_file, read_models_file

GOOD = """\
aggregate: mean
models:
  - name: helpful
    model: /models/helpful
    weight: 2.0
    normalize: {mean: 0.5, std: 2}
  - name: safety.v2
    model: org/armo
    objectives: {harmless: 0.7, honest: 0.3}
    max_length: 128
    device: cpu
    truncation_side: right
"""


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No REWARD_SERVER_* variables from the outer environment."""
    for name in list(os.environ):
        if name.startswith("REWARD_SERVER_"):
            monkeypatch.delenv(name)
    return monkeypatch


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_good_file_is_read_with_its_defaults(tmp_path: Path) -> None:
    file = read_models_file(write(tmp_path, GOOD))
    assert file.aggregate == "mean" and file.names == ["helpful", "safety.v2"]
    helpful, safety = file.models
    assert helpful.weight == 2.0 and helpful.normalize is not None
    assert (helpful.normalize.mean, helpful.normalize.std) == (0.5, 2.0)
    assert helpful.kind == "sequence" and helpful.label_index is None
    assert safety.weight == 1.0 and safety.objectives == {"harmless": 0.7, "honest": 0.3}
    assert parse_models_file({"models": [{"name": "a", "model": "m"}]}).aggregate == "weighted_sum"


def test_per_model_options_default_to_the_servers(tmp_path: Path) -> None:
    server = LoadOptions(
        model="ignored", device="cuda:1", dtype="bfloat16", max_length=512, label_index=1
    )
    helpful, safety = read_models_file(write(tmp_path, GOOD)).models
    own = helpful.load_options(server)
    assert own.model == "/models/helpful" and own.device == "cuda:1" and own.dtype == "bfloat16"
    assert own.max_length == 512 and own.label_index == 1  # the server's --label-index
    other = safety.load_options(server)
    assert other.model == "org/armo" and other.device == "cpu" and other.max_length == 128
    assert other.truncation_side == "right" and other.dtype == "bfloat16"
    assert other.label_index == 0  # objectives read every label


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("models:\n  - {name: a, model: m, wieght: 2}\n", "models[0]: unknown key 'wieght'"),
        ("models:\n  - {model: m}\n", "models[0]: 'name' is required"),
        ("models:\n  - {name: a}\n", "models[0]: 'model' is required"),
        ("models: []\n", "models: List should have at least 1 item"),
        ("modles:\n  - {name: a, model: m}\n", "top level: unknown key 'modles'"),
        ("aggregate: max\nmodels:\n  - {name: a, model: m}\n", "aggregate: Input should be"),
        ("models:\n  - {name: a, model: m}\n  - {name: a, model: n}\n", "a repeated"),
        ("models:\n  - {name: 'a b', model: m}\n", "models[0].name: String should match"),
        (
            "models:\n  - {name: a, model: m, label_index: 1, objectives: {x: 1}}\n",
            "label_index or objectives, not both",
        ),
        ("models:\n  - {name: a, model: m, step_tag: '<t>'}\n", "step_tag: only for kind: process"),
        (
            "models:\n  - {name: a, model: m, kind: process}\n  - {name: b, model: m, kind: process}\n",
            "at most one kind: process model (a, b)",
        ),
        (
            "models:\n  - {name: a, model: m, normalize: {std: 0}}\n",
            "normalize: {mean, std}: std: Input should be greater than 0",
        ),
        (
            "models:\n  - {name: a, model: m, normalize: groups}\n",
            "normalize: give {mean, std}, group or group_rank, not 'groups'",
        ),
        ("models:\n  - {name: a, model: m, weight: .nan}\n", "weight must be a finite number"),
        ("models:\n  - {name: v, kind: verifier}\n", "kind: verifier needs 'verifier'"),
        (
            "models:\n  - {name: v, kind: verifier, verifier: python}\n",
            "verifier: python needs 'function'",
        ),
        (
            "models:\n  - {name: v, kind: verifier, verifier: math, model: m}\n",
            "model: not for kind: verifier",
        ),
        (
            "models:\n  - {name: v, kind: verifier, verifier: math, pattern: x}\n",
            "pattern: only for verifier: regex or format",
        ),
        ("models:\n  - {name: a, model: m, timeout_s: 3}\n", "timeout_s: only for kind: verifier"),
        ("models:\n  - {name: a}\n", "'model' is required"),
        (
            "models:\n  - {name: v, kind: verifier, verifier: math, on_error: .inf}\n",
            "on_error must be a finite number",
        ),
        (
            "models:\n  - {name: v, kind: verifier, verifier: python, function: nocolon}\n",
            "function",
        ),
        ("- a\n- b\n", "expected a mapping with a 'models' list"),
        ("models: [\n", "not valid YAML"),
    ],
)
def test_bad_files_are_named_and_explained(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ModelsFileError) as info:
        read_models_file(write(tmp_path, text))
    assert message in str(info.value)
    assert str(tmp_path) in str(info.value)  # which file


def test_a_missing_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ModelsFileError, match="cannot read models file"):
        read_models_file(tmp_path / "nope.yaml")


def test_settings_read_the_file_from_flag_or_environment(
    clean_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = write(tmp_path, GOOD)
    settings = parse_settings(["--models", str(path), "--device", "cpu"])
    assert settings.model is None and settings.models_file is not None
    assert settings.models_file.names == ["helpful", "safety.v2"]
    assert settings.served == "helpful+safety.v2"
    assert ServerSettings(model="m").models_file is None  # a plain --model server
    clean_env.setenv("REWARD_SERVER_MODELS", str(path))
    assert parse_settings([]).models_file == settings.models_file


@pytest.mark.parametrize(
    ("extra", "text", "needle"),
    [
        (["--model", "m"], GOOD, "give --model or --models, not both"),
        (["--adapter", "a"], GOOD, "--adapter does not apply to --models"),
        ([], "models:\n  - {name: a, model: m, colour: red}\n", "unknown key 'colour'"),
        ([], "models:\n  - {model: m}\n", "'name' is required"),
    ],
)
def test_bad_models_settings_are_usage_errors(
    clean_env: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    extra: list[str],
    text: str,
    needle: str,
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SystemExit) as exit_info:
        parse_settings(["--models", str(path), *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert needle in err
    assert len([ln for ln in err.splitlines() if "error:" in ln]) == 1


def test_an_empty_model_variable_gives_way_to_a_models_file(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The image sets REWARD_SERVER_MODEL; emptying it is how a container takes --models."""
    path = write(tmp_path, GOOD)
    clean_env.setenv("REWARD_SERVER_MODEL", "/models/reward")
    with pytest.raises(SystemExit):
        parse_settings(["--models", str(path)])
    assert "set REWARD_SERVER_MODEL= empty" in capsys.readouterr().err
    clean_env.setenv("REWARD_SERVER_MODEL", "")
    settings = parse_settings(["--models", str(path)])
    assert settings.model is None and settings.served == "helpful+safety.v2"
