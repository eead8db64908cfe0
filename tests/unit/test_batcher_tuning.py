"""The batcher's cost-aware cutting of windows and its no-wait rule for sparse arrivals."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import pytest

import reward_server.scheduling.batcher as batcher_module
from reward_server.scheduling import Batcher, BatchLimits
from reward_server.scheduling.batcher import _CostModel, partition


def score(row: Sequence[int]) -> float:
    return float(sum(row) + len(row))


class Recording:
    """A fake scorer that records the lengths of each batch."""

    def __init__(self) -> None:
        self.shapes: list[list[int]] = []

    def __call__(self, batch: list[Sequence[int]]) -> list[float]:
        self.shapes.append([len(r) for r in batch])
        return [score(r) for r in batch]


def cost(lengths: list[int], sizes: list[int], overhead: float) -> float:
    at, total = 0, 0.0
    for size in sizes:
        total += overhead + size * lengths[at + size - 1]
        at += size
    return total


def test_partition_separates_short_from_long_when_a_pass_is_cheap() -> None:
    lengths = [2, 2, 3, 40, 40, 41]
    assert partition(lengths, 5, max_rows=64, max_tokens=10_000) == [3, 3]
    # A pass worth more than all the padding: one group.
    assert partition(lengths, 1000, max_rows=64, max_tokens=10_000) == [6]
    # Limits still bind: at most 2 rows, and rows * width <= 50 (41 alone fits as 1 row).
    sizes = partition(lengths, 1000, max_rows=2, max_tokens=50)
    at = 0
    for size in sizes:
        group = lengths[at : at + size]
        assert size <= 2 and (size == 1 or size * group[-1] <= 50)
        at += size
    assert sum(sizes) == len(lengths)
    assert partition([500], 10, max_rows=4, max_tokens=100) == [1]  # over budget, alone
    assert partition([], 10, max_rows=4, max_tokens=100) == []


def test_partition_is_optimal_against_brute_force() -> None:
    rng = random.Random(0)
    for _ in range(200):
        lengths = sorted(rng.randint(1, 30) for _ in range(rng.randint(1, 8)))
        overhead = rng.choice([0, 1, 5, 20, 100])
        best = min(
            cost(lengths, sizes, overhead)
            for sizes in _compositions(len(lengths))
            if all(s <= 3 for s in sizes)
        )
        got = partition(lengths, overhead, max_rows=3, max_tokens=10**6)
        assert max(got) <= 3
        assert cost(lengths, got, overhead) == pytest.approx(best)


def _compositions(n: int) -> list[list[int]]:
    if n == 0:
        return [[]]
    return [[k, *rest] for k in range(1, n + 1) for rest in _compositions(n - k)]


def test_cost_model_learns_the_overhead_despite_outliers() -> None:
    model = _CostModel(keep=64, min_samples=16, refit_every=8)
    rng = random.Random(1)
    for i in range(64):
        padded = rng.randint(10, 5000)
        seconds = 0.006 + 0.00015 * padded  # 6 ms a pass, 0.15 ms a token: 40 tokens
        if i % 10 == 0:
            seconds *= 3  # a pass slowed down by a busy machine
        model.add(padded, seconds)
    assert model.overhead_tokens == pytest.approx(40, rel=0.05)


def test_cost_model_without_variety_or_with_a_fixed_value() -> None:
    model = _CostModel(min_samples=4, refit_every=1)
    for _ in range(10):
        model.add(100, 0.01)  # one size only: nothing to learn
    assert model.overhead_tokens is None
    fixed = _CostModel(fixed=12.0)
    fixed.add(10, 1.0)
    assert fixed.overhead_tokens == 12.0


def test_window_is_cut_by_cost_and_results_stay_routed() -> None:
    scorer = Recording()
    rows = [[1] * 2, [2] * 40, [3] * 2, [4] * 41, [5] * 3, [6] * 40]

    async def main() -> None:
        batcher = Batcher(
            scorer,
            BatchLimits(max_batch_tokens=10_000, max_batch_size=64, max_wait_ms=0, max_queue=100),
            split_overhead_tokens=5,
        )
        await batcher.start()
        # Submitted together, they share one window: short ones and long ones split.
        results = await asyncio.gather(*(batcher.submit([r]) for r in rows))
        assert results == [[score(r)] for r in rows]
        await batcher.stop()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert sorted(map(sorted, scorer.shapes)) == [[2, 2, 3], [40, 40, 41]]


def test_sparse_arrivals_do_not_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """One client at a time, gaps far above max_wait_ms: a lone item goes out at once."""
    now = [1000.0]

    class FakeTime:
        @staticmethod
        def monotonic() -> float:
            return now[0]

    monkeypatch.setattr(batcher_module, "time", FakeTime)
    scorer = Recording()

    async def main() -> None:
        # A minute of max_wait: a lone item would only leave at its deadline...
        batcher = Batcher(
            scorer,
            BatchLimits(max_batch_tokens=1000, max_batch_size=2, max_wait_ms=60_000, max_queue=10),
        )
        await batcher.start()
        for k in range(10):  # full batches never wait; they teach the batcher the gaps
            now[0] += 600.0
            assert await batcher.submit([[k], [k]]) == [score([k])] * 2
        now[0] += 600.0
        # ...but requests 10 minutes apart mean nobody else is coming: no wait at all (a
        # wait would outlast the 30 s guard below).
        assert await batcher.submit([[7]]) == [score([7])]
        await batcher.stop()

    asyncio.run(asyncio.wait_for(main(), 30))
    assert scorer.shapes[-1] == [1]


def test_negative_overhead_rejected() -> None:
    with pytest.raises(ValueError, match="split_overhead_tokens"):
        Batcher(
            lambda rows: [],
            BatchLimits(max_batch_tokens=1, max_batch_size=1, max_wait_ms=0, max_queue=1),
            split_overhead_tokens=-1,
        )
