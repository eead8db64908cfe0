"""The program in a response: :func:`extract_program` finds it and its language.

A response usually holds its program in a fenced code block (three or more backticks or
tildes, an optional language tag after the opening fence), often beside other blocks (an
example's input or output). The program is:

1. the last complete block whose tag names one of the entry's languages (``py``,
   ``python3``, ``c++``, ``js``, ... : any alias the sandbox knows), in that language;
2. else the last complete block without a tag, in the entry's first language;
3. else the last complete block with another tag: a language the entry does not allow
   (or no language at all), which the verifier answers with ``compile_error`` on every test;
4. else the whole response, in the entry's first language.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Program", "extract_program", "fenced_blocks"]

#: An opening fence at the start of a line (up to three spaces of indent, as CommonMark),
#: its tag, the body, and a closing fence of the same character at least as long.
_FENCE = re.compile(
    r"^[ ]{0,3}(?P<fence>`{3,}|~{3,})[ \t]*(?P<tag>[^\n`]*?)[ \t]*\n"
    r"(?P<body>.*?)"
    r"^[ ]{0,3}(?P=fence)[`~]*[ \t]*$",
    re.MULTILINE | re.DOTALL,
)


@dataclass(frozen=True, slots=True)
class Program:
    """The program to test: its ``source`` and ``language`` (a name of the sandbox's
    languages), or ``refused``: why it cannot run (a language the entry does not allow)."""

    source: str
    language: str
    refused: str | None = None


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """Every complete fenced block of ``text``: (tag, body), in order (the tag lowercased,
    its first word only: ``python title="x"`` -> ``python``)."""
    blocks = []
    for match in _FENCE.finditer(text):
        words = match["tag"].split()
        tag = words[0].lower().lstrip("{.").rstrip("}") if words else ""
        blocks.append((tag, match["body"]))
    return blocks


def extract_program(
    response: str, languages: Sequence[str], resolve: Callable[[str], str | None]
) -> Program:
    """The program of ``response`` for an entry that allows ``languages`` (names; the first
    is the default); ``resolve`` maps a tag to a language name, None for no language."""
    default = languages[0]
    blocks = fenced_blocks(response)
    for tag, body in reversed(blocks):
        if tag and resolve(tag) in languages:
            return Program(body, resolve(tag) or default)
    for tag, body in reversed(blocks):
        if not tag:
            return Program(body, default)
    if blocks:
        tag, body = blocks[-1]
        name = resolve(tag)
        what = f"language {name!r}" if name else f"{tag!r}, not a language this server runs,"
        allowed = ", ".join(languages)
        return Program(body, name or tag, refused=f"the program is in {what} (allowed: {allowed})")
    return Program(response, default)
