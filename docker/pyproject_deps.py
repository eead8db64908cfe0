"""Print the requirements of pyproject.toml, one per line, for a cached dependency layer.

Used by docker/Dockerfile: installing the dependencies from pyproject.toml alone, before the
source is copied, keeps that (slow) image layer cached while the code changes.

    python pyproject_deps.py pyproject.toml [--extra NAME ...] [--no-base]

An extra may name the project itself (``vllm = ["remote-reward[server]", "vllm>=0.11"]``):
such a self-reference is replaced by the requirements of the extras it names, recursively,
so that pip is never asked for the project from an index. A marker on a self-reference is
added to each requirement it brings in. Lines are printed once, in first-seen order.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (e.g. an Ubuntu 22.04 CUDA base): pip vendors tomli.
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

try:
    from packaging.requirements import Requirement
except ModuleNotFoundError:  # a bare image venv: pip vendors packaging.
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[no-redef]


def normalize(name: str) -> str:
    """A project or extra name as PEP 503 and PEP 685 compare them."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _both(first: str | None, second: str | None) -> str | None:
    """Two environment markers that must both hold (None: no condition)."""
    if first is None or second is None:
        return first if second is None else second
    return f"({first}) and ({second})"


def _with_marker(line: str, marker: str | None) -> str:
    """``line`` that applies only where ``marker`` holds too."""
    if marker is None:
        return line
    req = Requirement(line)
    own = str(req.marker) if req.marker is not None else None
    req.marker = None
    return f"{req}; {_both(own, marker)}"


def _extras_in_order(line: str) -> list[str]:
    """The extras of a requirement as written (``Requirement.extras`` is a set)."""
    match = re.match(r"\s*[A-Za-z0-9][A-Za-z0-9._-]*\s*\[([^\]]*)\]", line)
    return [e.strip() for e in match.group(1).split(",") if e.strip()] if match else []


class _Resolver:
    """Expands a project's requirement lists, replacing references to the project itself."""

    def __init__(self, project: dict, source: Path) -> None:
        self.name = normalize(project["name"])
        self.source = source
        self.optional = {
            normalize(extra): list(lines)
            for extra, lines in project.get("optional-dependencies", {}).items()
        }
        self.lines: list[str] = []
        self._active: list[str] = []  # the extras being expanded, for cycles
        self._done: set[tuple[str, str | None]] = set()

    def add_lines(self, lines: list[str], marker: str | None = None) -> None:
        """Add ``lines`` (each under ``marker``), expanding self-references."""
        for line in lines:
            req = Requirement(line)
            if normalize(req.name) != self.name:
                text = _with_marker(line.strip(), marker)
                if text not in self.lines:
                    self.lines.append(text)
                continue
            own = str(req.marker) if req.marker is not None else None
            for extra in _extras_in_order(line):
                self.add_extra(extra, _both(own, marker))

    def add_extra(self, extra: str, marker: str | None = None) -> None:
        """Add the requirements of the optional group ``extra``."""
        name = normalize(extra)
        if name not in self.optional:
            raise SystemExit(f"{self.source}: no optional dependency group {extra!r}")
        # A cycle (an extra that names itself through others) adds nothing new: its lines
        # are being added already.
        if (name, marker) in self._done or name in self._active:
            return
        self._active.append(name)
        try:
            self.add_lines(self.optional[name], marker)
        finally:
            self._active.pop()
        self._done.add((name, marker))


def requirements(pyproject: Path, extras: list[str], *, base: bool = True) -> list[str]:
    """The base dependencies (unless ``base`` is false) followed by those of ``extras``.

    References to the project itself (``remote-reward[server]``) are expanded into the
    named extras' requirements, recursively; each line appears once.
    """
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    resolver = _Resolver(project, pyproject)
    if base:
        resolver.add_lines(list(project.get("dependencies", [])))
    for extra in extras:
        resolver.add_extra(extra)
    return resolver.lines


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pyproject", type=Path)
    parser.add_argument("--extra", action="append", default=[], help="optional group to add")
    parser.add_argument("--no-base", action="store_true", help="only the extras' requirements")
    args = parser.parse_args(argv)
    lines = requirements(args.pyproject, args.extra, base=not args.no_base)
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
