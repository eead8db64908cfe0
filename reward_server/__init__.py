"""Reward model HTTP service: text in, scores out."""

__version__ = "0.1.0"
