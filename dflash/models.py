"""The embedded default model: what `dflash.Engine()` and `dflash-serve` load when no model is given.

Until the trained target+drafter pair ships as package data, the default is the project's own
small synthetic qwen35 model (random weights, real tokenizer), written once into the cache
folder from a fixed seed: no download, same bytes on every machine.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

DEFAULT_PRESET = "small"
DEFAULT_TYPE = "q8_0"
DEFAULT_SEED = 0
_VERSION = 1  # bump when the synthetic writer's output changes


def cache_dir() -> Path:
    root = os.environ.get("DFLASH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "dflash")
    return Path(root) / "models"


def default_model_path() -> Path:
    """Path of the default target GGUF, writing it on first use."""
    packaged = Path(__file__).parent / "data" / "default-target.gguf"
    if packaged.exists():
        return packaged
    from dflash.synth import get_preset, write_qwen35_gguf

    path = cache_dir() / f"default-{DEFAULT_PRESET}-{DEFAULT_TYPE}-s{DEFAULT_SEED}-v{_VERSION}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        # Write to a temporary name and rename, so concurrent first uses never see half a file.
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".part")
        os.close(fd)
        try:
            write_qwen35_gguf(
                tmp, get_preset(DEFAULT_PRESET).config, seed=DEFAULT_SEED, weight_type=DEFAULT_TYPE
            )
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return path
