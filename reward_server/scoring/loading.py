"""Loading one entry of the models file, whatever its kind, as a served model: a sequence
or process reward model, a judge, a verifier's worker pool or a remote component.

Called by :class:`~reward_server.scoring.registry.ModelRegistry` on its compute thread (see the
registry's module docstring for why every model loads on the thread that later scores);
the registry keeps the models loaded here and closes them when it stops.
"""

from __future__ import annotations

from reward_server.config import LoadOptions
from reward_server.config.models_file import ModelSpec
from reward_server.errors import ModelLoadError
from reward_server.scoring.grader_model import load_grader
from reward_server.scoring.judge_model import load_judge
from reward_server.scoring.remote_model import load_remote
from reward_server.scoring.served import ServedModel, load_served_model
from reward_server.scoring.verifier_model import load_verifier

__all__ = ["load_model"]


def load_model(spec: ModelSpec, base: LoadOptions, engine: str, *, from_file: bool) -> ServedModel:
    """Load the model (or the judge, or start the verifier, or the remote) of ``spec`` on
    the calling thread; ``base`` holds the flags' load options, which a models-file entry
    (``from_file``) overrides with its own. Raises ModelLoadError, naming the entry when it
    comes from the models file."""
    if spec.kind == "verifier":
        return load_verifier(spec)
    if spec.kind == "remote":
        return load_remote(spec)
    if spec.kind == "grader":
        return load_grader(spec)
    if not from_file:  # a plain --model server: the flags alone
        return load_served_model(spec, base, engine)
    load = load_judge if spec.kind == "judge" else load_served_model
    try:
        return load(spec, spec.load_options(base), engine)
    except ModelLoadError as exc:
        raise ModelLoadError(f"model {spec.name!r} ({getattr(spec, 'model', '')}): {exc}") from exc
