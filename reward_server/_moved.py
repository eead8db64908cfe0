"""The warning of an import path kept for one release after its code moved."""

import warnings


def warn_moved(old: str, new: str) -> None:
    """Warn the importer of module ``old`` that it is deprecated and ``new`` replaces it."""
    warnings.warn(f"{old} is deprecated; use {new}", DeprecationWarning, stacklevel=3)
