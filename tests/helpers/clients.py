"""The reward client in tests."""

from __future__ import annotations

from reward_client import RetryPolicy

#: Short pauses, so that tests that do sleep for real stay quick.
FAST = RetryPolicy(backoff_base=0.001, backoff_max=0.01)
