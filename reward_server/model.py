"""Deprecated path of the transformers reward model: use
:mod:`reward_server.engines.transformers` (its errors: :mod:`reward_server.errors`)."""

import warnings

from reward_server.engines.transformers import RewardModel
from reward_server.errors import ChatTemplateError, ModelLoadError, TextTooLongError
from reward_server.text.rendering import Encoded

warnings.warn(
    "reward_server.model is deprecated; use reward_server.engines.transformers.RewardModel "
    "(errors: reward_server.errors, Encoded: reward_server.text.rendering)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["ChatTemplateError", "Encoded", "ModelLoadError", "RewardModel", "TextTooLongError"]
