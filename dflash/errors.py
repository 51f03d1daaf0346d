"""Exceptions raised by dflash. All derive from DflashError (itself a RuntimeError)."""

from __future__ import annotations

from dflash._core import (
    ContextOverflowError,
    DflashError,
    EngineError,
    InvalidParameterError,
    ModelLoadError,
)

__all__ = [
    "DflashError",
    "ModelLoadError",
    "InvalidParameterError",
    "ContextOverflowError",
    "EngineError",
    "context_overflow",
]


def context_overflow(n_prompt: int, n_ctx: int) -> ContextOverflowError:
    """The error for a request needing n_prompt tokens of context when n_ctx are available."""
    e = ContextOverflowError(f"the request needs {n_prompt} tokens of context but n_ctx is {n_ctx}")
    e.n_prompt = n_prompt  # type: ignore[attr-defined]
    e.n_ctx = n_ctx  # type: ignore[attr-defined]
    return e
