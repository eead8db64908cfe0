"""The models file of ``reward-server --models FILE`` (or ``REWARD_SERVER_MODELS``): several
reward models behind one endpoint, each with its own tokenizer, chat template and limits.

.. code-block:: yaml

    aggregate: weighted_sum      # how the models' scores combine: weighted_sum | mean | min
    models:
      - name: helpful            # required, unique, letters, digits, "_", "." and "-"
        model: /models/helpful   # required: a folder or a hub id, as --model
        weight: 1.0              # default 1.0
        normalize: {mean: 0.0, std: 1.0}   # optional: (score - mean) / std before the weight
        label_index: 0           # which logit is the score (default: the server's --label-index)
      - name: safety
        model: /models/armo-like
        objectives: {harmless: 0.7, honest: 0.3}  # or weights by label name (id2label)
        max_length: 1024         # per-model: device, dtype, max_length, truncation_side,
        chat_template: auto      #   chat_template, trust_remote_code (default: the server's)
        adapter: null            # optional PEFT adapter (merge_adapter: false)
        kind: sequence           # sequence | process (a per-step reward model)
        # kind: process only: step_separator ("\\n\\n"), step_tag (null), step_aggregate (min)

What the numbers mean: a model's own score per item is the raw logit of its ``label_index``,
or with ``objectives`` the sum over its labels of weight x raw logit. The combined score is
``v_m = weight_m * (s_m - mean_m) / std_m`` (normalize optional), summed (``weighted_sum``),
averaged (``mean``) or the least (``min``) over the models. Server-wide flags (batching
limits, auth, --no-truncate, --engine, ...) stay server-wide. Any key not listed here is an
error naming it.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from reward_server.config.load_options import LoadOptions
from reward_server.errors import ModelsFileError, field_path

__all__ = [
    "AggregateName",
    "ModelKind",
    "ModelSpec",
    "ModelsFile",
    "ModelsFileError",
    "Normalize",
    "parse_models_file",
    "read_models_file",
]

ModelKind = Literal["sequence", "process"]
#: How several models' scores combine (the top-level ``aggregate``; the arithmetic is in
#: :mod:`reward_server.scoring.aggregate`).
AggregateName = Literal["weighted_sum", "mean", "min"]
StepAggregate = Literal["min", "mean", "last", "prod"]

#: Keys of an entry that only a process reward model reads.
PROCESS_KEYS = ("step_separator", "step_tag", "step_aggregate")
#: Per-model keys that default to the server's flag of the same name.
INHERITED_KEYS = (
    "device",
    "dtype",
    "max_length",
    "truncation_side",
    "chat_template",
    "trust_remote_code",
    "label_index",
)


class Normalize(BaseModel):
    """``(score - mean) / std``, applied to a model's score before its weight."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mean: float = 0.0
    std: float = Field(default=1.0, gt=0)


class ModelSpec(BaseModel):
    """One entry of the models file: what to load and how its score counts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    model: str = Field(min_length=1)
    adapter: str | None = Field(default=None, min_length=1)
    merge_adapter: bool = False
    weight: float = 1.0
    label_index: int | None = Field(default=None, ge=0)
    objectives: dict[str, float] | None = Field(default=None, min_length=1)
    normalize: Normalize | None = None
    kind: ModelKind = "sequence"
    device: str | None = Field(default=None, pattern=r"^(auto|cpu|mps|cuda(:\d+)?)$")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] | None = None
    max_length: int | None = Field(default=None, gt=0)
    truncation_side: Literal["left", "right"] | None = None
    chat_template: str | None = Field(default=None, min_length=1)
    trust_remote_code: bool | None = None
    step_separator: str = Field(default="\n\n", min_length=1)
    step_tag: str | None = Field(default=None, min_length=1)
    step_aggregate: StepAggregate = "min"

    @field_validator("weight")
    @classmethod
    def _finite_weight(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("weight must be a finite number")
        return value

    @field_validator("objectives")
    @classmethod
    def _finite_objectives(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        bad = [k for k, w in (value or {}).items() if not math.isfinite(w)]
        if bad:
            raise ValueError(f"objective weights must be finite numbers ({', '.join(bad)})")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        if self.objectives is not None and self.label_index is not None:
            raise ValueError("give label_index or objectives, not both")
        if self.kind != "process":
            given = [key for key in PROCESS_KEYS if key in self.model_fields_set]
            if given:
                raise ValueError(f"{', '.join(given)}: only for kind: process")
        return self

    def load_options(self, server: LoadOptions) -> LoadOptions:
        """The server's load options with this entry's model and per-model keys over them."""
        own = {key: getattr(self, key) for key in INHERITED_KEYS if getattr(self, key) is not None}
        if self.objectives is not None:
            own["label_index"] = 0  # every label is read; the scorer's own one must exist
        return dataclasses.replace(
            server,
            model=self.model,
            adapter=self.adapter,
            merge_adapter=self.merge_adapter,
            **own,
        )


class ModelsFile(BaseModel):
    """The whole models file: the models and how their scores combine."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    aggregate: AggregateName = "weighted_sum"
    models: list[ModelSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names_one_process(self) -> ModelsFile:
        names = [spec.name for spec in self.models]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"model names must be unique ({', '.join(twice)} repeated)")
        process = [spec.name for spec in self.models if spec.kind == "process"]
        if len(process) > 1:
            raise ValueError(f"at most one kind: process model ({', '.join(process)})")
        return self

    @property
    def names(self) -> list[str]:
        """The models' names, in the file's order."""
        return [spec.name for spec in self.models]


def _problem(err: Any) -> str:
    """One validation error as ``where: what``, unknown keys and missing ones by name."""
    loc = tuple(err.get("loc", ()))
    kind = err.get("type")
    if kind == "extra_forbidden":
        return f"{field_path(loc[:-1]) or 'top level'}: unknown key {loc[-1]!r}"
    if kind == "missing":
        return f"{field_path(loc[:-1]) or 'top level'}: {loc[-1]!r} is required"
    message = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    return f"{field_path(loc)}: {message}" if loc else message


def parse_models_file(data: Any, source: str = "models file") -> ModelsFile:
    """Validate the parsed YAML of a models file; ModelsFileError naming every problem."""
    if not isinstance(data, dict):
        raise ModelsFileError(f"{source}: expected a mapping with a 'models' list")
    try:
        return ModelsFile.model_validate(data)
    except ValidationError as exc:
        problems = [_problem(err) for err in exc.errors()]
        raise ModelsFileError(f"{source}: {'; '.join(problems)}") from None


def read_models_file(path: str | Path) -> ModelsFile:
    """Read and validate the models file at ``path``; ModelsFileError when it is not right."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelsFileError(f"cannot read models file {path}: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ModelsFileError(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from None
    return parse_models_file(data, str(path))
