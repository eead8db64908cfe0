"""The transformers reward model under its first name (kept for code that imports it here).

It lives in :mod:`reward_server.engines.transformers`; rendering in
:mod:`reward_server.rendering`; its exceptions in :mod:`reward_server.exceptions`.
"""

from reward_server.engines.transformers import RewardModel
from reward_server.exceptions import ChatTemplateError, ModelLoadError, TextTooLongError
from reward_server.rendering import Encoded

__all__ = ["ChatTemplateError", "Encoded", "ModelLoadError", "RewardModel", "TextTooLongError"]
