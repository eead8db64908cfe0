"""One place for scheduling: every queue of work, batch window and tenant turn of the server
lives in ``reward_server/scheduling/``.

The rule, checked on the source of every module of ``reward_server`` outside
``reward_server/scheduling/`` (with ``ast``, so strings and comments do not count):

1. No queue is created there: no call of ``asyncio.Queue``, ``asyncio.PriorityQueue``,
   ``asyncio.LifoQueue``, ``collections.deque``, ``queue.Queue``, ``queue.SimpleQueue``,
   ``queue.LifoQueue`` or ``queue.PriorityQueue`` (however imported: ``import asyncio``,
   ``from collections import deque``, an alias), and no import of ``heapq``.
2. No class, function or method there is named for a scheduling job. Names are split into
   words at ``_`` and at camelCase humps; a class is marked by a word of
   :data:`CLASS_MARKS` (``TenantQueues``, ``DeficitRoundRobin``, ``Window``, ``Batcher``, a
   ``...Scheduler``; exceptions, ``...Error``, are the error layer's and do not count), a
   function or method by a word of :data:`FUNCTION_MARKS` (``collect_window``,
   ``end_turn``, ``turn_tokens``; a chat's ``turns``, plural, is text, not a tenant's turn).
   ``queued`` counters, ``max_queue`` settings and ``track_queue`` metrics do not count.

A module that must break the rule for now is listed in :data:`EXEMPT` with the reason; the
list can only shrink (a listed module that no longer breaks the rule fails the test too).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "reward_server"
SCHEDULING = ROOT / "scheduling"

#: Calls that create a queue, by qualified name.
QUEUES = {
    "asyncio.Queue",
    "asyncio.PriorityQueue",
    "asyncio.LifoQueue",
    "asyncio.queues.Queue",
    "collections.deque",
    "queue.Queue",
    "queue.SimpleQueue",
    "queue.LifoQueue",
    "queue.PriorityQueue",
}
#: Modules whose import alone is a queue (a heap of work).
QUEUE_MODULES = {"heapq"}
#: Words that name a scheduling job in a class name, and in a function or method name.
CLASS_MARKS = {"queue", "queues", "window", "windows", "batcher", "scheduler", "robin", "deficit"}
FUNCTION_MARKS = {"window", "windows", "turn", "deficit", "robin"}

#: module (path under reward_server/) -> why it may break the rule for now.
EXEMPT = {
    "verifiers/pool.py": (
        "the verifier pool's job inbox for its worker threads (queue.SimpleQueue); owned "
        "by the verifiers' change in flight, to move behind reward_server.scheduling"
    ),
}


def _words(name: str) -> set[str]:
    """``TenantQueues`` -> {"tenant", "queues"}; ``end_turn`` -> {"end", "turn"}."""
    parts = re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", name)
    return {part.lower() for part in parts}


def _imports(tree: ast.Module) -> dict[str, str]:
    """Local name -> the qualified name it stands for, from the module's imports."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return names


def _qualified(node: ast.expr, names: dict[str, str]) -> str | None:
    """``collections.deque`` for ``deque`` (from collections import deque), ``c.deque``
    (import collections as c), ...; None for anything else."""
    attrs: list[str] = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in names:
        return None
    return ".".join([names[node.id], *reversed(attrs)])


def violations(source: str) -> list[str]:
    """What in ``source`` breaks the rule, one line each (``line: what``)."""
    tree = ast.parse(source)
    names = _imports(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            qualified = _qualified(node.func, names)
            if qualified in QUEUES:
                found.append(f"{node.lineno}: creates a queue ({qualified})")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            modules = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for module in modules:
                if module.split(".")[0] in QUEUE_MODULES:
                    found.append(f"{node.lineno}: imports {module} (a heap queue)")
        elif isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            if isinstance(node, ast.ClassDef):
                error = node.name.endswith("Error")
                marks = set() if error else _words(node.name) & CLASS_MARKS
            else:
                marks = _words(node.name) & FUNCTION_MARKS
            if marks:
                found.append(f"{node.lineno}: defines {node.name} ({', '.join(sorted(marks))})")
    return sorted(found, key=lambda line: int(line.split(":")[0]))


def test_the_rule_sees_queues_windows_and_turns() -> None:
    source = (
        "import asyncio\nimport collections as c\nfrom queue import SimpleQueue\nimport heapq\n"
        "q = asyncio.Queue()\nd = c.deque()\ns = SimpleQueue()\n"
        "class TenantQueues: ...\ndef end_turn(): ...\nasync def collect_window(): ...\n"
        "queued = max_queue = 1\ndef queued_rows(): ...\n"
        "text = 'asyncio.Queue() heapq'\nclass QueueFullError(Exception): ...\n"
        "def _scan_turns(): ...\ndef track_queue(): ...\nclass AdmissionScheduler: ...\n"
    )
    assert violations(source) == [
        "4: imports heapq (a heap queue)",
        "5: creates a queue (asyncio.Queue)",
        "6: creates a queue (collections.deque)",
        "7: creates a queue (queue.SimpleQueue)",
        "8: defines TenantQueues (queues)",
        "9: defines end_turn (turn)",
        "10: defines collect_window (window)",
        "17: defines AdmissionScheduler (scheduler)",
    ]


def test_no_queue_window_or_turn_outside_scheduling() -> None:
    broken: dict[str, list[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        if path.is_relative_to(SCHEDULING):
            continue
        found = violations(path.read_text(encoding="utf-8"))
        if found:
            broken[path.relative_to(ROOT).as_posix()] = found
    unexpected = {name: found for name, found in broken.items() if name not in EXEMPT}
    assert not unexpected, (
        f"queues, batch windows and tenant turns belong in reward_server/scheduling/: {unexpected}"
    )
    stale = sorted(set(EXEMPT) - set(broken))
    assert not stale, f"no longer breaks the rule: remove from EXEMPT: {stale}"
