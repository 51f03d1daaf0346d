"""ggml_ext's CUDA kernels on the CPU emulator (ggml_ext/emu/cuda_emu.h), so that their logic is
tested where there is no GPU. The emulator runs every CUDA thread of a block as a fiber, with
shuffles, barriers, cp.async groups and the tensor-core products of PTX's fragment layouts; its
self-test checks those primitives against plain loops (and a missing lane at a barrier must be
reported, never hang). Then tools/device/gemv_standalone.cu, the same source that checks the
kernels on the H200, runs its checks here: the GEMV (Q4_K, Q5_K, Q6_K, Q8_0) in every layout (against a host
reference of ggml's formats; bit-equal columns for 1 and 8 columns, the staged Q6_K kernel
bit-equal to the direct one) and the tensor-core GEMM at every stage count. A GPU's rounding of
fast-math functions and of tensor-core f16 sums is not modelled, so the bounds are the GPU's."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
EMU = REPO / "ggml_ext" / "emu"
FLAGS = ["-std=c++17", "-O2", "-ffp-contract=off", "-DDFLASH_CUDA_EMU"]
INCLUDES = [
    f"-I{EMU}",
    f"-I{EMU / 'shim'}",
    f"-I{REPO / 'ggml_ext' / 'kernels'}",
    f"-I{REPO / 'ggml_ext' / 'include'}",
]


def _compile(sources: list[Path], out: Path) -> Path:
    cxx = shutil.which("g++") or shutil.which("c++")
    assert cxx, "no C++ compiler: the package build needs one too"
    cmd = [cxx, *FLAGS, "-x", "c++", *map(str, sources), "-x", "none", str(EMU / "cuda_emu.cpp"), *INCLUDES]
    r = subprocess.run([*cmd, "-o", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cuda_emu")


@pytest.fixture(scope="module")
def selftest(build_dir: Path) -> Path:
    return _compile([EMU / "emu_selftest.cpp"], build_dir / "emu_selftest")


@pytest.fixture(scope="module")
def standalone(build_dir: Path) -> Path:
    return _compile([REPO / "tools" / "device" / "gemv_standalone.cu"], build_dir / "gemv_standalone_emu")


def test_emulated_warp_primitives(selftest: Path) -> None:
    r = subprocess.run([str(selftest), "warp"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout[-3000:] + r.stderr[-2000:]


def test_a_lane_missing_at_a_barrier_is_reported(selftest: Path) -> None:
    r = subprocess.run([str(selftest), "deadlock"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "deadlock" in r.stderr, (r.returncode, r.stdout, r.stderr)


def test_emulated_half_matches_numpy(selftest: Path) -> None:
    rng = np.random.default_rng(0)
    scales = (1e-8, 1e-6, 1e-4, 1.0, 100.0, 1e4, 6e4)
    x = np.concatenate(
        [(rng.standard_normal(2000) * s).astype(np.float32) for s in scales]
        + [np.array([0.0, -0.0, 65504, 65519.99, 6.1035156e-05, 5.9604645e-08, 2.9802322e-08], np.float32)]
    )
    r = subprocess.run(
        [str(selftest), "half"],
        input="\n".join(f"{v:.9g}" for v in x),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout[-2000:]  # also: every binary16 value survives a round trip
    got = np.array([int(s) for s in r.stdout.split()], dtype=np.uint16)
    with np.errstate(over="ignore"):
        want = x.astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(got, want)


def _checks(binary: Path, what: str, key: str) -> list[dict]:
    r = subprocess.run([str(binary), what], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{") and key in line]


def test_gemv_kernels_on_the_emulator(standalone: Path) -> None:
    rows = _checks(standalone, "check", '"check"')
    assert len(rows) == 4 * 5 * 6  # Q4_K, Q6_K, Q5_K, Q8_0 x 5 shapes x 6 layouts
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad[:5]


def test_tensor_core_gemm_on_the_emulator(standalone: Path) -> None:
    rows = _checks(standalone, "check_mma", '"check_mma"')
    assert len(rows) == 95  # Q4_K: 2 shapes x 5 column counts x 5 variants; Q6_K: 3 x 5 x 3
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad[:5]
