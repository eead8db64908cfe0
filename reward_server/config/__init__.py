"""Configuration: the server's settings (every CLI flag and environment variable), the
models file, and the options a model is loaded with. Pydantic only: no torch, no HTTP."""

from reward_server.config.load_options import LoadOptions
from reward_server.config.models_file import (
    AggregateName,
    ModelsFile,
    ModelsFileError,
    ModelSpec,
    Normalize,
    parse_models_file,
    read_models_file,
)
from reward_server.config.settings import (
    CPU_BATCH_TOKENS,
    CPU_MEMORY_UTILIZATION,
    ENV_PREFIX,
    GPU_BATCH_TOKENS,
    GPU_MEMORY_UTILIZATION,
    Dtype,
    EngineName,
    LogLevel,
    ServerSettings,
    TruncationSide,
    field_help,
    flags_markdown,
)

__all__ = [
    "CPU_BATCH_TOKENS",
    "CPU_MEMORY_UTILIZATION",
    "ENV_PREFIX",
    "GPU_BATCH_TOKENS",
    "GPU_MEMORY_UTILIZATION",
    "AggregateName",
    "Dtype",
    "EngineName",
    "LoadOptions",
    "LogLevel",
    "ModelSpec",
    "ModelsFile",
    "ModelsFileError",
    "Normalize",
    "ServerSettings",
    "TruncationSide",
    "field_help",
    "flags_markdown",
    "parse_models_file",
    "read_models_file",
]
