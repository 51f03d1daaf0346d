"""dflash: fast lossless speculative decoding (DFlash drafter + DDTree) for Qwen3.5/3.6 GGUF models."""

from __future__ import annotations

from dflash.api import Engine, generate
from dflash.errors import (
    ContextOverflowError,
    DflashError,
    EngineError,
    InvalidParameterError,
    ModelLoadError,
)

__version__ = "0.1.0"

__all__ = [
    "Engine",
    "generate",
    "DflashError",
    "ModelLoadError",
    "InvalidParameterError",
    "ContextOverflowError",
    "EngineError",
    "__version__",
]
