"""The venv holds exactly the versions of the lock that `make setup` installed it with
(constraints.txt, made by `make lock`): a fresh clone tests the code CI tested."""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$")


def _lock() -> Path:
    """The lock make test says the venv was installed with (constraints.txt by default)."""
    name = os.environ.get("REWARD_SERVER_TEST_LOCK", "constraints.txt")
    if not name:
        pytest.skip("make setup ran with LOCK= (no lock): nothing to compare")
    return ROOT / name


def _normal(name: str) -> str:
    """A distribution name as PEP 503 compares them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = PIN.match(line)
        assert match, f"{path.name}: not a 'name==version' pin: {line!r}"
        pins[match[1]] = match[2]
    return pins


def test_every_locked_package_is_installed_at_its_version() -> None:
    pins = _pins(_lock())
    assert len(pins) > 100  # the whole closure, not a few top-level names
    wrong = {}
    for name, version in pins.items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            wrong[name] = (version, installed)
    assert not wrong, f"locked -> installed (run make setup): {wrong}"


def test_the_lock_pins_what_the_project_requires() -> None:
    """Each direct requirement of the extras make setup installs is pinned, so no new
    dependency floats unseen (make lock adds it)."""
    pins = {_normal(name) for name in _pins(_lock())}
    requires = metadata.requires("remote-reward") or []
    names = {_normal(re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0]) for req in requires}
    names -= {"remote-reward", "vllm"}  # the project itself; vllm is the GPU alternative
    assert names - pins == set()
