"""Files that ship inside the pinned upstream llama.cpp tree (never committed to this repo).

Used by the tests to reach upstream's tokenizer test vectors (`models/ggml-vocab-*.gguf` with
their `.inp` / `.out` files) without a full build. Sources, in order:

1. ``DFLASH_VENDOR_SRC``: an extracted llama.cpp tree (the variable the build uses too);
2. the pinned sdist tarball (``DFLASH_VENDOR_SDIST``, else ``$DFLASH_CACHE`` or ``~/.cache/dflash``),
   checked against the sha256 in ``vendor/manifest.toml``; only the wanted members are extracted,
   into a cache folder keyed by that sha256;
3. a tree the build materialised under ``build/*/upstream/llama.cpp-*``;
4. the sdist downloaded from the package registry with pip (``vendor/materialise.py``'s
   ``fetch_sdist`` when the repo is at hand), then as 2.

Everything missing raises VendorFileError with what was tried.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

REPO_ROOT = Path(__file__).resolve().parent.parent
VOCAB_TEST_SEPARATOR = "\n__ggml_vocab_test__\n"


class VendorFileError(RuntimeError):
    """An upstream file could not be found or verified."""


@dataclass(frozen=True)
class VocabTestFiles:
    gguf: Path
    inp: Path
    out: Path


def _cache_root() -> Path:
    return Path(os.environ.get("DFLASH_CACHE") or Path.home() / ".cache" / "dflash")


def read_manifest(root: Path = REPO_ROOT) -> dict[str, str]:
    """The flat ``key = "value"`` pins of vendor/manifest.toml."""
    path = root / "vendor" / "manifest.toml"
    if not path.is_file():
        raise VendorFileError(f"{path} not found: the pinned upstream sdist cannot be verified without it")
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        m = re.match(r'\s*(\w+)\s*=\s*"([^"]*)"', line)
        if m:
            out[m.group(1)] = m.group(2)
    for k in ("package", "version", "sdist", "sha256", "subdir"):
        if k not in out:
            raise VendorFileError(f"{path} has no '{k}'")
    return out


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _from_tree(tree: Path, members: Sequence[str]) -> dict[str, Path] | None:
    found = {m: tree / m for m in members}
    return found if all(p.is_file() for p in found.values()) else None


def _local_sdists(up: dict[str, str]) -> list[Path]:
    cands = []
    if os.environ.get("DFLASH_VENDOR_SDIST"):
        cands.append(Path(os.environ["DFLASH_VENDOR_SDIST"]))
    cands.append(_cache_root() / up["sdist"])
    cands.append(Path.home() / ".cache" / "dflash" / up["sdist"])
    seen: list[Path] = []
    for c in cands:
        if c.is_file() and c not in seen:
            seen.append(c)
    return seen


def _extract_members(sdist: Path, up: dict[str, str], members: Sequence[str]) -> dict[str, Path]:
    """Extract `members` (paths inside the llama.cpp tree) from a verified sdist into the cache."""
    dest = _cache_root() / "vendor-files" / up["sha256"][:16]
    stamp = dest / ".complete"
    if stamp.is_file() and set(stamp.read_text().split("\n")) >= set(members):
        got = _from_tree(dest, members)
        if got:
            return got
    digest = sha256_of(sdist)
    if digest != up["sha256"]:
        raise VendorFileError(f"{sdist}: sha256 {digest} does not match the pinned {up['sha256']}")
    prefix = f"{sdist.name.removesuffix('.tar.gz')}/{up['subdir']}/"
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tar:
        for m in members:
            try:
                info = tar.getmember(prefix + m)
            except KeyError:
                raise VendorFileError(f"{sdist} has no member {prefix + m}") from None
            src = tar.extractfile(info)
            if src is None:
                raise VendorFileError(f"{sdist}: {prefix + m} is not a regular file")
            target = dest / m
            target.parent.mkdir(parents=True, exist_ok=True)
            # Write then rename, so a concurrent reader never sees half a file.
            fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".part")
            try:
                with os.fdopen(fd, "wb") as f, src:
                    shutil.copyfileobj(src, f)
                os.replace(tmp, target)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
    old = set(stamp.read_text().split("\n")) if stamp.is_file() else set()
    stamp.write_text("\n".join(sorted(old | set(members))))
    got = _from_tree(dest, members)
    assert got is not None
    return got


def _materialise_module(root: Path) -> ModuleType | None:
    path = root / "vendor" / "materialise.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("_dflash_vendor_materialise", path)
    if spec is None or spec.loader is None:
        return None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _download_sdist(up: dict[str, str], root: Path) -> Path:
    mod = _materialise_module(root)
    if mod is not None:
        try:
            return Path(mod.fetch_sdist(up))
        except mod.VendorError as e:
            raise VendorFileError(str(e)) from e
    cache = _cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-build-isolation",
        "--no-binary",
        up["package"],
        f"{up['package']}=={up['version']}",
        "-d",
        str(cache),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    path = cache / up["sdist"]
    if r.returncode != 0 or not path.is_file():
        raise VendorFileError(f"could not download the upstream sdist ({' '.join(cmd)}):\n{r.stderr[-2000:]}")
    return path


def upstream_files(members: Sequence[str], root: Path = REPO_ROOT, download: bool = True) -> dict[str, Path]:
    """Paths of `members` (relative to the llama.cpp tree, e.g. ``models/ggml-vocab-qwen2.gguf``)."""
    tried: list[str] = []
    src = os.environ.get("DFLASH_VENDOR_SRC")
    if src:
        got = _from_tree(Path(src), members)
        if got:
            return got
        tried.append(f"DFLASH_VENDOR_SRC={src} (files missing)")

    up: dict[str, str] | None = None
    try:
        up = read_manifest(root)
    except VendorFileError as e:
        tried.append(str(e))
    if up is not None:
        for sdist in _local_sdists(up):
            try:
                return _extract_members(sdist, up, members)
            except (VendorFileError, tarfile.TarError, OSError) as e:
                tried.append(f"{sdist}: {e}")

    for tree in sorted(root.glob("build/*/upstream/llama.cpp-*")):
        got = _from_tree(tree, members)
        if got:
            return got
        tried.append(f"{tree} (files missing)")

    if up is not None and download:
        try:
            return _extract_members(_download_sdist(up, root), up, members)
        except (VendorFileError, tarfile.TarError, OSError) as e:
            tried.append(f"download: {e}")
    raise VendorFileError(f"upstream files {list(members)} not found; tried: " + "; ".join(tried))


def vocab_test_files(vocab: str = "qwen2", root: Path = REPO_ROOT, download: bool = True) -> VocabTestFiles:
    """Upstream's tokenizer test vectors for ``models/ggml-vocab-<vocab>.gguf``."""
    base = f"models/ggml-vocab-{vocab}.gguf"
    got = upstream_files([base, base + ".inp", base + ".out"], root, download)
    return VocabTestFiles(got[base], got[base + ".inp"], got[base + ".out"])


def parse_vocab_tests(inp: Path, out: Path) -> dict[str, list[int]]:
    """The cases of a ``.inp`` / ``.out`` pair, read as upstream's test-tokenizer-0 reads them.

    ``.inp``: texts separated by ``\\n__ggml_vocab_test__\\n`` (a trailing separator ends the last
    text); ``.out``: one line per text, token ids separated by spaces, surrounding whitespace
    stripped. A text that appears twice keeps its last expectation (upstream keeps a map).
    """
    raw = inp.read_bytes().decode("utf-8")
    texts: list[str] = []
    pos = 0
    while pos < len(raw):
        nxt = raw.find(VOCAB_TEST_SEPARATOR, pos)
        if nxt == -1:
            texts.append(raw[pos:])
            break
        texts.append(raw[pos:nxt])
        pos = nxt + len(VOCAB_TEST_SEPARATOR)
    body = out.read_bytes().decode("utf-8")
    lines = body.split("\n")
    if body.endswith("\n"):
        lines.pop()  # getline yields no line after the final newline
    if len(texts) != len(lines):
        raise VendorFileError(f"{inp} has {len(texts)} cases but {out} has {len(lines)} lines")
    cases: dict[str, list[int]] = {}
    for text, line in zip(texts, lines, strict=True):
        cases[text] = [int(t) for t in line.split()]
    return cases
