"""Upstream llama.cpp programs (llama-speculative-simple, llama-server, llama-bench, ...) from the
same pinned upstream tree as dflash's engine, for side-by-side comparisons.

Built here, they come from that tree as released (the pinned sdist's vendor/llama.cpp) without
dflash's ggml_ext patch series: the patches only add dispatch hooks for our own ops, which
upstream's programs never use, and a patched tree builds only inside dflash's CMake project (the
hooks' kernels live in ggml_ext). tools/device/setup.sh builds the GPU ones inside that project.

`upstream_binary(name)` looks, in order:

1. in ``$DFLASH_UPSTREAM_BIN`` (a folder; tools/device/setup.sh points it at its CUDA build). When
   the variable is set the program must be there: falling back to a CPU build would quietly spoil
   a GPU comparison;
2. in the cache, ``$DFLASH_CACHE`` (default ``~/.cache/dflash``) ``/upstream-<commit>/bin``, if it
   was built from the current pin (the sdist's sha256);
3. with ``build=True``, it builds it there: ``vendor/materialise.py`` writes the tree (from
   $DFLASH_VENDOR_SRC or the cached sdist), CMake configures it once (Release, static, CPU unless
   ``$DFLASH_UPSTREAM_CMAKE_ARGS`` says otherwise, no web UI assets) and builds only the wanted
   target with one job per core, under a file lock so concurrent processes build it once.

The runners live in `dflash.upstream_spec` and `dflash.upstream_server`; they are re-exported here.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from dflash.upstream_server import run_server_bench
from dflash.upstream_spec import UpstreamRunError, run_speculative_simple

__all__ = [
    "BUILD_SECONDS",
    "UpstreamToolError",
    "UpstreamRunError",
    "run_server_bench",
    "run_speculative_simple",
    "upstream_binary",
]

PACKAGE_ROOT = Path(__file__).resolve().parent.parent

# CMake options of the upstream build: everything the wanted programs need is configured, and only
# the asked-for target is built. No tests, no OpenSSL, no web UI (llama-server then serves an
# empty asset table; the API is unchanged).
CMAKE_OPTIONS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_COMMON=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
]

# name -> seconds, for every program this process built (the CI test reports it).
BUILD_SECONDS: dict[str, float] = {}


class UpstreamToolError(RuntimeError):
    """An upstream program could not be found or built; the message says why."""


def _cache_root() -> Path:
    return Path(os.environ.get("DFLASH_CACHE") or Path.home() / ".cache" / "dflash")


def _source_root(explicit: Path | None) -> Path | None:
    """The dflash checkout that holds vendor/materialise.py (an installed wheel does not)."""
    cands = [explicit] if explicit is not None else []
    if os.environ.get("DFLASH_SOURCE_ROOT"):
        cands.append(Path(os.environ["DFLASH_SOURCE_ROOT"]))
    cands.append(PACKAGE_ROOT)
    cwd = Path.cwd().resolve()
    cands.extend([cwd, *cwd.parents])
    for c in cands:
        if (c / "vendor" / "materialise.py").is_file() and (c / "vendor" / "manifest.toml").is_file():
            return c
    return None


def _load_materialise(root: Path) -> ModuleType:
    """vendor/materialise.py, set to apply no patches (see the module doc)."""
    spec = importlib.util.spec_from_file_location("_dflash_materialise", root / "vendor" / "materialise.py")
    if spec is None or spec.loader is None:
        raise UpstreamToolError(f"cannot load {root / 'vendor' / 'materialise.py'}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.PATCH_DIR = root / "vendor" / "no-patches"  # no series file there: patch_series() is empty
    return mod


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _fresh(binary: Path, key: str | None) -> bool:
    """Built from the tree `key` (any build counts when the key is unknown: no checkout at hand)."""
    if not binary.is_file() or not os.access(binary, os.X_OK):
        return False
    stamp = binary.parent / f".{binary.name}.tree"
    return key is None or (stamp.is_file() and stamp.read_text().strip() == key)


def _run_logged(cmd: list[str], log: Path, what: str) -> None:
    with log.open("a") as f:
        f.write(f"$ {shlex.join(cmd)}\n")
        f.flush()
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
        raise UpstreamToolError(f"{what} failed (exit {r.returncode}); log {log}:\n{tail}")


def _build(name: str, root: Path, home: Path, bin_dir: Path) -> Path:
    if shutil.which("cmake") is None:
        raise UpstreamToolError(f"building upstream {name} needs cmake on PATH")
    mat = _load_materialise(root)
    key = mat.tree_key(mat.read_manifest())
    # Earlier trees and build folders (another pin) are dropped first.
    for old in [*home.glob("build-*"), *(home / "src").glob("llama.cpp-*")]:
        if not old.name.endswith(key):
            shutil.rmtree(old, ignore_errors=True)
    try:
        tree = Path(mat.materialise(home / "src"))
    except mat.VendorError as e:
        raise UpstreamToolError(f"could not materialise the upstream tree: {e}") from e
    build_dir = home / f"build-{key}"
    build_dir.mkdir(parents=True, exist_ok=True)
    log = build_dir / f"dflash-build-{name}.log"
    log.write_text("")
    t0 = time.monotonic()
    if not (build_dir / "CMakeCache.txt").is_file():
        cmd = ["cmake", "-S", str(tree), "-B", str(build_dir), *CMAKE_OPTIONS]
        if shutil.which("ninja"):
            cmd += ["-G", "Ninja"]
        if os.environ.get("DFLASH_PORTABLE"):
            cmd.append("-DGGML_NATIVE=OFF")
        cmd += shlex.split(os.environ.get("DFLASH_UPSTREAM_CMAKE_ARGS", ""))
        _run_logged(cmd, log, "configuring upstream llama.cpp")
    jobs = str(os.cpu_count() or 2)
    _run_logged(
        ["cmake", "--build", str(build_dir), "--target", name, "-j", jobs], log, f"building upstream {name}"
    )
    built = build_dir / "bin" / name
    if not built.is_file():
        raise UpstreamToolError(f"the build of {name} finished but {built} does not exist; log {log}")
    bin_dir.mkdir(parents=True, exist_ok=True)
    tmp = bin_dir / f".{name}.part"
    shutil.copy2(built, tmp)
    os.replace(tmp, bin_dir / name)
    (bin_dir / f".{name}.tree").write_text(key)
    BUILD_SECONDS[name] = time.monotonic() - t0
    print(f"dflash: built upstream {name} in {BUILD_SECONDS[name]:.0f} s (log {log})", file=sys.stderr)
    return bin_dir / name


def upstream_binary(name: str, *, build: bool = True, source_root: Path | None = None) -> Path:
    """Path of upstream's program `name`, building it from the vendor tree if needed (see module doc).

    `source_root`: the dflash checkout (default: this package's parent, $DFLASH_SOURCE_ROOT, or the
    working folder and its parents), needed to build and to tell a stale build from a fresh one.
    """
    env_dir = os.environ.get("DFLASH_UPSTREAM_BIN")
    if env_dir:
        path = Path(env_dir) / name
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise UpstreamToolError(f"DFLASH_UPSTREAM_BIN={env_dir} has no executable {name}")

    root = _source_root(source_root)
    if root is not None:
        mat = _load_materialise(root)
        manifest = mat.read_manifest()
        key: str | None = mat.tree_key(manifest)
        homes = [_cache_root() / f"upstream-{manifest['commit']}"]
    else:
        key = None
        homes = sorted(_cache_root().glob("upstream-*"))
    for home in homes:
        if _fresh(home / "bin" / name, key):
            return home / "bin" / name

    if not build:
        looked = ", ".join(str(h / "bin") for h in homes) or "no cache folder"
        raise UpstreamToolError(
            f"upstream {name} is not built (looked in {looked}); "
            "call with build=True or set DFLASH_UPSTREAM_BIN"
        )
    if root is None:
        raise UpstreamToolError(
            f"cannot build upstream {name}: no dflash source checkout (vendor/materialise.py) found; "
            "run from the repository, set DFLASH_SOURCE_ROOT, or set DFLASH_UPSTREAM_BIN"
        )
    home = homes[0]
    with _locked(home / ".build.lock"):
        if _fresh(home / "bin" / name, key):  # another process built it while we waited
            return home / "bin" / name
        return _build(name, root, home, home / "bin")
