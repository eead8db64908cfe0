"""No repeated code inside the library packages (the ``duplicates`` tool, run as a process)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from helpers.repository import PACKAGES, ROOT


def test_no_repeated_code_inside_the_packages() -> None:
    # /usr/local/bin/duplicates on the developers' machines and CI, where `make test` sets
    # the gate: a missing tool fails there, and is skipped only on a user's machine.
    if shutil.which("duplicates") is None:
        if os.environ.get("REWARD_SERVER_TEST_DUPLICATES") == "1":
            pytest.fail("the duplicates tool is not on PATH", pytrace=False)
        pytest.skip("the duplicates tool is not on PATH")
    for package in PACKAGES:
        out = subprocess.run(
            ["duplicates", "--repo", str(ROOT / package), "--seconds", "60"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        first = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
        assert first.startswith("no duplicates"), f"{package}:\n{out.stdout}"
