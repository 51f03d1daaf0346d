"""Where a drafter comes from: a GGUF (as convert-draft writes it) or a z-lab safetensors
directory, which is converted once into the cache folder (keyed by its files' size and time)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from dflash.errors import ModelLoadError


def resolve_drafter(draft: str, target: str) -> Path:
    p = Path(draft)
    if p.is_file():
        return p
    if not p.is_dir():
        raise ModelLoadError(f"drafter not found: {draft}")
    from dflash.models import cache_dir

    h = hashlib.sha256(str(Path(target).resolve()).encode())
    for f in sorted(p.iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    out = cache_dir() / f"drafter-{h.hexdigest()[:16]}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            from dflash_convert import ConvertError, convert_draft
        except ImportError as e:  # pragma: no cover - installed with the package
            raise ModelLoadError(f"cannot convert {draft}: {e}") from e
        try:
            convert_draft(p, out, outtype="f16", target=target)
        except ConvertError as e:
            raise ModelLoadError(f"drafter {draft} cannot be used with {target}: {e}") from e
        os.utime(out)
    return out
