"""Structure limits of the library packages: one job per module.

ruff enforces complexity (C901, max 12) and statement counts (PLR0915) through
pyproject.toml; this file adds what ruff does not measure: the length of functions and of
modules. Classes have no limit of their own: a class is split by job (the model registry
and the scoring pipeline), not to fit a number. Repeated code:
test_structure_duplicates.py; torch-free imports: test_server_structure_imports.py.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from helpers.repository import PACKAGES, ROOT

MAX_FUNCTION_LINES = 80
#: Module lengths (lines, exclusive): one job per module, and the client split by noun.
MAX_MODULE_LINES = {
    "reward_client": 400,
    "reward_server": 600,
    "ppo_client": 600,
    "settings_cli": 400,
}


def _sources() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _spans(tree: ast.AST) -> Iterator[tuple[str, str, int]]:
    """(kind, qualified name, lines) of every function and class, decorators excluded."""

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                name = f"{prefix}{child.name}"
                assert child.end_lineno is not None
                yield kind, name, child.end_lineno - child.lineno + 1
                yield from walk(child, f"{name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def test_span_counter_measures_from_def_to_last_line() -> None:
    source = "@decorator\ndef f():\n    x = 1\n    return x\n\nclass C:\n    def g(self):\n        pass\n"
    assert list(_spans(ast.parse(source))) == [
        ("function", "f", 3),
        ("class", "C", 3),
        ("function", "C.g", 2),
    ]


def test_no_long_functions() -> None:
    too_long = []
    for path in _sources():
        for kind, name, lines in _spans(ast.parse(path.read_text(), str(path))):
            if kind == "function" and lines > MAX_FUNCTION_LINES:
                too_long.append(f"{path.relative_to(ROOT)}: {kind} {name} has {lines} lines")
    assert not too_long, "\n".join(too_long)


def test_no_long_modules() -> None:
    too_long = []
    for package, limit in MAX_MODULE_LINES.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            lines = len(path.read_text().splitlines())
            if lines >= limit:
                too_long.append(f"{path.relative_to(ROOT)} has {lines} lines (limit {limit})")
    assert not too_long, "\n".join(too_long)
