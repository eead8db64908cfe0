"""The verifiers themselves, built once in each worker process: ``build(options)`` gives a
function ``(task) -> result`` of one :class:`~reward_server.verifiers.items.Task`.

- ``math``: :func:`math_score` (math-verify, see :mod:`reward_server.verifiers.answers`);
- ``exact``: the final answer (or the whole stripped response when it has none) equals the
  label as a string;
- ``regex``: ``re.search(pattern, response)``, the pattern from the options or the label;
- ``tool_call``: the response's tool calls against the label's expected calls
  (:mod:`reward_server.verifiers.tool_calls`); with ``trajectory``, every call of the
  assistant turns after the last user message, in order;
- ``format``: the response's shape (:mod:`reward_server.verifiers.formats`), its
  ``reasoning_content`` (kept) written before it between the reasoning tags;
- ``python``: the user's function, imported from a module or loaded from a file, called as
  ``f(prompt, response, label)``, with ``tools=`` and ``tool_calls=`` too when it takes them
  (by name, or ``**kwargs``).

Built-ins return 1.0 or 0.0 (``tool_call`` and ``format`` a :class:`Graded` score with the
reason for less than full marks) and raise ValueError for an unusable label (the item's
reason is then ``error``). Only the workers import this module's heavy parts: math-verify
(and SymPy) is imported when a ``math`` verifier is built.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
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
from reward_server.verifiers.formats import FormatOptions, format_score
from reward_server.verifiers.graders.python_sandbox import GraderLimits
from reward_server.verifiers.items import Graded, Task
from reward_server.verifiers.options import VerifierOptions, split_function
from reward_server.verifiers.tool_calls import ToolCallOptions, score_tool_calls

__all__ = ["Check", "build", "load_function", "math_score"]

#: A verifier as the worker calls it: ``f(task)``.
Check = Callable[[Task], Any]
#: A rule of three arguments: ``f(prompt, response, label)``.
Rule = Callable[[Any, str, Any], Any]

#: Parsed labels kept per worker: a GRPO group shares one label, a dataset repeats them.
_GOLD_CACHE = 4096


def build(options: VerifierOptions) -> Check:
    """The verifier ``options`` name, ready to call (import errors propagate)."""
    if options.verifier == "tool_call":
        return _tool_call_check(options.tool_call or ToolCallOptions(), options.trajectory)
    if options.verifier == "format":
        return _format_check(options.format or FormatOptions())
    if options.verifier == "grader":
        from reward_server.verifiers.graders.check import grader_check

        limits = options.grader_limits or GraderLimits()
        return grader_check(options.grader, limits, options.embedding_model)
    rule: Rule
    if options.verifier == "math":
        rule = _math_check()
    elif options.verifier == "exact":
        rule = exact_score
    elif options.verifier == "regex":
        rule = _regex_check(options.pattern)
    else:
        assert options.function is not None
        return _python_check(load_function(options.function))
    return lambda task: rule(task.prompt, task.response, task.label)


def _python_check(function: Callable[..., Any]) -> Check:
    """A user's function as a check: ``f(prompt, response, label)``, with ``tools`` and
    ``tool_calls`` as keywords when its signature names them or takes ``**kwargs``."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: three arguments
        parameters = ()  # type: ignore[assignment]
    extra = {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
    extra |= {p.name for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        extra |= {"tools", "tool_calls"}
    wants = [name for name in ("tools", "tool_calls") if name in extra]

    def check(task: Task) -> Any:
        given = {name: getattr(task, name) for name in wants}
        return function(task.prompt, task.response, task.label, **given)

    return check


def _assistant_calls(task: Task) -> list[Any] | None:
    """Every tool call of the assistant turns after the last user message, the response's
    last; None when none made one (the response's text is then read)."""
    calls: list[Any] = []
    if isinstance(task.prompt, list):
        for message in task.prompt:
            if message.get("role") == "user":
                calls = []
            elif message.get("role") == "assistant":
                calls += list(message.get("tool_calls") or [])
    calls += list(task.tool_calls or [])
    return calls or None


def _tool_call_check(options: ToolCallOptions, trajectory: bool) -> Check:
    def check(task: Task) -> Graded:
        calls = _assistant_calls(task) if trajectory else task.tool_calls
        score, note = score_tool_calls(calls, task.response, task.label, task.tools, options)
        return Graded(score, note)

    return check


def _format_check(options: FormatOptions) -> Check:
    opening, closing = options.reasoning_tags

    def check(task: Task) -> Graded:
        response = task.response
        if task.reasoning:  # sent apart (reasoning_content): in front, as a template writes it
            response = f"{opening}{task.reasoning}{closing}{response}"
        return Graded(*format_score(response, options))

    return check


def _math_check() -> Rule:
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


def _regex_check(pattern: str | None) -> Rule:
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


def load_function(spec: str) -> Callable[..., Any]:
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
