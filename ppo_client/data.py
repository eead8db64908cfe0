"""Prompt data: loading the dataset, reading its prompt (and label) column, and each
update's seeded batch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ppo_client.config import ConfigError, PPOConfig
from ppo_client.rollout import Prompt, normalize_prompt
from ppo_client.sizes import BatchSizes

__all__ = ["PromptDataset", "batch_indices", "load_prompt_dataset"]


class PromptDataset:
    """Random access to the prompt column of a dataset (a ``datasets.Dataset`` or a list) and,
    when ``label_field`` names one, its label column."""

    def __init__(self, data: Any, field: str = "prompt", label_field: str | None = None) -> None:
        self._data = data
        self._field = field
        self._label_field = label_field
        if hasattr(data, "column_names"):
            _check_column(data.column_names, field, "dataset_text_field")
            if label_field is not None:
                _check_column(data.column_names, label_field, "label_column")
        elif not isinstance(data, Sequence):
            raise TypeError("train_dataset must be a datasets.Dataset or a list")
        elif label_field is not None:
            for i, row in enumerate(data):
                if not isinstance(row, Mapping) or label_field not in row:
                    raise ConfigError(
                        f"row {i} of the dataset has no {label_field!r} column (label_column)"
                    )
        if len(data) == 0:
            raise ConfigError("the training dataset is empty")

    def __len__(self) -> int:
        return len(self._data)

    def labels(self, indices: Sequence[int]) -> list[Any] | None:
        """The labels at ``indices`` (the ``label_field`` column); None without one."""
        label = self._label_field
        if label is None:
            return None
        if hasattr(self._data, "column_names"):
            return list(self._data[[int(i) for i in indices]][label])
        return [self._data[int(i)][label] for i in indices]

    def get(self, indices: Sequence[int]) -> list[Prompt]:
        """Prompts at ``indices``, normalised (text or role/content messages)."""
        if hasattr(self._data, "column_names"):
            column = self._data[[int(i) for i in indices]][self._field]
            return [normalize_prompt(v) for v in column]
        out = []
        for i in indices:
            row = self._data[int(i)]
            value = row[self._field] if isinstance(row, Mapping) else row
            out.append(normalize_prompt(value))
        return out


def _check_column(columns: Sequence[str], name: str, key: str) -> None:
    """ConfigError unless the dataset's ``columns`` hold ``name`` (the config ``key``'s)."""
    if name not in columns:
        raise ConfigError(f"the dataset has no {name!r} column (columns: {columns}); set {key}")


def load_prompt_dataset(config: PPOConfig) -> Any:
    """Load ``config.dataset_name``: a local .jsonl/.json/.csv/.parquet file, a saved
    ``datasets`` folder, or a hub id (with ``dataset_config`` and ``dataset_split``)."""
    import datasets

    name = config.dataset_name
    if not name:
        raise ConfigError("set dataset_name (a local .jsonl/.json/.csv file or a datasets id)")
    path = Path(name)
    builders = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
    if path.is_file():
        builder = builders.get(path.suffix.lower())
        if builder is None:
            raise ConfigError(f"dataset file {name!r}: expected .jsonl, .json, .csv or .parquet")
        return datasets.load_dataset(builder, data_files=str(path), split="train")
    if path.is_dir() and (path / "dataset_info.json").exists():
        loaded = datasets.load_from_disk(str(path))
        return loaded[config.dataset_split] if isinstance(loaded, datasets.DatasetDict) else loaded
    return datasets.load_dataset(name, config.dataset_config, split=config.dataset_split)


def batch_indices(
    update: int, dataset_size: int, sizes: BatchSizes, seed: int, rank: int
) -> list[int]:
    """Rank ``rank``'s dataset indices for update ``update`` (0-based): a seeded permutation
    per pass over the data, so the order depends only on the seed and the step."""
    per_epoch = dataset_size // sizes.batch_size  # drop_last, as TRL
    epoch, k = divmod(update, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(dataset_size)
    batch = order[k * sizes.batch_size : (k + 1) * sizes.batch_size]
    local = sizes.local_batch_size
    return batch[rank * local : (rank + 1) * local].tolist()
