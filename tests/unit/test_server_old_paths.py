"""The server's import paths from before the layered layout (issue 20) keep working for one
release, each with a DeprecationWarning that names the new path."""

from __future__ import annotations

import importlib
import re
import sys

import pytest

OLD_PATHS = [
    ("reward_server.app", "create_app", "reward_server.http.app"),
    ("reward_server.model", "RewardModel", "reward_server.engines.transformers"),
    ("reward_server.exceptions", "ModelLoadError", "reward_server.errors"),
    ("reward_server.ray_serve", "app", "reward_server.http.ray_serve"),
]


@pytest.mark.parametrize(("old", "name", "new"), OLD_PATHS, ids=[p[0] for p in OLD_PATHS])
def test_old_path_warns_and_gives_the_same_object(
    old: str, name: str, new: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(sys.modules, old, raising=False)  # run the module's code again
    with pytest.warns(DeprecationWarning, match=re.escape(new)):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)
