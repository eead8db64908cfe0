"""Reporting: the reward curve is optional (matplotlib is an extra); the progress bar says
when the run waits for the reward server."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ppo_client.config import PPOConfig
from ppo_client.reporting import RunReport, plot_reward_curve
from reward_client import RetryEvent

HISTORY = [
    {"step": 1, "objective/scores": 0.1, "objective/kl": 0.0},
    {"step": 2, "objective/scores": 0.3, "objective/kl": 0.02},
]


def test_reward_curve_is_a_png(tmp_path: Path) -> None:
    path = tmp_path / "reward_curve.png"
    assert plot_reward_curve(HISTORY, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_the_curve_is_skipped_with_a_log_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # None in sys.modules makes `import matplotlib...` raise ImportError.
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path = tmp_path / "reward_curve.png"
    with caplog.at_level("WARNING", logger="ppo_client.reporting"):
        assert not plot_reward_curve(HISTORY, path)
    assert not path.exists()
    assert "matplotlib is not installed" in caplog.text


def test_progress_bar_says_when_the_run_waits_for_the_reward_server(tmp_path: Path) -> None:
    from accelerate import Accelerator

    report = RunReport(PPOConfig(output_dir=str(tmp_path)), Accelerator(cpu=True), tmp_path, 3)
    report.start(0, {})
    try:
        event = RetryEvent(
            method="POST",
            url="http://rm:8000/score",
            error="ConnectError: refused",
            status=None,
            attempt=2,
            waited_s=12.3,
            budget_s=600.0,
            next_delay_s=4.0,
            next_url="http://rm:8000/score",
        )
        report.waiting(event)
        assert report._progress.desc == "PPO (waiting for the reward server: 12 s of 600 s)"
        report.log(1, {"objective/scores": 0.5, "objective/kl": 0.1})
        assert report._progress.desc == "PPO"  # the answer came: back to the plain bar
    finally:
        report.close()
