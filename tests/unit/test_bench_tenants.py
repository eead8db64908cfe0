"""bench.tenants' keys file: tenants A and B as the server reads them, B's weight as given
(``--b-weight``, a policy to compare with equal weights)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.tenants import KEYS, build_parser, keys_file
from reward_server.config.tenants import read_tenants_file


@pytest.mark.parametrize("b_weight", [1.0, 2.0, 0.5])
def test_the_keys_file_gives_b_its_weight(tmp_path: Path, b_weight: float) -> None:
    table = read_tenants_file(keys_file(tmp_path / "keys.yaml", b_weight))
    a, b = (table.authenticate(KEYS[name]) for name in ("A", "B"))
    assert a is not None and b is not None
    assert (a.name, a.weight) == ("A", 1.0)
    assert (b.name, b.weight) == ("B", b_weight)


def test_b_weight_is_one_unless_given() -> None:
    assert build_parser().parse_args([]).b_weight == 1.0
    assert build_parser().parse_args(["--b-weight", "2"]).b_weight == 2.0
