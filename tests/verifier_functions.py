"""Python verifiers for tests/integration/test_verifiers.py, imported by the pool's worker processes as
``verifier_functions:NAME`` (tests/ is on the workers' sys.path, as on pytest's)."""

from __future__ import annotations

import ctypes
import math
import os
import signal
import sys
import time
from typing import Any

NOT_CALLABLE = 3


def length(prompt: Any, response: str, label: Any) -> float:
    """A float: the response's length."""
    return float(len(response))


def by_label(prompt: Any, response: str, label: Any) -> Any:
    """One behaviour per label, so that one pool shows them all (and all in one call)."""
    if isinstance(label, dict):  # {"record": file, "hang": bool, "nap": s}: note the call
        with open(label["record"], "a", encoding="utf-8") as record:
            record.write(response + "\n")
        if label.get("hang"):
            time.sleep(1e9)
        time.sleep(label.get("nap", 0.0))
        return float(len(response))
    if label == "dict":
        return {"score": 0.25, "length": len(response), "has_prompt": prompt is not None}
    if label == "sleep":
        time.sleep(1e9)
    if label == "spin":
        while True:
            pass
    if label == "ignore_term":  # SIGTERM does nothing: the pool must SIGKILL
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(1e9)
    if label == "raise":
        raise ValueError(f"no verdict for {response!r}")
    if label == "exit":
        os._exit(3)
    if label == "segfault":
        ctypes.string_at(0)
    if label == "nan":
        return math.nan
    if label == "inf_extra":
        return {"score": 1.0, "bad": math.inf}
    if label == "string":
        return "1.0"
    if label == "no_score":
        return {"accuracy": 1.0}
    if label == "pid":
        return float(os.getpid())
    if label == "torch":
        return float("torch" in sys.modules)
    return float(len(response))


def field_a(prompt: Any, response: str, label: Any) -> float:
    """The label's ``a`` (a number, or "nan"): the reward signals' tests set each score."""
    return float(label["a"])


def field_b(prompt: Any, response: str, label: Any) -> float:
    """The label's ``b``: a second component whose scores the test sets apart from ``a``'s."""
    return float(label["b"])
