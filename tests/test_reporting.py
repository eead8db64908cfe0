"""Reporting: the reward curve is optional (matplotlib is an extra)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ppo_client.reporting import plot_reward_curve

HISTORY = [
    {"step": 1, "objective/scores": 0.1, "objective/kl": 0.0},
    {"step": 2, "objective/scores": 0.3, "objective/kl": 0.02},
]


def test_reward_curve_is_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
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
