"""ggml_ext's CUDA kernels on the CPU emulator (ggml_ext/emu/cuda_emu.h), so that their logic is
tested where there is no GPU. The emulator runs every CUDA thread of a block as a fiber, with
shuffles, barriers, cp.async groups and the tensor-core products of PTX's fragment layouts; its
self-test checks those primitives against plain loops (and a missing lane at a barrier must be
reported, never hang). Then tools/device/gemv_standalone.cu, the same source that checks the
kernels on the H200, runs its checks here: the GEMV (Q4_K, Q5_K, Q6_K, Q8_0) in every layout
(against a host reference of ggml's formats; bit-equal columns for 1 and 8 columns, the staged
Q6_K kernel bit-equal to the direct one) and the tensor-core GEMM (the same four types) at every
stage count; and the tree ops, the fused GDN inputs and the top-K through their ggml entry points
against the CPU ops. A GPU's rounding of fast-math functions and of tensor-core f16 sums is not
modelled, so the bounds are the GPU's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dflash import _core

REPO = Path(__file__).resolve().parents[1]
EMU = REPO / "ggml_ext" / "emu"
FLAGS = ["-std=c++17", "-O2", "-ffp-contract=off", "-DDFLASH_CUDA_EMU"]
INCLUDES = [
    f"-I{EMU}",
    f"-I{EMU / 'shim'}",
    f"-I{REPO / 'ggml_ext' / 'kernels'}",
    f"-I{REPO / 'ggml_ext' / 'include'}",
]


# AddressSanitizer: the CI's memcheck of the kernels (the emulator announces its fiber switches to
# it; device allocations end at the 16-byte chunk holding their last byte, see cudaMalloc there).
# -g1: line tables only, enough for a report's file:line; full -g took the standalone's compile from
# 131 to 191 s on CI's 2 cores (session 36).
ASAN = ["-O1", "-g1", "-fsanitize=address", "-fno-omit-frame-pointer"]
ASAN_ENV = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0"}


def _compile(sources: list[Path], out: Path, extra: list[str] | None = None) -> Path:
    cxx = shutil.which("g++") or shutil.which("c++")
    assert cxx, "no C++ compiler: the package build needs one too"
    cmd = [
        cxx,
        *FLAGS,
        *(extra or []),
        "-x",
        "c++",
        *map(str, sources),
        "-x",
        "none",
        str(EMU / "cuda_emu.cpp"),
    ]
    r = subprocess.run([*cmd, *INCLUDES, "-o", str(out)], capture_output=True, text=True, timeout=600)
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


def test_wgmma_reading_unfenced_cp_async_bytes_is_reported(selftest: Path) -> None:
    """cp.async then wgmma needs fence.proxy.async between them (the copy writes through the generic
    proxy, wgmma reads through the async one): with it the product is right, without it the
    emulator aborts (on a GPU the read may see stale bytes)."""
    r = subprocess.run([str(selftest), "unfenced"], capture_output=True, text=True, timeout=120)
    assert "fenced ok" in r.stdout, (r.stdout, r.stderr)
    assert r.returncode != 0 and "fence.proxy.async" in r.stderr, (r.returncode, r.stdout, r.stderr)


def test_emulated_mbarrier_pipeline_and_named_barriers(selftest: Path) -> None:
    """kernels/mbarrier.cuh on the emulator: a producer warp stages 5 rounds through 2 stages, half
    of each with bulk copies and half with cp.asyncs that arrive once landed (.noinc), on `full`
    barriers, and consumer warps release them on `empty` ones (every sum right, each copy's
    destination poisoned until its barrier is tested; a `full` count that leaves the cp.asyncs out
    lets a consumer read their poison), and named barriers (bar.sync of two 64-thread groups,
    bar.arrive then bar.sync)."""
    r = subprocess.run([str(selftest), "pipeline"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout[-3000:] + r.stderr[-2000:]


def test_a_wait_on_a_stage_nobody_fills_is_reported(selftest: Path) -> None:
    r = subprocess.run([str(selftest), "stalled"], capture_output=True, text=True, timeout=120)
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


def _checks(binary: Path, what: str, key: str, env: dict | None = None) -> list[dict]:
    r = subprocess.run([str(binary), what], capture_output=True, text=True, timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{") and key in line]


def test_gemv_kernels_on_the_emulator(standalone: Path) -> None:
    rows = _checks(standalone, "check", '"check"')
    assert len(rows) == 4 * 5 * 6  # Q4_K, Q6_K, Q5_K, Q8_0 x 5 shapes x 6 layouts
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad[:5]


def test_kernels_read_no_memory_past_their_buffers(build_dir: Path) -> None:
    """Under AddressSanitizer: every type and layout on small shapes with tails (odd row and
    super-block counts), the GEMV and the GEMM at every stage count."""
    binary = _compile(
        [REPO / "tools" / "device" / "gemv_standalone.cu"], build_dir / "gemv_standalone_asan", ASAN
    )
    rows = _checks(binary, "check_quick", '"ok"', ASAN_ENV)
    # GEMV; GEMM (8 column counts, 6 variants; Q4_K, Q5_K: 8 more; Q6_K: 6 warps and 8 (the stages in dynamic
    # shared memory, with and without the occupancy hint), 3 more; two row tiles a warp: 2 variants for Q4_K
    # and Q5_K, 1 for Q6_K and Q8_0) ... and the GEMM with a residual (each type's engine form x 8 column
    # counts), the wgmma form's activation layout against Q4_K's (one line), the GEMM's quantizer byte for
    # byte against a host reference of its rule for every layout (one line) and for two layouts from one
    # launch (one line: a pair of products, rms_norm_fusion.cu), the quantizers reading a SwiGLU's inputs
    # against quantizing its output (the GEMV's, the GEMM's Q4_K, Q6_K and Q8_0 layouts: glu_fusion.cu's
    # bits), the GEMM's quantizer reading an RMSNorm's input against quantizing ggml's norm kernel's output
    # (rms_norm_fusion.cu's bits; 16 lines: 5 and 40 columns, a block a column and the blocks of a
    # super-block's values that each sum the scale), the GEMV's quantizer reading an RMSNorm's input against
    # its plain quantizer of ggml's norm output (6 lines: 256 and 1024 norm threads, 1 and 3 columns) and
    # reading a per-head RMSNorm's input and its SwiGLU's gate against ggml's norm kernel, then the SwiGLU (9
    # lines: heads of 32..256 values) and reading the attention's output and its sigmoid gate in place against
    # the copied gate and ggml's fused sigmoid and multiply (5 lines), the Q4_K wgmma GEMM through the
    # emulator's asynchronous wgmma (7 column counts x 10 forms, and one super-block: 2 x 10; the pipelined
    # forms, the early-staging one, that with 2 warpgroups a block, that waiting a chunk at a time with 1 and
    # 3 warpgroups, and the warp-specialized one with 1 and 2 consumer warpgroups must give the first form's
    # bits) and its split along K (4 splits: a last wave of 1 tile, a short matrix's every tile, and pieces of
    # one or two super-blocks; x 3 column counts: against the unsplit kernel, the host reference, a second
    # launch, the pipelined, early-staging and chunk-waiting kernels split the same way, the early one with
    # its residual fused and the warp-specialized one split the same way (swap 8 unsplit above), launched
    # persistent and under a stream split, and 2 warpgroups a block split its own way and under a stream
    # split), and the mma.sync GEMM split along K (Q4_K in 2 pieces, Q6_K in 3, the block's warps sharing the
    # super-blocks; Q4_K in 4, Q6_K in 2 over two blocks, each warp on rows of its own, and those two with the
    # activations staged in shared memory a block; 4 column counts each: against the unsplit kernel, the host
    # reference, a second launch, and with a residual its own outputs plus the residual), and the f16 wgmma
    # GEMM (Q6_K at 9 and 64 columns, at 40 with its tail split, Q4_K at 64; 7 forms each: 3 and 4 stages, 2
    # warpgroups, a residual, and the warp-specialized kernel with one consumer warpgroup, two, and one with a
    # residual, each with the bits of the form it stands for), and the f16 form's activation converter with 8
    # values a thread against that of a value a thread (5 source forms x 2 lengths x 2 column counts), and
    # a pair's halves and int8 bytes from one launch against its two (2 int8 layouts x 2 sources x 2
    # lengths x 3 column counts)
    sources = 4 + 16 + 6 + 9 + 5  # SwiGLU, RMSNorm (two GEMM forms, the GEMV), head norm, sigmoid gate
    mma_splits = 6 * 4
    f16_wgmma = 4 * 7
    f16_convert = 5 * 2 * 2
    act_pair = 2 * 2 * 2 * 3
    assert len(rows) == (
        4 * 2 * 6
        + 4 * 8 * 6
        + 2 * 8 * 8
        + 3 * 8
        + 8 * 6
        + 4 * 8
        + 1
        + 2
        + sources
        + 90
        + 12
        + mma_splits
        + f16_wgmma
        + f16_convert
        + act_pair
    )
    pieces = [r for r in rows if "check_mma_split" in r]
    forms = {(r["check_mma_split"], r["warp_rows"], r["act_smem"], r["pieces"]) for r in pieces}
    assert sorted(forms) == [
        ("q4_K", False, False, 2),
        ("q4_K", True, False, 4),
        ("q4_K", True, True, 4),
        ("q6_K", False, False, 3),
        ("q6_K", True, False, 2),
        ("q6_K", True, True, 2),
    ]
    assert all(r["relaunch_same"] and r["residual_added"] for r in pieces)
    assert any("check_wgmma_layout" in r for r in rows)
    wgmma = [r for r in rows if "check_wgmma" in r]
    assert len(wgmma) == 90
    assert sorted({r["swap"] for r in wgmma}) == list(range(10))
    assert all(r["same_bits"] for r in wgmma if r["swap"] >= 2)
    splits = [r for r in rows if "check_wgmma_split" in r]
    assert sorted({r["pieces"] for r in splits}) == [2, 3, 8]
    assert any(r["full_tiles"] == 0 for r in splits)  # every tile in pieces
    assert all(r["pipe_same"] and r["early_same"] and r["chunks_same"] for r in splits)
    assert all(r["res_same"] and r["ws_same"] and r["ws2_same"] for r in splits)
    assert all(r["ws_persistent_same"] and r["ws2_persistent_same"] for r in splits)
    # the stream split (runs across tiles), 1 and 2 consumer warpgroups: near the whole, the same bits
    # again, the residual added in place
    assert all(r["stream_ok"] for r in splits)
    assert sorted({tuple(r["stream_workers"]) for r in splits}) == [(2, 2), (3, 3), (7, 6), (16, 9)]
    assert all(r["two_wg_pieces"] > 1 and r["two_wg_vs_whole"] <= 1e-5 for r in splits)
    assert sorted(r["check_quantize_bytes"] for r in rows if "check_quantize_bytes" in r) == [
        "all layouts",
        "two layouts",
    ]
    norms = [r for r in rows if "check_rms_norm_source" in r]
    assert len(norms) == 16 and sorted({r["column"] for r in norms}) == [False, True]
    gemv_norms = [r for r in rows if "check_gemv_rms_norm_source" in r]
    assert sorted({r["check_gemv_rms_norm_source"] for r in gemv_norms}) == [768, 2304, 2400, 5120]
    heads = [r for r in rows if "check_head_norm_source" in r]
    assert sorted({r["head"] for r in heads}) == [32, 64, 128, 256] and len(heads) == 9
    assert sum("check_sigmoid_gate_source" in r for r in rows) == 5
    assert sorted(r["check_swiglu_source"] for r in rows if "check_swiglu_source" in r) == [
        "gemv",
        "q4_K",
        "q6_K",
        "q8_0",
    ]
    assert all(r["ok"] for r in rows), [r for r in rows if not r["ok"]][:5]


def test_tensor_core_gemm_on_the_emulator(standalone: Path) -> None:
    lines = _checks(standalone, "check_mma", '"check_mma')
    rows = [r for r in lines if "check_mma" in r]
    res = [r for r in lines if "check_mma_residual" in r]
    # Q4_K: 2 shapes x 8 column counts x 16 variants; Q5_K 2 x 8 x 16; Q6_K 3 x 8 x 10; Q8_0 2 x 8 x 7
    assert len(rows) == 864
    assert {r["warps"] for r in rows if r["stages"] >= 1000000} == {2, 4}  # two row tiles: Q6_K, Q8_0 2 warps
    # 8 warps without the f16 min term: Q6_K's, its stages in dynamic shared memory
    assert {r["check_mma"] for r in rows if r["stages"] in (10002, 11002)} == {"q6_K"}
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad[:5]
    # the residual of a fused add: the plain outputs plus the residual, bit for bit (Q4_K 2 shapes,
    # Q5_K 2, Q6_K 3, Q8_0 2, x 8 column counts)
    assert len(res) == 9 * 8 and all(r["ok"] for r in res), [r for r in res if not r["ok"]][:5]


# ---- ggml_ext's CUDA ops through their ggml entry points (emu/ops_emu.cpp) vs the CPU ops ----------


def _ggml_include(tmp: Path) -> Path:
    """ggml.h of the materialised upstream tree with today's patches: the package build's, else
    materialised now."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("materialise", REPO / "vendor" / "materialise.py")
    assert spec and spec.loader
    mat = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mat)
    up = mat.read_manifest()
    hits = sorted(
        REPO.glob(f"build/*/upstream/llama.cpp-{up['commit']}-{mat.tree_key(up)}/ggml/include/ggml.h")
    )
    if hits:
        return hits[-1].parent
    r = subprocess.run(
        [sys.executable, str(REPO / "vendor" / "materialise.py"), "--dest", str(tmp / "upstream")],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return Path(r.stdout.strip()) / "ggml" / "include"


@pytest.fixture(scope="module")
def ops(build_dir: Path) -> Path:
    inc = _ggml_include(build_dir)
    cxx = shutil.which("g++") or shutil.which("c++")
    assert cxx, "no C++ compiler: the package build needs one too"
    out = build_dir / "ops_emu"  # under AddressSanitizer: the inputs are exact-sized vectors
    cmd = [cxx, *FLAGS, *ASAN, str(EMU / "ops_emu.cpp"), str(EMU / "cuda_emu.cpp"), *INCLUDES, f"-I{inc}"]
    r = subprocess.run([*cmd, "-o", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return out


def _run_op(
    ops: Path, tmp: Path, op: str, meta: list[int], arrays: dict[str, np.ndarray], dtype: type = np.float32
) -> np.ndarray:
    tmp = tmp / f"{op}-{'-'.join(map(str, meta))}"
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "meta.txt").write_text(" ".join(map(str, meta)))
    for name, a in arrays.items():
        assert a.dtype in (np.float32, np.int32), f"{name}: {a.dtype}"
        (tmp / f"{name}.bin").write_bytes(np.ascontiguousarray(a).tobytes())
    r = subprocess.run([str(ops), op, str(tmp)], capture_output=True, text=True, timeout=600, env=ASAN_ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    return np.frombuffer((tmp / "out.bin").read_bytes(), dtype)


def _tree_index(parents: list[int]) -> np.ndarray:
    """ggml_ext's tree index rows: parents, a depth-first preorder, depths."""
    n = len(parents)
    kids: list[list[int]] = [[] for _ in range(n)]
    roots = []
    for i, p in enumerate(parents):
        (roots if p < 0 else kids[p]).append(i)
    order, depth, stack = [], [0] * n, roots[::-1]
    while stack:
        i = stack.pop()
        order.append(i)
        depth[i] = 0 if parents[i] < 0 else depth[parents[i]] + 1
        stack.extend(kids[i][::-1])
    return np.array([parents, order, depth], np.int32)


def _random_parents(rng: np.random.Generator, n: int, chain: float) -> list[int]:
    """Node i's parent: i - 1 with probability `chain`, else any earlier node (or none)."""
    return [-1] + [i - 1 if rng.random() < chain else int(rng.integers(-1, i)) for i in range(1, n)]


def _close(got: np.ndarray, want: np.ndarray, rel: float, what: str) -> None:
    err = float(np.abs(got - want).max())
    assert err <= rel * max(1.0, float(np.abs(want).max())), f"{what}: max |emulated CUDA - CPU| {err:.3g}"


@pytest.mark.parametrize("seed", range(4))
def test_emulated_tree_conv_equals_the_cpu_op(ops: Path, build_dir: Path, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, c, k = int(rng.integers(1, 40)), 96, 4
    parents = _random_parents(rng, n, chain=0.6)
    x = rng.standard_normal((n, c)).astype(np.float32)
    cs = rng.standard_normal((c, k - 1)).astype(np.float32)
    w = rng.standard_normal((c, k)).astype(np.float32)
    arrays = {"x": x, "conv_state": cs, "w": w, "tree": _tree_index(parents)}
    got = _run_op(ops, build_dir, "tree_ssm_conv", [c, n, k], arrays)
    want = _core.op_tree_ssm_conv(x, cs, w, parents)
    _close(got.reshape(n, c), want, 1e-6, f"tree conv, {n} nodes")  # the CPU op fuses where FMA exists


@pytest.mark.parametrize("s", [16, 32, 64, 128])
def test_emulated_tree_delta_rule_equals_the_cpu_op(ops: Path, build_dir: Path, s: int) -> None:
    rng = np.random.default_rng(s)
    n, hk, hv = 24, 2, 4
    parents = _random_parents(rng, n, chain=0.5)
    f = np.float32
    q = (rng.standard_normal((n, hk, s)) / np.sqrt(s)).astype(f)
    k = (rng.standard_normal((n, hk, s)) / np.sqrt(s)).astype(f)
    v = rng.standard_normal((n, hv, s)).astype(f)
    g = -np.abs(rng.standard_normal((n, hv, 1))).astype(f) * 0.3
    beta = rng.uniform(0.1, 0.9, (n, hv, 1)).astype(f)
    state = rng.standard_normal((hv, s, s)).astype(f) * 0.1
    tree = _tree_index(parents)
    arrays = {"q": q, "k": k, "v": v, "g": g, "beta": beta, "state": state, "tree": tree}
    meta = [s, hk, hv, n, int(tree[2].max())]
    got = _run_op(ops, build_dir, "tree_gated_delta_net", meta, arrays)
    want = _core.op_tree_gated_delta_net(q, k, v, g, beta, state, parents)
    _close(got.reshape(n, hv, s), want, 2e-5, f"tree delta rule, S {s}")


def _gdn_arrays(rng: np.random.Generator, n: int, s: int, hk: int, hv: int) -> dict[str, np.ndarray]:
    f = np.float32
    return {
        "q": (rng.standard_normal((n, hk, s)) / np.sqrt(s)).astype(f),
        "k": (rng.standard_normal((n, hk, s)) / np.sqrt(s)).astype(f),
        "v": rng.standard_normal((n, hv, s)).astype(f),
        "g": -np.abs(rng.standard_normal((n, hv, 1))).astype(f) * 0.3,
        "beta": rng.uniform(0.1, 0.9, (n, hv, 1)).astype(f),
        "state": rng.standard_normal((hv, s, s)).astype(f) * 0.1,
    }


@pytest.mark.parametrize("s", [16, 32, 64, 128])
def test_emulated_chain_delta_rule_columns_and_tree_kernel_agree(ops: Path, build_dir: Path, s: int) -> None:
    """The chain kernel (gdn_chain.cu) with 1, 2 and 4 state columns a warp, each with its inputs
    staged in shared memory (S >= 64; 20 tokens: a full chunk and a partial one) or not, gives the
    same bits, the same bits as the tree kernel on a chain of the same tokens, and the CPU op's
    values."""
    n, hk, hv = 20, 2, 4
    arrays = _gdn_arrays(np.random.default_rng(s + 1), n, s, hk, hv)
    staged = (0, 1) if s >= 64 else (0,)
    runs = [
        _run_op(ops, build_dir, "gated_delta_net", [s, hk, hv, n, c, st], arrays)
        for c in (1, 2, 4)
        for st in staged
    ]
    for i, r in enumerate(runs[1:], 1):
        assert np.array_equal(runs[0], r), f"run {i} (columns, staged) differs"
    chain = [-1, *range(n - 1)]
    tree = _tree_index(chain)
    meta = [s, hk, hv, n, int(tree[2].max()), 1]
    tree_out = _run_op(ops, build_dir, "tree_gated_delta_net", meta, {**arrays, "tree": tree})
    assert np.array_equal(runs[0][: n * hv * s], tree_out)
    a = arrays
    want_out, want_state = _core.op_gated_delta_net(a["q"], a["k"], a["v"], a["g"], a["beta"], a["state"])
    _close(runs[0][: n * hv * s].reshape(n, hv, s), want_out, 2e-5, f"chain delta rule, S {s}")
    _close(runs[0][n * hv * s :].reshape(hv, s, s), want_state, 2e-5, f"chain delta rule's state, S {s}")


# (form, S, tokens, columns, decay, lanes, step): form 1 the chunked form (100 tokens: a full chunk and a
# partial one, the state carried between them), 2 the one-round kernel (1, 2 or 4 columns a lane,
# 0: by the form; 8 or 16 lanes a column, 0: the default; 40 tokens: three staged chunks, both
# buffers reused), 3 the gram kernel (16 tokens at a time; 23, 40, 47: a padded last chunk);
# decay: the log gates times this, one gate zero (the one-round kernel folds the gates' product into
# the state below 1e-20; with U tokens a step, a step whose own gates' product is that small
# walks them one by one); step: the one-round kernel's tokens a step (2 or 4; 47 and 33 tokens: a
# chunk's last tokens under a step, token by token)
REORDERED_CHAINS = [
    (1, 64, 1, 0, 1.0, 0, 1),
    (1, 64, 23, 0, 1.0, 0, 1),
    (1, 128, 64, 0, 1.0, 0, 1),
    (1, 128, 100, 0, 1.0, 0, 1),
    (2, 64, 2, 1, 1.0, 0, 1),
    (2, 64, 23, 2, 1.0, 0, 1),
    (2, 128, 16, 4, 1.0, 0, 1),
    (2, 128, 40, 0, 1.0, 0, 1),
    (2, 128, 40, 2, 30.0, 0, 1),
    (2, 64, 23, 1, 1.0, 16, 1),
    (2, 128, 40, 2, 30.0, 16, 1),
    (2, 128, 17, 4, 1.0, 16, 1),
    (3, 64, 2, 0, 1.0, 0, 1),
    (3, 64, 23, 0, 1.0, 0, 1),
    (3, 128, 16, 0, 1.0, 0, 1),
    (3, 128, 40, 0, 30.0, 0, 1),
    (3, 128, 47, 0, 1.0, 0, 1),
    (2, 64, 23, 2, 1.0, 0, 2),
    (2, 128, 40, 2, 30.0, 0, 2),
    (2, 128, 47, 1, 1.0, 0, 4),
    (2, 128, 40, 2, 30.0, 0, 4),
    (2, 64, 33, 4, 1.0, 0, 4),
]


@pytest.mark.parametrize(("form", "s", "n", "columns", "decay", "lanes", "step"), REORDERED_CHAINS)
def test_emulated_reordered_chain_equals_the_chain_kernel(
    ops: Path, build_dir: Path, form: int, s: int, n: int, columns: int, decay: float, lanes: int, step: int
) -> None:
    """A marked chain's reordered sums (gdn_chunked.cu: 64 tokens at a time as matrix products;
    gdn_chain_one_round.cu: the output from the state before the update, one butterfly a token)
    against the chain kernel on the same inputs: outputs and final state within 1e-5 of their
    scale (float32 sums in another order), and the CPU op's values within 2e-5."""
    hk, hv = 2, 6
    arrays = _gdn_arrays(np.random.default_rng(s + n + 7 * form), n, s, hk, hv)
    unit = arrays["k"] / np.linalg.norm(arrays["k"], axis=-1, keepdims=True)  # the graph L2-normalises k
    arrays["k"] = unit.astype(np.float32)
    if decay != 1.0:
        arrays["g"] *= np.float32(decay)
        arrays["g"][n // 2] = -1e4  # a zero gate
    chain = _run_op(ops, build_dir, "gated_delta_net", [s, hk, hv, n, 0, 1, 0], arrays)
    got = _run_op(ops, build_dir, "gated_delta_net", [s, hk, hv, n, columns, 1, form, lanes, step], arrays)
    out, state = n * hv * s, hv * s * s
    assert got.shape == (out + state,)
    assert not np.array_equal(got, chain), "the reordered form gave the chain kernel's bits"
    if step > 1:  # the steps' sums are not the token walk's
        walk = _run_op(ops, build_dir, "gated_delta_net", [s, hk, hv, n, columns, 1, form, lanes, 1], arrays)
        assert not np.array_equal(got, walk), f"{step} tokens a step gave the one-token walk's bits"
    what = f"form {form}, S {s}, {n} tokens, {lanes} lanes, {step} a step"
    _close(got[:out], chain[:out], 1e-5, f"outputs, {what}")
    _close(got[out:], chain[out:], 1e-5, f"state, {what}")
    a = arrays
    want_out, want_state = _core.op_gated_delta_net(a["q"], a["k"], a["v"], a["g"], a["beta"], a["state"])
    _close(got[:out].reshape(n, hv, s), want_out, 2e-5, f"outputs against the CPU op, {what}")
    _close(got[out:].reshape(hv, s, s), want_state, 2e-5, f"state against the CPU op, {what}")


# (form, S, nodes, chance of a chain link, seed, columns, lanes, step): form 1 the chunked form (up to 64
# nodes), 2 the one-round kernel (columns a lane, 0: by the form; lanes a column, 0: the default; 40
# and 120 nodes: several staged chunks; step: nodes a step of the one-round kernel, runs of
# parent-child links)
REORDERED_TREES = [
    (1, 64, 5, 0.5, 0, 0, 0, 1),
    (1, 128, 33, 0.6, 1, 0, 0, 1),
    (1, 128, 64, 0.3, 2, 0, 0, 1),
    (2, 64, 5, 0.5, 0, 0, 0, 1),
    (2, 128, 40, 0.6, 1, 2, 0, 1),
    (2, 128, 120, 0.3, 2, 4, 0, 1),
    (2, 64, 21, 0.5, 3, 1, 16, 1),
    (2, 128, 40, 0.6, 1, 2, 16, 1),
    (2, 128, 40, 0.6, 1, 1, 0, 2),
    (2, 128, 120, 0.8, 2, 2, 0, 4),
    (2, 64, 33, 0.9, 3, 1, 0, 4),
]


@pytest.mark.parametrize(("form", "s", "n", "chain", "seed", "columns", "lanes", "step"), REORDERED_TREES)
def test_emulated_reordered_tree_delta_rule_equals_the_walk(
    ops: Path,
    build_dir: Path,
    form: int,
    s: int,
    n: int,
    chain: float,
    seed: int,
    columns: int,
    lanes: int,
    step: int,
) -> None:
    """A marked tree node's reordered sums (the chunked form over a tree's ancestors; the one-round
    kernel in preorder, states saved on a per-depth stack where a node's child is not next), a
    second root included, against the tree kernel's walk on the same inputs: within 1e-5 of the
    outputs' scale."""
    rng = np.random.default_rng(seed + 100 * form + 100)
    hk, hv = 2, 4
    parents = _random_parents(rng, n, chain)
    if n > 2:
        parents[int(rng.integers(1, n))] = -1
    tree = _tree_index(parents)
    arrays = {**_gdn_arrays(rng, n, s, hk, hv), "tree": tree}
    arrays["k"] = (arrays["k"] / np.linalg.norm(arrays["k"], axis=-1, keepdims=True)).astype(np.float32)
    base = [s, hk, hv, n, int(tree[2].max())]
    walk = _run_op(ops, build_dir, "tree_gated_delta_net", [*base, 0, 1, 0], arrays)
    got = _run_op(ops, build_dir, "tree_gated_delta_net", [*base, columns, 1, form, lanes, step], arrays)
    assert not np.array_equal(walk, got), "the marked node took the walk"
    if step > 1:  # runs of parent-child links went a step at a time
        one = _run_op(ops, build_dir, "tree_gated_delta_net", [*base, columns, 1, form, lanes, 1], arrays)
        assert not np.array_equal(got, one), f"{step} nodes a step gave one node a step's bits"
    _close(got, walk, 1e-5, f"reordered form {form}, tree, S {s}, {n} nodes, {lanes} lanes, {step} a step")


@pytest.mark.parametrize("s", [32, 128])
def test_emulated_tree_delta_rule_columns_agree(ops: Path, build_dir: Path, s: int) -> None:
    """1, 2 and 4 state columns a warp: the same bits on a branchy tree (states saved only at
    branch points)."""
    rng = np.random.default_rng(s + 7)
    n, hk, hv = 30, 1, 2
    tree = _tree_index(_random_parents(rng, n, chain=0.4))
    arrays = {**_gdn_arrays(rng, n, s, hk, hv), "tree": tree}
    runs = [
        _run_op(ops, build_dir, "tree_gated_delta_net", [s, hk, hv, n, int(tree[2].max()), c], arrays)
        for c in (1, 2, 4)
    ]
    assert np.array_equal(runs[0], runs[1]) and np.array_equal(runs[0], runs[2])


@pytest.mark.parametrize(("s", "chain", "seed"), [(16, 0.3, 0), (32, 0.0, 1), (64, 0.5, 2), (128, 0.8, 3)])
def test_emulated_tree_delta_rule_paths_equal_the_walk(
    ops: Path, build_dir: Path, s: int, chain: float, seed: int
) -> None:
    """The tree kernel's two forms (a warp every node in preorder; a warp a preorder segment,
    replaying its ancestors) give the same bits for 1, 2 and 4 columns a warp, forests and a bare
    chain included, and the CPU op's values."""
    rng = np.random.default_rng(seed + 100)
    n, hk, hv = 33, 1, 2
    parents = _random_parents(rng, n, chain)
    parents[int(rng.integers(1, n))] = -1  # a second root: its subtree starts from the cached state too
    for tree_parents in (parents, [-1, *range(n - 1)]):
        tree = _tree_index(tree_parents)
        arrays = {**_gdn_arrays(rng, n, s, hk, hv), "tree": tree}
        base = [s, hk, hv, n, int(tree[2].max())]
        walk = _run_op(ops, build_dir, "tree_gated_delta_net", [*base, 1, 1], arrays)
        for c in (1, 2, 4):
            paths = _run_op(ops, build_dir, "tree_gated_delta_net", [*base, c, 2], arrays)
            assert np.array_equal(walk, paths), f"S {s}, {c} columns: the paths differ from the walk"
        q, k, v, g, beta, state = (arrays[x] for x in ("q", "k", "v", "g", "beta", "state"))
        want = _core.op_tree_gated_delta_net(q, k, v, g, beta, state, tree_parents)
        _close(walk.reshape(n, hv, s), want, 2e-5, f"tree delta rule, S {s}")


@pytest.mark.parametrize(("s", "hk", "hv"), [(32, 2, 4), (64, 1, 3), (128, 2, 6), (256, 1, 2)])
def test_emulated_fused_gdn_inputs_equal_the_cpu_op(
    ops: Path, build_dir: Path, s: int, hk: int, hv: int
) -> None:
    from test_gdn_decode_inputs import EPS, _inputs

    i = _inputs(s, hk, hv, 4, seed=s + hk)
    c = s * (2 * hk + hv)
    params = np.array([EPS / s, 1.0 / np.sqrt(np.float32(s))], np.float32)
    out = _run_op(ops, build_dir, "gdn_decode_inputs", [c, hv, 4, s, hk], {**i, "params": params})
    want, want_state = _core.op_gdn_decode_inputs(**i, S=s, Hk=hk, eps=EPS)
    _close(out[: c + 2 * hv], want, 1e-5, f"fused GDN inputs, S {s}")
    np.testing.assert_array_equal(out[c + 2 * hv :].reshape(c, 3), want_state)


@pytest.mark.parametrize(
    ("s", "hk", "hv", "n", "tree"), [(32, 2, 4, 5, False), (128, 2, 6, 33, False), (64, 1, 3, 17, True)]
)
def test_emulated_verify_inputs_take_tokens_a_block_alike(
    ops: Path, build_dir: Path, s: int, hk: int, hv: int, n: int, tree: bool
) -> None:
    """The CUDA kernel of gdn_verify_inputs (a chain) and gdn_tree_inputs (a tree's nodes) with 4, 8
    or 16 tokens a block (DFLASH_GDN_INPUTS_TOKENS: a head's weights, and a chain's conv window,
    read once for them; 5 and 17 tokens: a last block short) gives the one-token-a-block kernel's
    bits, and the CPU op's values within 1e-5 of their scale (the conv state after a chain
    exactly)."""
    from test_gdn_decode_inputs import EPS, _verify_inputs

    k, c = 4, s * (2 * hk + hv)
    i = _verify_inputs(s, hk, hv, k, n, seed=s + n)
    arrays = {**i, "params": np.array([EPS / s, 1.0 / np.sqrt(np.float32(s))], np.float32)}
    parents = _random_parents(np.random.default_rng(n), n, 0.6) if tree else None
    if parents is not None:
        arrays["tree"] = _tree_index(parents)
    runs = {
        t: _run_op(ops, build_dir, "gdn_verify_inputs", [c, hv, k, s, hk, n, t, int(tree)], arrays)
        for t in (1, 4, 8, 16)
    }
    for t in (4, 8, 16):
        assert np.array_equal(runs[t], runs[1]), f"{t} tokens a block"
    order = ("qkv", "alpha", "beta", "conv_state", "w", "dt_bias", "a")
    tree_arg = {"parents": parents} if parents is not None else {}
    want = _core.op_gdn_verify_inputs(*(i[x] for x in order), s, hk, EPS, **tree_arg, gpu=False)
    got, what = runs[1], f"GDN inputs of {n} tokens, S {s}, tree {tree}"
    _close(got[: n * c].reshape(n, c), want[0], 1e-5, what)
    _close(got[n * c : n * c + n * hv].reshape(n, hv), want[1], 1e-5, f"gates, {what}")
    _close(got[n * c + n * hv : n * (c + 2 * hv)].reshape(n, hv), want[2], 1e-5, f"betas, {what}")
    if not tree:
        np.testing.assert_array_equal(got[n * (c + 2 * hv) :].reshape(c, k - 1), want[3])


@pytest.mark.parametrize(("ncols", "k"), [(2048, 1), (5000, 8), (4096, 13), (2500, 32)])
def test_emulated_top_k_rows_picks_the_largest(ops: Path, build_dir: Path, ncols: int, k: int) -> None:
    rng = np.random.default_rng(ncols + k)
    x = rng.standard_normal((3, ncols)).astype(np.float32)
    x[1, ::7] = x[1, 0]  # ties: the lower index first
    got = _run_op(ops, build_dir, "top_k_rows", [ncols, 3, k], {"x": x}, np.int32).reshape(3, k)
    for r in range(3):
        want = np.lexsort((np.arange(ncols), -x[r]))[:k]  # value descending, then index
        np.testing.assert_array_equal(got[r], want)
    np.testing.assert_array_equal(np.sort(got, axis=1), np.sort(_core.op_top_k(x, k, tagged=True), axis=1))


@pytest.mark.parametrize(("d", "h", "hkv"), [(64, 4, 1), (128, 4, 2), (256, 2, 1)])
def test_emulated_path_attention_equals_the_cpu_op_and_is_batch_invariant(
    ops: Path, build_dir: Path, d: int, h: int, hkv: int
) -> None:
    """The CUDA kernel of ggml_ext::attn_paths on the emulator: the CPU op's outputs (1e-5 of the
    scale), and each query's bits the same when it runs alone (the batch-invariant mode's premise)."""
    rng = np.random.default_rng(d + h)
    start, parents = 45, [-1, 0, 0, 1, 3, 2]  # a prefix over two tiles, then a tree
    n, rows = len(parents), start + len(parents) + 3
    q = rng.standard_normal((n, h, d)).astype(np.float32)
    k = rng.standard_normal((rows, hkv, d)).astype(np.float32)
    v = rng.standard_normal((rows, hkv, d)).astype(np.float32)
    paths = np.zeros((n, n + 2), np.int32)
    for i in range(n):
        path, a = [], i
        while a >= 0:
            path.append(start + a)
            a = parents[a]
        paths[i, : len(path) + 2] = [start, len(path), *path[::-1]]
    scale = np.float32(1.0 / np.sqrt(d))
    params = np.array([scale], np.float32)

    def run(qs: np.ndarray, ps: np.ndarray) -> np.ndarray:
        meta = [d, h, hkv, rows, len(qs), n + 2]
        arrays = {"q": qs, "k": k, "v": v, "paths": ps, "params": params}
        return _run_op(ops, build_dir, "attn_paths", meta, arrays).reshape(len(qs), h, d)

    got = run(q, paths)
    _close(got, _core.op_attn_paths(q, k, v, paths, "f32", float(scale)), 1e-5, f"path attention, D {d}")
    for i in (0, n - 1):
        np.testing.assert_array_equal(run(q[i : i + 1], paths[i : i + 1])[0], got[i])


# ---- the tensor-core GEMM through its entry points (emu/gemm_entry_emu.cpp) -----------------------

GEMM_TYPES = {"q4_K": 12, "q5_K": 13, "q6_K": 14}  # ggml_type ids


def _q8_per_256(a: np.ndarray) -> np.ndarray:
    """The GEMM's activations as its quantizer makes them: per 256 values of a column d = max |a|
    / 127 and round(a / d) (quantize_act_k_kernel), back in float64."""
    blocks = a.reshape(a.shape[0], -1, 256).astype(np.float32)
    d = np.abs(blocks).max(axis=2, keepdims=True) / np.float32(127)
    q = np.where(d > 0, np.round(blocks / np.where(d > 0, d, 1)), 0)
    return (q * d).astype(np.float64).reshape(a.shape)


@pytest.fixture(scope="module")
def gemm_entry(build_dir: Path) -> Path:
    """The GEMM's host code (gemm_kquant_mma.cu: its checks, form choice, quantizer and launches)
    on the emulator, under AddressSanitizer (the emulator's device allocations are exact-sized)."""
    inc = _ggml_include(build_dir)
    cxx = shutil.which("g++") or shutil.which("c++")
    assert cxx, "no C++ compiler: the package build needs one too"
    out = build_dir / "gemm_entry_emu"
    cmd = [
        cxx,
        *FLAGS,
        *ASAN,
        str(EMU / "gemm_entry_emu.cpp"),
        str(EMU / "cuda_emu.cpp"),
        *INCLUDES,
        f"-I{inc}",
    ]
    r = subprocess.run([*cmd, "-o", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return out


def _run_gemm_entry(
    binary: Path,
    tmp: Path,
    mode: str,
    meta: list[int],
    arrays: dict[str, bytes],
    env: dict[str, str] | None = None,
) -> np.ndarray | None:
    """The entry point's outputs, or None where it refused the product (exit 3); env: switches
    (DFLASH_*) for its run."""
    tag = "-".join(f"{k}={v}" for k, v in sorted((env or {}).items()))
    tmp = tmp / f"{mode}-{'-'.join(map(str, meta))}{tag}"
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "meta.txt").write_text(" ".join(map(str, meta)))
    for name, data in arrays.items():
        (tmp / f"{name}.bin").write_bytes(data)
    r = subprocess.run(
        [str(binary), mode, str(tmp)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**ASAN_ENV, **(env or {})},
    )
    if r.returncode == 3:
        return None
    assert r.returncode == 0, r.stderr[-3000:]
    return np.frombuffer((tmp / "out.bin").read_bytes(), np.float32)


def _gemm_entry_launches(tmp: Path, mode: str, meta: list[int], env: dict[str, str]) -> dict[str, int]:
    """The counts the entry point's last run in _run_gemm_entry's folder wrote (launches.txt)."""
    tag = "-".join(f"{k}={v}" for k, v in sorted(env.items()))
    text = (tmp / f"{mode}-{'-'.join(map(str, meta))}{tag}" / "launches.txt").read_text()
    return {name: int(v) for name, v in (line.split() for line in text.splitlines())}


@pytest.mark.parametrize("types", [("q4_K", "q6_K"), ("q6_K", "q4_K"), ("q4_K", "q4_K"), ("q5_K", "q6_K")])
@pytest.mark.parametrize("n", [2, 23, 64])
def test_emulated_gemm_pair_equals_each_product_alone(
    gemm_entry: Path, build_dir: Path, types: tuple[str, str], n: int
) -> None:
    """Two products of one normed source through one quantizer launch (both types' layouts;
    ggml_ext_cuda_gemm_mma_pair_from, rms_norm_fusion.cu's pairs) give each product's bits alone
    (ggml_ext_cuda_gemm_mma_from), and the dequantized weights' products with the quantizer's
    8-bit activations (1e-5)."""
    from test_mul_mat_invariant import _weights

    rows1, rows2, k = 40, 24, 512
    w1, dense1 = _weights(types[0], rows1, k, seed=81)
    w2, dense2 = _weights(types[1], rows2, k, seed=82)
    rng = np.random.default_rng(83)
    x = (rng.standard_normal((n, k)) * np.exp2(rng.uniform(-3, 3, (n, k)))).astype(np.float32)
    norm = (1.0 + 0.25 * rng.standard_normal(k)).astype(np.float32)
    meta = [GEMM_TYPES[types[0]], GEMM_TYPES[types[1]], rows1, rows2, k, n]
    arrays = {"w1": w1, "w2": w2, "x": x.tobytes(), "norm": norm.tobytes()}
    out = _run_gemm_entry(gemm_entry, build_dir, "pair", meta, arrays)
    assert out is not None, "the pair was refused"
    a1, b1 = n * rows1, n * (rows1 + rows2)
    pair1, pair2, alone1, alone2 = out[:a1], out[a1:b1], out[b1 : b1 + a1], out[b1 + a1 :]
    np.testing.assert_array_equal(pair1, alone1)
    np.testing.assert_array_equal(pair2, alone2)
    x64 = x.astype(np.float64)
    normed = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + 1e-6) * norm
    for got, dense in ((pair1, dense1), (pair2, dense2)):
        want = _q8_per_256(normed) @ dense.T.astype(np.float64)
        assert np.abs(got.reshape(n, -1) - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize(
    ("rows", "k", "n", "tma"),
    [
        (40, 512, 2, {"DFLASH_MMA_TMA": "1"}),
        (40, 512, 16, {"DFLASH_MMA_TMA": "1"}),
        (40, 5632, 16, {"DFLASH_MMA_TMA": "1", "DFLASH_MMA_TMA_STAGES": "3"}),
        (40, 6144, 16, {"DFLASH_MMA_TMA": "1"}),
        (12800, 256, 9, {"DFLASH_MMA_TMA": "1"}),
        (40, 512, 23, {"DFLASH_MMA_TMA": "1"}),
        (40, 512, 23, {}),
    ],
    ids=[
        "one-tile",
        "16-columns",
        "3-stages",
        "long-rows-8-warps",
        "two-row-tiles",
        "24-columns-not-with-1",
        "24-columns-with-2",
    ],
)
def test_emulated_gemm_tma_staging_gives_the_same_bits(
    gemm_entry: Path, build_dir: Path, rows: int, k: int, n: int, tma: dict[str, str]
) -> None:
    """Q4_K's mma.sync kernels fill each warp's stages with one 2D bulk tensor copy a super-block
    (tma_copy.cuh, the kernel's kTma) instead of the lanes' cp.asyncs: up to 32 columns by default,
    16 with DFLASH_MMA_TMA=1, never with =0. Through the GEMM's entry point (a pair from one
    quantizer, then each alone) the outputs are the same bits as with =0, for 40 rows (a last tile
    of 8: the box's rows past the matrix land as zeros), the 8-warp blocks of long rows, two row
    tiles a warp (where one tile a warp would leave the last wave mostly empty), one column tile and
    3 stages a warp (DFLASH_MMA_TMA_STAGES=3, 22 super-blocks a row); every product took it up to 16
    columns, and at 23 by default only."""
    from test_mul_mat_invariant import _weights

    rows2 = 24
    w1, _ = _weights("q4_K", rows, k, seed=91)
    w2, _ = _weights("q4_K", rows2, k, seed=92)
    rng = np.random.default_rng(93)
    x = (rng.standard_normal((n, k)) * np.exp2(rng.uniform(-3, 3, (n, k)))).astype(np.float32)
    norm = (1.0 + 0.25 * rng.standard_normal(k)).astype(np.float32)
    meta = [GEMM_TYPES["q4_K"], GEMM_TYPES["q4_K"], rows, rows2, k, n]
    arrays = {"w1": w1, "w2": w2, "x": x.tobytes(), "norm": norm.tobytes()}
    off = {"DFLASH_MMA_TMA": "0"}
    want = _run_gemm_entry(gemm_entry, build_dir, "pair", meta, arrays, env=off)
    got = _run_gemm_entry(gemm_entry, build_dir, "pair", meta, arrays, env=tma)
    assert want is not None and got is not None, "the pair was refused"
    assert np.isfinite(want).all()
    np.testing.assert_array_equal(got, want)
    assert _gemm_entry_launches(build_dir, "pair", meta, off)["tma"] == 0
    took = n <= (16 if tma.get("DFLASH_MMA_TMA") == "1" else 32)
    assert _gemm_entry_launches(build_dir, "pair", meta, tma)["tma"] == (4 if took else 0)


@pytest.mark.parametrize("wtype", ["q4_K", "q6_K"])
@pytest.mark.parametrize("S", [64, 128])
@pytest.mark.parametrize("n", [2, 33, 100])
def test_emulated_gemm_of_a_head_norm_source(
    gemm_entry: Path, build_dir: Path, wtype: str, S: int, n: int
) -> None:
    """w @ (silu(z) * (rms_norm(o per head) * norm)) with the quantizer computing the heads' norms
    (ActSource::head_w, rms_norm_fusion.cu's head norms) through the GEMM's entry point, 100 columns
    in launches of 64 (each launch's columns of both z and o), against numpy with the quantizer's
    8-bit activations (1e-5)."""
    from test_mul_mat_invariant import _weights

    rows, k = 40, 512
    w, dense = _weights(wtype, rows, k, seed=84)
    rng = np.random.default_rng(85)
    o = (rng.standard_normal((n, k)) * np.exp2(rng.uniform(-3, 3, (n, k)))).astype(np.float32)
    z = rng.standard_normal((n, k)).astype(np.float32)
    norm = (1.0 + 0.25 * rng.standard_normal(S)).astype(np.float32)
    arrays = {"w": w, "o": o.tobytes(), "z": z.tobytes(), "norm": norm.tobytes()}
    out = _run_gemm_entry(gemm_entry, build_dir, "head", [GEMM_TYPES[wtype], rows, S, n], arrays)
    assert out is not None, "the head-norm source was refused"
    heads = o.astype(np.float64).reshape(n, k // S, S)
    normed = (heads / np.sqrt((heads**2).mean(axis=2, keepdims=True) + 1e-6) * norm).reshape(n, k)
    z64 = z.astype(np.float64)
    want = _q8_per_256(z64 / (1.0 + np.exp(-z64)) * normed) @ dense.T.astype(np.float64)
    assert np.abs(out.reshape(n, rows) - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.parametrize("wtype", ["q4_K", "q6_K"])
@pytest.mark.parametrize("n", [2, 33, 100])
def test_emulated_gemm_of_a_gate_source(gemm_entry: Path, build_dir: Path, wtype: str, n: int) -> None:
    """w @ (sigmoid(gate) * o) with the quantizer reading the gate in place among the [q; gate]
    heads of a product's rows (ActSource::gate, glu_fusion.cu's sigmoid gates) through the GEMM's
    entry point, 100 columns in launches of 64 (each launch's columns of both o and the gate),
    against numpy with the quantizer's 8-bit activations (1e-5)."""
    from test_mul_mat_invariant import _weights

    rows, hd, k = 40, 128, 512
    width = 2 * k + 64  # [q, gate] heads, then other rows of the product
    w, dense = _weights(wtype, rows, k, seed=87)
    rng = np.random.default_rng(88)
    o = rng.standard_normal((n, k)).astype(np.float32)
    qg = (2 * rng.standard_normal((n, width))).astype(np.float32)
    arrays = {"w": w, "o": o.tobytes(), "rows": qg.tobytes()}
    out = _run_gemm_entry(gemm_entry, build_dir, "gate", [GEMM_TYPES[wtype], rows, hd, n], arrays)
    assert out is not None, "the gate source was refused"
    gate = qg[:, : 2 * k].reshape(n, k // hd, 2, hd)[:, :, 1, :].reshape(n, k).astype(np.float64)
    want = _q8_per_256(o.astype(np.float64) / (1.0 + np.exp(-gate))) @ dense.T.astype(np.float64)
    assert np.abs(out.reshape(n, rows) - want).max() <= 1e-5 * np.abs(want).max()


def test_emulated_gemm_refuses_heads_it_cannot_sum(gemm_entry: Path, build_dir: Path) -> None:
    """Heads of 48 values (not 32, 64, 128 or 256): the GEMM refuses the source (nothing runs)."""
    from test_mul_mat_invariant import _weights

    rows, k, n = 16, 768, 4
    w, _ = _weights("q4_K", rows, k, seed=86)
    ones = np.ones((n, k), np.float32).tobytes()
    arrays = {"w": w, "o": ones, "z": ones, "norm": np.ones(48, np.float32).tobytes()}
    assert _run_gemm_entry(gemm_entry, build_dir, "head", [GEMM_TYPES["q4_K"], rows, 48, n], arrays) is None
