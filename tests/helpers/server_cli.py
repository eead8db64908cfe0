"""The ``reward-server`` command line in tests: an API key, and servers whose model does not
load (each case's flags, and the one error line it must give)."""

from __future__ import annotations

import json
from pathlib import Path

from helpers.posting import bearer

KEY = "test-key-0123456789"
AUTH = bearer(KEY)


def custom_code_model(folder: Path) -> Path:
    """A model folder whose config names code of its own (auto_map), like many hub models."""
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "custom-x",
                "architectures": ["XForSequenceClassification"],
                "auto_map": {"AutoConfig": "cfg.XConfig"},
            }
        )
    )
    (folder / "cfg.py").write_text(
        "from transformers import PretrainedConfig\n\n\n"
        "class XConfig(PretrainedConfig):\n    model_type = 'custom-x'\n"
    )
    return folder


LOAD_FAILURES = ["not a model", "bad adapter", "needs its own code"]


def load_failure_args(case: str, tmp_path: Path, gpt2_rm: Path) -> list[str]:
    """The flags of a server whose model does not load, by ``case`` (LOAD_FAILURES)."""
    if case == "needs its own code":
        custom_code_model(tmp_path / "custom")
    return {
        "not a model": ["--model", str(tmp_path)],
        "bad adapter": ["--model", str(gpt2_rm), "--adapter", str(tmp_path / "no-adapter")],
        "needs its own code": ["--model", str(tmp_path / "custom")],
    }[case]


def assert_one_error_line(stderr: str, case: str, model: str) -> None:
    """A load failure's stderr: one error line naming the model, no traceback."""
    assert "Traceback" not in stderr
    lines = [ln for ln in stderr.splitlines() if ln.startswith("reward-server: error:")]
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"reward-server: error: could not load model {model}: ")
    assert len(lines[0]) > len("reward-server: error: could not load model : ") + len(model)
    # transformers asks for trust_remote_code=True; the line names the flag that does it
    assert ("--trust-remote-code" in lines[0]) is (case == "needs its own code")
