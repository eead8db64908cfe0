"""Print the requirements of pyproject.toml, one per line, for a cached dependency layer.

Used by docker/Dockerfile: installing the dependencies from pyproject.toml alone, before the
source is copied, keeps that (slow) image layer cached while the code changes.

    python pyproject_deps.py pyproject.toml [--extra NAME ...] [--no-base]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (e.g. an Ubuntu 22.04 CUDA base): pip vendors tomli.
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]


def requirements(pyproject: Path, extras: list[str], *, base: bool = True) -> list[str]:
    """The base dependencies (unless ``base`` is false) followed by those of ``extras``."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    reqs: list[str] = list(project.get("dependencies", [])) if base else []
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise SystemExit(f"{pyproject}: no optional dependency group {extra!r}")
        reqs.extend(optional[extra])
    return reqs


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
