"""A row of token ids that carries its own generation settings (torch-free, so the scoring
layer can make one without loading an engine): :class:`GenerationRow`.

A judge in ``mode: generate`` answers every row with its entry's settings; a row made by a
grader's model leaf (``score_model``, ``label_model``) brings its ``sampling_params``
instead (``max_completions_tokens``, ``temperature``, ``top_p``, ``seed``). The judge's pass
groups the rows of a micro-batch by their settings and generates each group with its own
(:meth:`reward_server.engines._judge.JudgeLM.generate_batch`); the micro-batcher sees a row
of token ids like any other.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["GenerationRow"]


class GenerationRow(list[int]):
    """Token ids (a list, as every row is) with ``generation``: the settings its answer is
    generated with (a :class:`~reward_server.engines._judge.Generation`)."""

    def __init__(self, ids: Iterable[int], generation: Any) -> None:
        super().__init__(ids)
        self.generation = generation
