#!/usr/bin/env python3
"""Materialise the pinned upstream llama.cpp tree (never committed) and apply ggml_ext patches.

Sources, in order of preference:
  DFLASH_VENDOR_SRC    an extracted llama.cpp tree (offline builds, the GPU machine)
  DFLASH_VENDOR_SDIST  a local copy of the pinned sdist (checked against the sha256)
  otherwise            the sdist from the package registry via `pip download`, cached in
                       $DFLASH_CACHE (default ~/.cache/dflash)

The result is a patched copy under --dest; a stamp file makes re-runs free.
Prints the path of the patched tree on stdout; errors go to stderr with exit code 1.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANIFEST = ROOT / "vendor" / "manifest.toml"
PATCH_DIR = Path(os.environ.get("DFLASH_PATCH_DIR", ROOT / "ggml_ext" / "patches"))


class VendorError(RuntimeError):
    pass


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def patch_series() -> list[Path]:
    series = PATCH_DIR / "series"
    if not series.exists():
        return []
    names = [ln.strip() for ln in series.read_text().splitlines()]
    return [PATCH_DIR / n for n in names if n and not n.startswith("#")]


def read_manifest() -> dict:
    # A flat `key = "value"` file; parsed by hand so the build needs no TOML library on 3.10.
    out = {}
    for line in MANIFEST.read_text().splitlines():
        m = re.match(r'\s*(\w+)\s*=\s*"([^"]*)"', line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def tree_key(up: dict) -> str:
    h = hashlib.sha256(up["sha256"].encode())
    for p in patch_series():
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def fetch_sdist(up: dict) -> Path:
    local = os.environ.get("DFLASH_VENDOR_SDIST")
    if local:
        path = Path(local)
        if not path.is_file():
            raise VendorError(f"DFLASH_VENDOR_SDIST={local} is not a file")
    else:
        cache = Path(os.environ.get("DFLASH_CACHE", Path.home() / ".cache" / "dflash"))
        cache.mkdir(parents=True, exist_ok=True)
        path = cache / up["sdist"]
        if not path.exists() or sha256_of(path) != up["sha256"]:
            print(f"dflash: downloading {up['package']}=={up['version']} sdist", file=sys.stderr)
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
            # pip's isolated build environment hides the interpreter's own site-packages (pip among
            # them) through these variables: the download runs without them
            env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
            r = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, env=env)
            if r.returncode != 0 or not path.exists():
                raise VendorError(
                    "could not download the upstream sdist; for offline builds set "
                    "DFLASH_VENDOR_SDIST (the tarball) or DFLASH_VENDOR_SRC (an extracted tree)"
                )
    digest = sha256_of(path)
    if digest != up["sha256"]:
        raise VendorError(f"{path}: sha256 {digest} does not match the pinned {up['sha256']}")
    return path


def extract(sdist: Path, up: dict, dest: Path) -> None:
    prefix = f"{sdist.name.removesuffix('.tar.gz')}/{up['subdir']}/"
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            if m.name.startswith(prefix) and (m.isfile() or m.isdir()):
                m.name = m.name[len(prefix) :]
                members.append(m)
        if not members:
            raise VendorError(f"{sdist} has no {up['subdir']}")
        tar.extractall(dest, members=members, filter="data")


def apply_patches(tree: Path) -> None:
    for p in patch_series():
        if not p.exists():
            raise VendorError(f"patch listed in series is missing: {p}")
        base = ["patch", "-p1", "--forward", "--batch", "--fuzz=0", "-d", str(tree), "-i", str(p)]
        dry = subprocess.run(base + ["--dry-run"], capture_output=True, text=True)
        if dry.returncode != 0:
            raise VendorError(
                f"ggml_ext patch {p.name} does not apply to upstream {tree}:\n{dry.stdout}{dry.stderr}"
            )
        subprocess.run(base + ["--quiet"], check=True)


def materialise(dest_root: Path) -> Path:
    up = read_manifest()
    key = tree_key(up)
    dest = dest_root / f"llama.cpp-{up['commit']}-{key}"
    stamp = dest / ".dflash-stamp"
    if stamp.exists() and stamp.read_text() == key:
        return dest
    dest_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=dest_root, prefix=".tmp-"))
    try:
        src = os.environ.get("DFLASH_VENDOR_SRC")
        if src:
            if not (Path(src) / "ggml" / "CMakeLists.txt").exists():
                raise VendorError(f"DFLASH_VENDOR_SRC={src} does not look like a llama.cpp tree")
            shutil.copytree(src, tmp / "t", symlinks=True)
        else:
            extract(fetch_sdist(up), up, tmp / "t")
        apply_patches(tmp / "t")
        (tmp / "t" / ".dflash-stamp").write_text(key)
        if dest.exists():
            shutil.rmtree(dest)
        (tmp / "t").rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, required=True, help="folder that receives the patched tree")
    args = ap.parse_args()
    try:
        print(materialise(args.dest.resolve()))
    except VendorError as e:
        print(f"dflash vendor error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
