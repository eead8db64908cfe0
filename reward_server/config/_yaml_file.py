"""Reading a YAML settings file (the models file, the keys file) with one clear error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

__all__ = ["read_yaml_file"]


def read_yaml_file(
    path: str | Path, what: str, error: type[Exception], *, quote_yaml_error: bool = True
) -> Any:
    """The parsed YAML at ``path``; ``error`` (one line) when it cannot be read or parsed.

    ``quote_yaml_error`` False gives only the line and column of a syntax error: the parser's
    message quotes the line it stopped at, which in a keys file may hold a key.
    """
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {what} {path}: {exc}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        if quote_yaml_error:
            detail = ": " + " ".join(str(exc).split())
        else:
            mark = getattr(exc, "problem_mark", None)
            detail = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise error(f"{path} is not valid YAML{detail}") from None
