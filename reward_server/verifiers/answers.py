"""Final answers and reference labels as text: what the built-in verifiers compare.

Pure string functions (no math-verify import), shared by the workers, the tests and the
benchmark:

- :func:`final_answer`: the content of a response's last complete ``\\boxed{...}`` (nested
  and escaped braces handled), else its last number, else None;
- :func:`label_texts`: an item's label as one or more reference answers (a string, a
  number, or a list of them: any one may match);
- :func:`as_latex` and :func:`boxed`: the texts the ``math`` verifier hands to
  ``math_verify.parse`` for a label and for an answer.

How ``math`` decides, so that a user can reproduce a score by calling math-verify::

    from math_verify import parse, verify
    gold = [g for text in label_texts(label) for g in parse(as_latex(text))]
    answer = final_answer(response)
    score = 0.0 if answer is None else float(verify(gold, parse(boxed(answer))))

with math-verify's default extraction configs (``LatexExtractionConfig()``,
``ExprExtractionConfig()``). :func:`boxed` puts the extracted answer back in ``\\boxed{}``;
:func:`as_latex` leaves a label that already carries LaTeX delimiters (an unescaped ``$``,
``\\(``, ``\\[`` or ``\\boxed``) as it is and wraps any other in ``\\boxed{...}`` (as
verl's math-verify reward does), because math-verify reads LaTeX only inside delimiters:
``parse("\\\\{1,2\\\\}")`` finds nothing, ``parse("\\\\boxed{\\\\{1,2\\\\}}")`` the set
{1, 2}.

A response with one ``\\boxed{}``, or none and a plain final number, gets the score that
math-verify's own extraction over the whole response (``parse(response)``) gives, as the
table of tests/integration/test_verifiers.py checks. They differ
when a response holds several boxes (math-verify takes them all, as a set; here the last
one is the answer) and when a response without a box ends in LaTeX such as
``$\\frac{1}{2}$`` (here the last number, 2, is the answer: box final answers). Labels that
math-verify cannot parse, and items without a label, are errors (``on_error``, reason
``error``), not silent zeros. math-verify's own ``signal.alarm`` timeouts are switched off in
the workers (``parsing_timeout=None``, ``timeout_seconds=None``): one alarm per item in the
worker bounds the whole item instead, see :mod:`reward_server.verifiers.worker`.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Any

__all__ = [
    "as_latex",
    "boxed",
    "exact_texts",
    "final_answer",
    "label_texts",
    "last_boxed",
    "last_number",
]

_BOXED = re.compile(r"\\boxed\s*\{")
#: A number as written in prose: an optional minus (not one joining two terms, as in "5-3"),
#: digits with optional thousands separators, an optional decimal part and an optional
#: "/denominator"; or a bare decimal such as ".5".
_NUMBER = re.compile(
    r"(?:(?<![\w)\]}])-)?"
    r"(?<![\w.])"
    r"(?:(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?|\.\d+)"
)
_DELIMITER = re.compile(r"(?<!\\)\$|\\\(|\\\[|\\boxed")


def _closing_brace(text: str, start: int) -> int | None:
    """Index of the brace closing the one at ``start`` (``\\{`` and ``\\}`` are escaped)."""
    depth = 0
    i = start
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """The stripped content of the last complete ``\\boxed{...}`` in ``text``, or None.

    A ``\\boxed{`` left open (a generation cut short) is skipped for an earlier complete one.
    """
    for match in reversed(list(_BOXED.finditer(text))):
        end = _closing_brace(text, match.end() - 1)
        if end is not None:
            return text[match.end() : end].strip()
    return None


def last_number(text: str) -> str | None:
    """The last number in ``text`` without thousands separators (``"1,000"`` -> ``"1000"``)."""
    numbers = _NUMBER.findall(text)
    return numbers[-1].replace(",", "") if numbers else None


def final_answer(response: str) -> str | None:
    """The response's final answer: its last ``\\boxed{}`` content, else its last number."""
    boxed = last_boxed(response)
    return boxed if boxed is not None else last_number(response)


def _number_text(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        raise ValueError(f"the label {value} is not a finite number")
    text = repr(value)
    # 1e-07 would read as e - 7 in LaTeX: write every float positionally.
    return format(Decimal(text), "f") if "e" in text or "E" in text else text


def label_texts(label: Any) -> list[str]:
    """An item's reference answers as stripped strings (ValueError for an unusable label).

    A string is one answer; a number is written out (``0.5`` -> ``"0.5"``, ``1e-7`` ->
    ``"0.0000001"``); a list holds alternatives, any of which may match.
    """
    if label is None:
        raise ValueError("the item has no label (the reference answer)")
    if isinstance(label, bool):
        raise ValueError("a label must be a string, a number or a list of them, not a boolean")
    if isinstance(label, int | float):
        return [_number_text(label)]
    if isinstance(label, str):
        if not label.strip():
            raise ValueError("the label is empty")
        return [label.strip()]
    if isinstance(label, list | tuple) and label:
        return [text for item in label for text in label_texts(item)]
    raise ValueError(
        f"a label must be a string, a number or a list of them, not {type(label).__name__}"
    )


def exact_texts(label: Any) -> list[str]:
    """The strings ``exact`` compares with: :func:`label_texts`, or the label as JSON when it
    is another JSON value (a boolean or an object)."""
    if isinstance(label, bool | dict):
        return [json.dumps(label)]
    return label_texts(label)


def as_latex(text: str) -> str:
    """``text`` as math-verify's LaTeX extraction reads it: as it is when it carries LaTeX
    delimiters, else inside ``\\boxed{...}``."""
    return text if _DELIMITER.search(text) else boxed(text)


def boxed(answer: str) -> str:
    """``answer`` inside ``\\boxed{...}``."""
    return "\\boxed{" + answer + "}"
