"""Other servers' protocols on this server (vLLM's, TEI's): what their tests score."""

from __future__ import annotations

#: Texts of several lengths, one a single character.
TEXTS = ["The answer is 4.", "hello there, general", "a b c d e f g", "x"]
