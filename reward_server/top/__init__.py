"""``reward-server top URL``: a live view of a reward server in the terminal, for people
without Grafana.

It polls the server's ``/metrics`` (and ``/info`` once, with the API key, for the model
names and to check the key) and redraws, with rich, the throughput and error rate, latency
percentiles per endpoint, queues per model and tenant, and each model's score distribution
from the reward-signal gauges. Rates and percentiles cover the interval between two polls,
computed as Prometheus's ``rate()`` and ``histogram_quantile()`` do
(:mod:`reward_server.top._scrape`). It needs httpx, rich and prometheus_client only: no
model library is imported.
"""

from reward_server.top.cli import main

__all__ = ["main"]
