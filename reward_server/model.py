"""Deprecated path of the transformers reward model: use
:mod:`reward_server.engines.transformers` (its errors: :mod:`reward_server.errors`)."""

from reward_server._moved import warn_moved
from reward_server.engines.transformers import RewardModel
from reward_server.errors import ChatTemplateError, ModelLoadError, TextTooLongError
from reward_server.text.rendering import Encoded

warn_moved(
    __name__,
    "reward_server.engines.transformers.RewardModel (errors: reward_server.errors, Encoded: reward_server.text.rendering)",
)

__all__ = ["ChatTemplateError", "Encoded", "ModelLoadError", "RewardModel", "TextTooLongError"]
