"""Run the real ``reward-server`` console script in a subprocess for end-to-end tests.

The implementation lives in :mod:`reward_server.launcher` (the demo and the benchmarks use
it too); this module keeps the tests' import path short.
"""

from reward_server.launcher import (
    REWARD_SERVER,
    ServerProcess,
    free_port,
    running_server,
    start_server,
)

__all__ = ["REWARD_SERVER", "ServerProcess", "free_port", "running_server", "start_server"]
