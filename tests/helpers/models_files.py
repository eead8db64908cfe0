"""The files a test server reads: a models file (``--models``) and a keys file (``--api-keys``),
written from their entries."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from reward_server.config.tenants import hash_key

#: tests/verifier_functions.py, whose functions the tests' python verifiers run.
VERIFIER_FUNCTIONS = Path(__file__).resolve().parents[1] / "verifier_functions.py"


def write_models(
    folder: Path, entries: Iterable[Mapping[str, Any]], *, name: str = "models.yaml", **top: Any
) -> Path:
    """A models file of ``entries`` (and the file's own keys ``top``: ``aggregate``, ...)
    as ``folder / name``; returns its path."""
    path = folder / name
    body = {"models": [dict(entry) for entry in entries], **top}
    path.write_text(yaml.safe_dump(body), encoding="utf-8")
    return path


def next_models_file(folder: Path, entries: Iterable[Mapping[str, Any]], **top: Any) -> Path:
    """:func:`write_models` under a name not yet taken in ``folder`` (``models-N.yaml``)."""
    name = f"models-{len(list(folder.glob('models-*.yaml')))}.yaml"
    return write_models(folder, entries, name=name, **top)


def python_verifier(name: str, function: str, **extra: Any) -> dict[str, Any]:
    """A ``kind: verifier``, ``verifier: python`` entry running ``function``
    (``path/to/file.py:name`` or ``module:name``)."""
    return {"name": name, "kind": "verifier", "verifier": "python", "function": function, **extra}


def verifier_function(name: str) -> str:
    """``function`` of a python verifier entry for tests/verifier_functions.py's ``name``."""
    return f"{VERIFIER_FUNCTIONS}:{name}"


def length_verifier(**extra: Any) -> dict[str, Any]:
    """The python verifier ``length`` (tests/verifier_functions.py: a response's length)."""
    return python_verifier("length", verifier_function("length"), **extra)


def keys_yaml(*entries: tuple[str, str], extra: str = "") -> str:
    """A keys file of ``(name, key)`` entries: only the keys' hashes are written; ``extra``
    is a line added to every tenant (``weight: 2``)."""
    lines = ["tenants:"]
    for name, key in entries:
        lines += [f"  - name: {name}", f'    key_sha256: "{hash_key(key)}"']
        lines += [f"    {extra}"] if extra else []
    return "\n".join(lines) + "\n"


def write_keys(folder: Path, tenants: Iterable[Mapping[str, Any]], name: str = "keys.yaml") -> Path:
    """A keys file of ``tenants`` (each its keys as the file has them: ``name``,
    ``key_sha256``, ``weight``, ...) as ``folder / name``; returns its path."""
    path = folder / name
    path.write_text(yaml.safe_dump({"tenants": [dict(t) for t in tenants]}), encoding="utf-8")
    return path
