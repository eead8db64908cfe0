"""The suite's own layout: no test module imports another (what tests share lives in
tests/helpers/, the helper modules beside it and the conftest fixtures), and no helper
imports a test module."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def imported_modules(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, module)`` of every import in ``tree``, top level or not, and of every
    ``importlib.import_module("...")`` or ``__import__("...")`` of a constant name."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and getattr(node.func, "attr", getattr(node.func, "id", ""))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def imported_test_modules(source: str) -> list[str]:
    """The test modules (``test_*``) that ``source`` imports, as ``line: module``."""
    return [
        f"{line}: {name}"
        for line, name in imported_modules(ast.parse(source))
        if name.split(".")[0].startswith("test_")
    ]


def test_no_test_module_imports_another() -> None:
    found = {
        str(path.relative_to(TESTS)): imports
        for path in sorted(TESTS.rglob("*.py"))
        if (imports := imported_test_modules(path.read_text(encoding="utf-8")))
    }
    assert not found, f"import what tests share from tests/helpers/, not a test module: {found}"


def test_the_check_sees_every_way_of_importing_a_test_module() -> None:
    source = (
        "import test_a\n"
        "from test_b import x\n"
        "def f():\n"
        "    from test_c.sub import y\n"
        "    return importlib.import_module('test_d')\n"
        "import helpers.test_like, testing\n"
        "from . import test_relative\n"
    )
    assert imported_test_modules(source) == ["1: test_a", "2: test_b", "4: test_c.sub", "5: test_d"]
