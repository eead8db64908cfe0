"""The verifiers themselves, built once in each worker process: ``build(options)`` gives a
function ``(prompt, response, label) -> result``.

- ``math``: :func:`math_score` (math-verify, see :mod:`reward_server.verifiers.answers`);
- ``exact``: the final answer (or the whole stripped response when it has none) equals the
  label as a string;
- ``regex``: ``re.search(pattern, response)``, the pattern from the options or the label;
- ``python``: the user's function, imported from a module or loaded from a file.

Built-ins return 1.0 or 0.0 and raise ValueError for an unusable label (the item's reason
is then ``error``). Only the workers import this module's heavy parts: math-verify (and
SymPy) is imported when a ``math`` verifier is built.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reward_server.verifiers.answers import (
    as_latex,
    boxed,
    exact_texts,
    final_answer,
    label_texts,
)
from reward_server.verifiers.options import VerifierOptions, split_function

__all__ = ["Check", "build", "load_function", "math_score"]

#: A verifier as the worker calls it: ``f(prompt, response, label)``.
Check = Callable[[Any, str, Any], Any]

#: Parsed labels kept per worker: a GRPO group shares one label, a dataset repeats them.
_GOLD_CACHE = 4096


def build(options: VerifierOptions) -> Check:
    """The verifier ``options`` name, ready to call (import errors propagate)."""
    if options.verifier == "math":
        return _math_check()
    if options.verifier == "exact":
        return exact_score
    if options.verifier == "regex":
        return _regex_check(options.pattern)
    assert options.function is not None
    return load_function(options.function)


def _math_check() -> Check:
    try:
        import math_verify
    except ImportError as exc:
        raise ImportError(
            f"the math verifier needs the math-verify package ({exc}): "
            "pip install 'remote-reward[server]'"
        ) from exc
    # The worker disables math-verify's own signal.alarm timeouts (one alarm of its own
    # covers the whole item, see worker.py); math-verify then warns once that they are off.
    logging.getLogger("math_verify").setLevel(logging.ERROR)

    @functools.lru_cache(maxsize=_GOLD_CACHE)
    def gold(text: str) -> list[Any]:
        return math_verify.parse(as_latex(text), parsing_timeout=None)  # type: ignore[arg-type]

    def check(prompt: Any, response: str, label: Any) -> float:
        return math_score(response, label, gold=gold)

    check("", "\\boxed{\\frac{1}{2}}", "0.5")  # load the LaTeX grammar before the first item
    return check


def math_score(response: str, label: Any, gold: Callable[[str], list[Any]] | None = None) -> float:
    """1.0 when the response's final answer equals one of the label's answers by math-verify.

    ``gold`` parses one label text (a cache in the workers); math-verify's own timeouts are
    off here: the caller bounds the time (the worker's alarm, the pool's deadline).
    """
    from math_verify import parse, verify

    def parse_gold(text: str) -> list[Any]:
        return parse(as_latex(text), parsing_timeout=None)  # type: ignore[arg-type]

    golds = [g for text in label_texts(label) for g in (gold or parse_gold)(text)]
    if not golds:
        raise ValueError(f"math-verify finds no answer in the label {label!r}")
    answer = final_answer(response)
    if answer is None:
        return 0.0
    pred = parse(boxed(answer), parsing_timeout=None)  # type: ignore[arg-type]
    return 1.0 if verify(golds, pred, timeout_seconds=None) else 0.0


def exact_score(prompt: Any, response: str, label: Any) -> float:
    """1.0 when the final answer (else the stripped response) equals the label as a string."""
    answer = final_answer(response)
    text = (answer if answer is not None else response).strip()
    return 1.0 if text in exact_texts(label) else 0.0


def _regex_check(pattern: str | None) -> Check:
    if pattern is not None:
        compiled = re.compile(pattern)

        def fixed(prompt: Any, response: str, label: Any) -> float:
            return 1.0 if compiled.search(response) else 0.0

        return fixed

    def from_label(prompt: Any, response: str, label: Any) -> float:
        if not isinstance(label, str) or not label:
            raise ValueError("the regex verifier has no pattern: the label must be one (a string)")
        return 1.0 if re.search(label, response) else 0.0

    return from_label


def load_function(spec: str) -> Check:
    """The callable named by ``"module:attr"`` or ``"/path/file.py:attr"`` (dots allowed in
    ``attr``); ImportError, FileNotFoundError, AttributeError or TypeError when it is not."""
    where, attr = split_function(spec)
    if where.endswith(".py") or "/" in where:
        path = Path(where)
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {where}")
        name = "_reward_verifier_" + hashlib.sha256(where.encode()).hexdigest()[:16]
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"cannot load {where} as a Python module")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise AttributeError(f"{where} has no attribute {attr!r}") from None
    if not callable(target):
        raise TypeError(f"{where}:{attr} is a {type(target).__name__}, not a function")
    return target
