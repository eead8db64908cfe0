"""Benchmarks of the reward server (throughput, latency, padding) and of a PPO step.

``make bench`` runs :mod:`bench.run`; results go to ``bench/results/<date>.json`` and the
tables of ``BENCHMARKS.md``. Nothing here is imported by the packages or the tests' fixtures.
"""
