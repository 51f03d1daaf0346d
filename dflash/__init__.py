"""dflash: fast lossless speculative decoding (DFlash drafter + DDTree) for Qwen3.5/3.6 GGUF models."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from dflash.api import Engine, generate
    from dflash.errors import (
        ContextOverflowError,
        DflashError,
        EngineError,
        InvalidParameterError,
        ModelLoadError,
    )

_LAZY = {
    "Engine": "dflash.api",
    "generate": "dflash.api",
    "DflashError": "dflash.errors",
    "ModelLoadError": "dflash.errors",
    "InvalidParameterError": "dflash.errors",
    "ContextOverflowError": "dflash.errors",
    "EngineError": "dflash.errors",
}


def __getattr__(name: str) -> Any:
    # The native core loads on first use, so pure-Python parts (dflash.synth) work without it.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dflash' has no attribute {name!r}")
