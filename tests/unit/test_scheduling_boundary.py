"""One place for scheduling: every queue of work, semaphore, tenant share, batch window and
tenant turn of the server lives in ``reward_server/scheduling/`` (issue 49, acceptance 2).

The rule, checked on the source of every module of ``reward_server`` outside
``reward_server/scheduling/`` (with ``ast``, so strings and comments do not count):

1. No queue and no semaphore is created there: no call of ``asyncio.Queue``,
   ``asyncio.PriorityQueue``, ``asyncio.LifoQueue``, ``collections.deque``, ``queue.Queue``,
   ``queue.SimpleQueue``, ``queue.LifoQueue``, ``queue.PriorityQueue``, a multiprocessing
   queue, or of ``asyncio``'s, ``threading``'s or ``multiprocessing``'s ``Semaphore`` and
   ``BoundedSemaphore`` (however imported: ``import asyncio``, ``from collections import
   deque``, an alias, a multiprocessing context's ``ctx.Queue()``), no class derived from
   one, and no import of ``heapq``.
2. No tenant share or rate is read there: no ``.queue_share`` or ``.tokens_per_s`` outside
   ``reward_server/config/`` too (where the keys file defines them); admission applies them
   (``scheduling.fairness.Admission``).
3. No class, function or method there is named for a scheduling job. Names are split into
   words at ``_`` and at camelCase humps; a class is marked by a word of
   :data:`CLASS_MARKS` (``TenantQueues``, ``DeficitRoundRobin``, ``Window``, ``Batcher``, a
   ``...Scheduler``; exceptions, ``...Error``, are the error layer's and do not count), a
   function or method by a word of :data:`FUNCTION_MARKS` (``collect_window``,
   ``end_turn``, ``turn_tokens``; a chat's ``turns``, plural, is text, not a tenant's turn).
   ``queued`` counters, ``max_queue`` settings and ``track_queue`` metrics do not count.

A module that must break the rule for now is listed in :data:`EXEMPT` with the reason; the
list can only shrink (a listed module that no longer breaks the rule fails the test too).
``make test-unit`` and ``make test`` (after ``make lint``) run it.
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
    "multiprocessing.Queue",
    "multiprocessing.SimpleQueue",
    "multiprocessing.JoinableQueue",
}
#: Calls that create a semaphore, by qualified name.
SEMAPHORES = {
    f"{module}.{kind}"
    for module in ("asyncio", "asyncio.locks", "threading", "multiprocessing")
    for kind in ("Semaphore", "BoundedSemaphore")
}
#: The last name of a call that creates one whatever it is called on (``ctx.Queue()`` of a
#: multiprocessing context, a module under another name).
LAST_NAMES = {name.rsplit(".", 1)[1] for name in QUEUES | SEMAPHORES} - {"deque"}
#: A tenant's limits, which only admission applies (``reward_server/config/`` defines them).
TENANT_LIMITS = {"queue_share", "tokens_per_s"}
CONFIG = "config/"
#: Modules whose import alone is a queue (a heap of work).
QUEUE_MODULES = {"heapq"}
#: Words that name a scheduling job in a class name, and in a function or method name.
CLASS_MARKS = {"queue", "queues", "window", "windows", "batcher", "scheduler", "robin", "deficit"}
FUNCTION_MARKS = {"window", "windows", "turn", "deficit", "robin"}

#: module (path under reward_server/) -> why it may break the rule for now.
EXEMPT = {
    "sandbox/_sandbox.py": (
        "the sandbox's own bound on programs at once (an asyncio.Semaphore per loop): every "
        "program the server runs takes a fair seat of its code verifier first, which has as "
        "many, so it holds no one; it stays for a Sandbox used alone (its self-test) until "
        "the sandbox runner's change (issue 49, item 4) drops it"
    ),
    "verifiers/sandboxed.py": (
        "a python call's own pace (an asyncio.Semaphore per call: its items go `workers` at "
        "a time so its breaker can trip), not a queue between requests: each item's run "
        "takes a fair seat of its code verifier; owned by the verifiers' spec change"
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


def _made(node: ast.expr, names: dict[str, str]) -> str | None:
    """What a call of (or a class derived from) ``node`` makes: ``a queue (queue.Queue)``,
    ``a semaphore (ctx.Semaphore)``, or None."""
    qualified = _qualified(node, names)
    last = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    shown = qualified or ast.unparse(node)
    if qualified in SEMAPHORES or (qualified is None and last in LAST_NAMES and "Sem" in last):
        return f"a semaphore ({shown})"
    if qualified in QUEUES or (qualified is None and last in LAST_NAMES):
        return f"a queue ({shown})"
    return None


def violations(source: str, *, config: bool = False) -> list[str]:
    """What in ``source`` breaks the rule, one line each (``line: what``); ``config``: the
    module is in reward_server/config/ (it may name a tenant's limits)."""
    tree = ast.parse(source)
    names = _imports(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            made = _made(node.func, names)
            if made is not None:
                found.append(f"{node.lineno}: creates {made}")
        elif isinstance(node, ast.Attribute) and node.attr in TENANT_LIMITS and not config:
            found.append(f"{node.lineno}: reads a tenant's {node.attr}")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            modules = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            for module in modules:
                if module.split(".")[0] in QUEUE_MODULES:
                    found.append(f"{node.lineno}: imports {module} (a heap queue)")
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                made = _made(base, names)
                if made is not None:
                    found.append(f"{node.lineno}: derives {node.name} from {made}")
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
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


def test_the_rule_sees_semaphores_and_tenant_shares() -> None:
    source = (
        "import asyncio, threading as t, multiprocessing\n"
        "from asyncio import BoundedSemaphore\n"
        "a = asyncio.Semaphore(2)\nb = t.Semaphore()\nc = BoundedSemaphore(1)\n"
        "ctx = multiprocessing.get_context('spawn')\nq = ctx.Queue()\ns = ctx.Semaphore(1)\n"
        "class Slots(asyncio.Semaphore): ...\n"
        "limit = tenant.queue_share * 10\nrate = tenant.tokens_per_s\n"
        "text = 'asyncio.Semaphore() queue_share'\nlock = asyncio.Lock()\nshare = 0.5\n"
    )
    assert violations(source) == [
        "3: creates a semaphore (asyncio.Semaphore)",
        "4: creates a semaphore (threading.Semaphore)",
        "5: creates a semaphore (asyncio.BoundedSemaphore)",
        "7: creates a queue (ctx.Queue)",
        "8: creates a semaphore (ctx.Semaphore)",
        "9: derives Slots from a semaphore (asyncio.Semaphore)",
        "10: reads a tenant's queue_share",
        "11: reads a tenant's tokens_per_s",
    ]
    # reward_server/config/ defines a tenant's limits: it may name them.
    assert violations("limit = tenant.queue_share\n", config=True) == []


def test_no_queue_window_or_turn_outside_scheduling() -> None:
    broken: dict[str, list[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        if path.is_relative_to(SCHEDULING):
            continue
        name = path.relative_to(ROOT).as_posix()
        found = violations(path.read_text(encoding="utf-8"), config=name.startswith(CONFIG))
        if found:
            broken[name] = found
    unexpected = {name: found for name, found in broken.items() if name not in EXEMPT}
    assert not unexpected, (
        "queues, semaphores, tenant shares, batch windows and tenant turns belong in "
        f"reward_server/scheduling/: {unexpected}"
    )
    stale = sorted(set(EXEMPT) - set(broken))
    assert not stale, f"no longer breaks the rule: remove from EXEMPT: {stale}"
