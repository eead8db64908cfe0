"""A code verifier shared by tenants (issue 49, item 1): its sessions are seats of the
server's one fair queue (its sandbox slots serve the items in session in the order asked), so
a tenant flooding it does not hold another's item behind its backlog, and ``/run_code``'s runs
take the same seats. A real
:class:`~reward_server.verifiers.code.CodeVerifier` in the bubblewrap sandbox, no server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterator
from typing import Any, TypeVar

import pytest

from reward_server.config.tenants import Tenant, current_tenant
from reward_server.sandbox import Limits
from reward_server.verifiers import Task, Verdict
from reward_server.verifiers.code import CodeOptions, CodeVerifier

T = TypeVar("T")
#: A program that takes about 0.2 s, then echoes its input.
SLOW = "```python\nimport time\ntime.sleep(0.2)\nprint(input())\n```"
FAST = "```python\nprint(input())\n```"
TESTS = {"inputs": ["1\n"], "outputs": ["1\n"]}


def run(coro: Awaitable[T]) -> T:
    async def guarded() -> T:
        return await asyncio.wait_for(coro, 120)

    return asyncio.run(guarded())


@pytest.fixture(scope="module")
def verifier() -> Iterator[CodeVerifier]:
    made = CodeVerifier(CodeOptions(workers=1, test_timeout_s=10.0, timeout_s=30.0), "fair")
    made.start()
    yield made
    made.close()


async def as_tenant(tenant: Tenant, work: Awaitable[T]) -> T:
    current_tenant.set(tenant)  # this task's own context, as the auth dependency does
    return await work


def test_a_tenant_flooding_the_sandbox_does_not_hold_another_behind_its_backlog(
    verifier: CodeVerifier,
) -> None:
    # One sandbox slot, two sessions. A's three calls of 4 slow items (12 x 0.2 s, each a
    # build and a test) wait in the fair queue; B's one item goes first to the next session
    # that frees, its programs then wait only for those of A's other item in session: it is
    # done while most of A's items still wait.
    async def scenario() -> tuple[list[Verdict], int, float]:
        flood = [
            asyncio.create_task(
                as_tenant(Tenant("A"), verifier.verify([Task(None, SLOW, TESTS)] * 4))
            )
            for _ in range(3)
        ]
        await asyncio.sleep(0.3)  # A's first items are running
        began = time.monotonic()
        light = await as_tenant(Tenant("B"), verifier.verify([Task(None, FAST, TESTS)]))
        waited = time.monotonic() - began
        pending = sum(not task.done() for task in flood)
        results = await asyncio.gather(*flood)
        assert all(v.score == 1.0 for verdicts in results for v in verdicts)
        return light, pending, waited

    light, pending, waited = run(scenario())
    assert [(v.score, v.tests) for v in light] == [(1.0, ("passed",))]
    assert pending == 3  # every A call still had items to run
    assert waited < 1.5, waited  # a few of A's programs, not A's 2.4 s backlog


def test_run_code_takes_the_same_fair_seats(verifier: CodeVerifier) -> None:
    limits = Limits(run_timeout_s=10.0, compile_timeout_s=10.0)

    async def scenario() -> tuple[Any, int]:
        flood = [
            asyncio.create_task(
                as_tenant(Tenant("A"), verifier.verify([Task(None, SLOW, TESTS)] * 4))
            )
            for _ in range(3)
        ]
        await asyncio.sleep(0.3)
        files: dict[str, str | bytes] = {"main.py": "print('run')\n"}
        compiled, result = await as_tenant(
            Tenant("B"), verifier.run_once("python", files, "", limits)
        )
        pending = sum(not task.done() for task in flood)
        await asyncio.gather(*flood)
        assert compiled.ok
        return result, pending

    result, pending = run(scenario())
    assert result is not None and result.stdout == "run\n"
    assert pending == 3
