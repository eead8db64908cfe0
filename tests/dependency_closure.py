"""What a list of requirements installs, read from this environment's package metadata.

Used by test_client_install.py (the light client's allow-list) and test_docker.py (what
each image holds). Environment markers are evaluated for the running interpreter.
"""

from __future__ import annotations

import importlib.metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def dependency_closure(requirements: list[str], *, strict: bool = True) -> dict[str, str]:
    """Every distribution ``requirements`` pull in, recursively: canonical name -> version.

    Extras (``ray[serve]``) bring their own requirements. A requirement not installed here
    raises ``PackageNotFoundError``, or with ``strict=False`` is listed with version ``""``
    and nothing below it.
    """
    found: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(line) for line in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = importlib.metadata.distribution(req.name)
        except importlib.metadata.PackageNotFoundError:
            if strict:
                raise
            found.setdefault(key[0], "")
            continue
        found[canonicalize_name(dist.metadata["Name"])] = dist.version
        wanted = ["", *sorted(req.extras)]
        for line in dist.requires or []:
            sub = Requirement(line)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in wanted):
                sub.marker = None  # evaluated here, with the extras of ``req``
                todo.append(sub)
    return found
