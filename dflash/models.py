"""The embedded default model: what `dflash.Engine()` and `dflash-serve` load when no model is given.

The default is the trained target + DFlash drafter pair shipped as package data in
`dflash/data/pair/` (issue 5; `tools/train_pair/install.py` copies a training run's export there).
Without it (a checkout before the pair was installed), the default is the project's own small
synthetic qwen35 model (random weights, real tokenizer), written once into the cache folder from
a fixed seed: no download, same bytes on every machine, and no drafter.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

PAIR_DIR = Path(__file__).parent / "data" / "pair"
PAIR_TARGET = "target-q8_0.gguf"
PAIR_DRAFTER = "drafter-q8_0.gguf"

DEFAULT_PRESET = "small"
DEFAULT_TYPE = "q8_0"
DEFAULT_SEED = 0
_VERSION = 1  # bump when the synthetic writer's output changes


def cache_dir() -> Path:
    root = os.environ.get("DFLASH_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "dflash")
    return Path(root) / "models"


def packaged_target() -> Path | None:
    """The packaged pair's target GGUF, or None when the package carries no pair."""
    path = PAIR_DIR / PAIR_TARGET
    return path if path.is_file() else None


def default_model_path() -> Path:
    """Path of the default target GGUF: the packaged pair's target, else the synthetic model
    (written on first use)."""
    packaged = packaged_target()
    if packaged is not None:
        return packaged
    return _synthetic_default()


def default_draft_path() -> Path | None:
    """The packaged drafter GGUF that goes with `default_model_path()`; None without a packaged pair
    (the synthetic fallback has no drafter)."""
    path = PAIR_DIR / PAIR_DRAFTER
    return path if packaged_target() is not None and path.is_file() else None


def _synthetic_default() -> Path:
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
