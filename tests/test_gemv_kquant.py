"""ggml_ext's small-batch GEMV for Q4_K / Q6_K (and, switched on, Q5_K / Q8_0) weights and 1..8
columns (kernels/gemv_kquant.cu, patches/0005): on CUDA it takes ggml's mul_mat_vec_q calls, fused
forms included. Its logic also runs on the CPU emulator in CI (tests/test_cuda_emu.py). Oracles: ggml's
own kernel (the GEMV switched off, same 8-bit activations: float summation order only, 1e-4 of
the largest output) and the dequantized weights in numpy (8-bit activation error, 2e-2). Its
per-column arithmetic must not depend on the column count (bit-equal columns)."""

from __future__ import annotations

import functools
import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from test_mul_mat_invariant import _weights

from dflash import _core
from dflash.synth.quant import random_blocks

T = TypeVar("T")

GPU = _core.gpu_backend_available()
REQUIRE_GPU = os.environ.get("DFLASH_REQUIRE_CUDA") == "1"
needs_gpu = pytest.mark.skipif(
    not GPU and not REQUIRE_GPU, reason="no GPU backend in this build (run on the GPU machine)"
)
TYPES = ("q4_K", "q6_K", "q5_K", "q8_0")


def _restoring(get: Callable[[], Any], put: Callable[[Any], None]) -> Iterator[None]:
    """A switch's value put back after the test (the body of the one-switch fixtures below)."""
    was = get()
    yield
    put(was)


@pytest.fixture
def gemv_restored() -> Iterator[None]:
    """The GEMV with Q8_0 switched on too (off by default: slower than ggml's on the H200), and
    the tensor-core GEMM off (it takes the engine's products of 3 or more columns)."""
    was, was_q80, was_mma = _core.gemv_enabled(), _core.q80_enabled(), _core.mma_enabled()
    _core.set_q80_enabled(True)
    _core.set_mma_enabled(False)
    yield
    _core.set_gemv_enabled(was)
    _core.set_q80_enabled(was_q80)
    _core.set_mma_enabled(was_mma)


def test_q80_gemv_is_off_unless_asked() -> None:
    assert _core.q80_enabled() == (GPU and os.environ.get("DFLASH_Q80") == "1")


def _ggml_and_ours(fn):  # type: ignore[no-untyped-def]
    _core.set_gemv_enabled(False)
    ref = fn()
    _core.set_gemv_enabled(True)
    return ref, fn()


def _order_close(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    scale = max(1.0, float(np.abs(ref).max()))
    assert np.abs(got - ref).max() <= 1e-4 * scale, what


def test_switch_is_harmless_on_the_cpu(gemv_restored: None) -> None:
    w, dense = _weights("q4_K", 64, 512)
    x = np.random.default_rng(1).standard_normal((3, 512)).astype(np.float32)
    ref, got = _ggml_and_ours(lambda: _core.op_mul_mat(w, "q4_K", 64, x, tiles=True))
    np.testing.assert_array_equal(got, ref)
    assert _core.gemv_enabled() == GPU  # the switch only exists with CUDA


@needs_gpu
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize(("rows", "k"), [(300, 1024), (1000, 2048), (9000, 512)])
def test_cuda_gemv_equals_ggml_and_numpy(name: str, rows: int, k: int, gemv_restored: None) -> None:
    """300 and 1000 rows take one row per warp, 9000 two (tail rows included)."""
    w, dense = _weights(name, rows, k, seed=7)
    rng = np.random.default_rng(8)
    for n in (1, 2, 3, 8):
        x = rng.standard_normal((n, k)).astype(np.float32)
        ref, got = _ggml_and_ours(lambda x=x: _core.op_mul_mat(w, name, rows, x, tiles=True, gpu=True))
        _order_close(got, ref, f"{name} {rows}x{k}, {n} columns")
        want = x.astype(np.float64) @ dense.T.astype(np.float64)
        assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()


@needs_gpu
@pytest.mark.parametrize("name", TYPES)
def test_cuda_gemv_columns_do_not_depend_on_the_count(name: str, gemv_restored: None) -> None:
    rows, k = 700, 1536
    w, _ = _weights(name, rows, k, seed=9)
    x = np.random.default_rng(10).standard_normal((8, k)).astype(np.float32)
    _core.set_gemv_enabled(True)
    many = _core.op_mul_mat(w, name, rows, x, tiles=True, gpu=True)
    for j in (0, 3, 7):
        one = _core.op_mul_mat(w, name, rows, x[j : j + 1], tiles=True, gpu=True)[0]
        np.testing.assert_array_equal(many[j], one, err_msg=f"{name}: column {j} of 8")


@needs_gpu
@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("n", [1, 4])
def test_cuda_gemv_fused_forms(name: str, n: int, gemv_restored: None) -> None:
    """swiglu(gate x, up x) and w x + residual: one column is ggml-cuda's fused mul_mat_vec_q
    call, which the GEMV takes with its gate and bias; four columns go unfused."""
    rows, k = 1000, 1024
    up, dense_up = _weights(name, rows, k, seed=11)
    gate, dense_gate = _weights(name, rows, k, seed=12)
    rng = np.random.default_rng(13)
    x = rng.standard_normal((n, k)).astype(np.float32)
    res = rng.standard_normal((n, rows)).astype(np.float32)

    def ffn() -> np.ndarray:
        return _core.op_mul_mat_fused(up, name, rows, x, gate=gate, gpu=True)

    def residual() -> np.ndarray:
        return _core.op_mul_mat_fused(up, name, rows, x, residual=res, gpu=True)

    ref, got = _ggml_and_ours(ffn)
    _order_close(got, ref, f"{name} swiglu, {n} columns")
    xd = x.astype(np.float64)
    g, u = xd @ dense_gate.T.astype(np.float64), xd @ dense_up.T.astype(np.float64)
    want = g / (1.0 + np.exp(-g)) * u
    assert np.abs(got - want).max() <= 3e-2 * np.abs(want).max()
    ref, got = _ggml_and_ours(residual)
    _order_close(got, ref, f"{name} residual, {n} columns")
    want = u + res
    assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max()


@pytest.fixture
def mma_restored() -> Iterator[None]:
    """The tensor-core GEMM's switches as they were: the GEMM itself and its fused residual add."""
    was, was_fuse = _core.mma_enabled(), _core.fuse_add_enabled()
    was_q80, was_cols = _core.mma_q80_enabled(), _core.mma_max_columns()
    yield
    _core.set_mma_enabled(was)
    _core.set_fuse_add_enabled(was_fuse)
    _core.set_mma_q80_enabled(was_q80)
    if was_cols:
        _core.set_mma_max_columns(was_cols)


@pytest.mark.parametrize(
    ("enabled", "env"),
    [
        ("mma_enabled", "DFLASH_MMA"),
        ("fuse_add_enabled", "DFLASH_FUSE_ADD"),
        ("mma_q80_enabled", "DFLASH_MMA_Q80"),
    ],
)
def test_gemm_switches_are_on_with_cuda_by_default(enabled: str, env: str) -> None:
    """ggml_ext's tensor-core GEMM takes the engine's products of 2..256 columns on CUDA unless
    DFLASH_MMA=0 (Q8_0 weights too unless DFLASH_MMA_Q80=0), and adds a following residual as it
    writes unless DFLASH_FUSE_ADD=0; there is nothing to switch on the CPU."""
    assert getattr(_core, enabled)() == (GPU and os.environ.get(env) != "0")
    if enabled == "mma_enabled" and "DFLASH_MMA_MAX_COLUMNS" not in os.environ:
        assert _core.mma_max_columns() == (256 if GPU else 0)


@needs_gpu
@pytest.mark.parametrize("wtype", TYPES)
@pytest.mark.parametrize("n", [2, 3, 8, 9, 13, 16, 17, 24, 32, 33, 48, 64, 65, 100, 129, 256])
@pytest.mark.parametrize("rows", [1000, 8465])
def test_cuda_mma_gemm_equals_ggml_and_numpy(
    wtype: str, n: int, rows: int, mma_restored: None, gemv_restored: None
) -> None:
    """Q4_K / Q6_K / Q5_K / Q8_0 x 2..256 columns (what the engine sends it: every column tile, and
    launches of 64 columns above 64) through ggml_ext's tensor-core GEMM (K-quants: activations
    quantized per 256, the CPU backend's rule, where ggml's mmq quantizes per 32: 8-bit error
    apart, 3e-2; Q8_0: per 32, like mmq, 2e-3).
    k = 2304: nine super-blocks, so Q6_K rows alternate between 4- and 2-byte alignment. 8465 rows:
    Q4_K / Q5_K at 17..32 columns take two row tiles a warp on GPUs of up to 132 multiprocessors
    (the H200; 8465 >= 2 * 32 * 132), the last 32-row tile 17 rows short."""
    k = 2304
    w, dense = _weights(wtype, rows, k, seed=14)
    x = np.random.default_rng(15).standard_normal((n, k)).astype(np.float32)
    _core.set_mma_enabled(False)
    ref = _core.op_mul_mat(w, wtype, rows, x, tiles=True, gpu=True)
    _core.set_mma_enabled(True)
    got = _core.op_mul_mat(w, wtype, rows, x, tiles=True, gpu=True)
    want = x.astype(np.float64) @ dense.T.astype(np.float64)
    scale = float(np.abs(want).max())
    bound = 2e-3 if wtype == "q8_0" else 3e-2
    assert np.abs(got - want).max() <= 3e-2 * scale
    assert np.abs(got - ref).max() <= bound * scale


def test_wgmma_gemm_is_on_where_it_is_built() -> None:
    """The wgmma GEMM is on by default in an sm_90a CUDA build (DFLASH_WGMMA=0 starts it off) and
    absent elsewhere (no CUDA, or an sm_90 build): then switching it on changes nothing. Its tail
    split and its early-staging kernel are on by default in CUDA builds (session 30's H200 runs;
    DFLASH_WGMMA_SPLIT=0, DFLASH_WGMMA_EARLY=0 turn them off), its pipelined kernel off
    (DFLASH_WGMMA_PIPE=1 or 2 start it)."""
    assert _core.wgmma_enabled() == (_core.wgmma_built() and os.environ.get("DFLASH_WGMMA") != "0")
    assert _core.wgmma_split_enabled() == (GPU and os.environ.get("DFLASH_WGMMA_SPLIT") != "0")
    pipe = os.environ.get("DFLASH_WGMMA_PIPE", "0")
    assert _core.wgmma_pipe() == (int(pipe) if GPU and pipe in ("1", "2") else 0)
    assert _core.wgmma_early_enabled() == (GPU and os.environ.get("DFLASH_WGMMA_EARLY") != "0")
    if not _core.wgmma_built():
        _core.set_wgmma_enabled(True)
        assert not _core.wgmma_enabled()


def _gpu_is_sm90() -> bool:
    """Whether the first GPU is compute capability 9.0 (nvidia-smi's word)."""
    r = subprocess.run(
        ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True, text=True
    )
    return r.returncode == 0 and r.stdout.split()[:1] == ["9.0"]


@contextmanager
def _switched(get: Callable[[], int], set_: Callable[[int], None], value: int) -> Iterator[None]:
    """A _core switch set to `value` for the block, then back to what it was."""
    was = get()
    set_(value)
    try:
        yield
    finally:
        set_(was)


def _q4k_product(rows: int, k: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, Callable[[], Any]]:
    """Random Q4_K weights rows x k (their dense values), n random columns (generator seed + 1) and
    their product on the GPU as the switches stand when it is called."""
    w, dense = _weights("q4_K", rows, k, seed=seed)
    x = np.random.default_rng(seed + 1).standard_normal((n, k)).astype(np.float32)
    return dense, x, lambda: _core.op_mul_mat(w, "q4_K", rows, x, tiles=True, gpu=True)


def _a_b(
    switch: tuple[Callable[[], int], Callable[[int], None]],
    values: tuple[int, int],
    run: Callable[[], T],
    launches: Callable[[], int] | None = None,
) -> tuple[T, T, int]:
    """run() with the switch at values[0], then at values[1], and how far launches() counted in
    the second run (0 without a counter)."""
    with _switched(*switch, values[0]):
        a = run()
    with _switched(*switch, values[1]):
        before = launches() if launches else 0
        b = run()
        counted = launches() - before if launches else 0
    return a, b, counted


@needs_gpu
@pytest.mark.parametrize("n", [24, 25, 32, 33, 48, 64, 100])
@pytest.mark.parametrize("rows", [16500, 34816])
@pytest.mark.usefixtures("f16_wgmma_off")
def test_cuda_wgmma_gemm_matches_the_mma_gemm(n: int, rows: int, mma_restored: None) -> None:
    """Q4_K on the tall matrices through Hopper's wgmma form (an sm_90a build on an sm_90 GPU;
    16500 rows: a last 64-row block 52 rows short) where its shapes take it (25+ columns below
    32768 rows, 33+ above; 100: a launch of 64 and one of 36), against the mma.sync GEMM: the same
    integer sums, so within float rounding (1e-5 of the scale), and numpy within 3e-2. Elsewhere
    (another GPU, an sm_90 build) the switch is off and nothing launches."""
    k = 2304
    w, dense = _weights("q4_K", rows, k, seed=18)
    x = np.random.default_rng(19).standard_normal((n, k)).astype(np.float32)
    ref, got, launches = _a_b(
        (_core.wgmma_enabled, _core.set_wgmma_enabled),
        (False, True),
        lambda: _core.op_mul_mat(w, "q4_K", rows, x, tiles=True, gpu=True),
        _core.wgmma_launches,
    )
    tall_least = _core.wgmma_tall_from() - 1 if _core.wgmma_pipe() != 2 else 24
    least = tall_least if rows >= 32768 else 24  # the columns it starts above
    takes = [c for c in (min(n, 64), n - 64) if c > least]
    assert launches == (len(takes) if _core.wgmma_built() and _gpu_is_sm90() else 0)
    scale = float(np.abs(x.astype(np.float64) @ dense.T.astype(np.float64)).max())
    assert np.abs(got - ref).max() <= 1e-5 * scale
    assert np.abs(got - x.astype(np.float64) @ dense.T.astype(np.float64)).max() <= 3e-2 * scale


@needs_gpu
@pytest.mark.parametrize("n", [48, 64])
@pytest.mark.usefixtures("f16_wgmma_off")
def test_cuda_wgmma_tail_split_matches_whole_tiles(n: int, mma_restored: None) -> None:
    """[gate; up]'s 34816 rows: 544 row tiles over 2 blocks a multiprocessor leave a last wave of a
    few tiles on Hopper's 114 or 132 multiprocessors, which the tail split runs as pieces of
    consecutive super-blocks (k = 5120: 20 of them), added in piece order by the last piece. Against
    the same kernel without the split: within float rounding (1e-5 of the scale); the launch counted.
    Run twice, so the tile counters are back at zero after a launch."""
    k, rows = 5120, 34816
    w, dense = _weights("q4_K", rows, k, seed=21)
    x = np.random.default_rng(22).standard_normal((n, k)).astype(np.float32)

    def twice() -> list[np.ndarray]:
        return [_core.op_mul_mat(w, "q4_K", rows, x, tiles=True, gpu=True) for _ in range(2)]

    whole, got, splits = _a_b(
        (_core.wgmma_split_enabled, _core.set_wgmma_split_enabled),
        (False, True),
        twice,
        _core.wgmma_split_launches,
    )
    ref = whole[0]
    assert splits == (2 if _core.wgmma_built() and _gpu_is_sm90() else 0)
    assert np.array_equal(got[0], got[1]), "the split's sums depend on the order the pieces finished"
    scale = float(np.abs(x.astype(np.float64) @ dense.T.astype(np.float64)).max())
    assert np.abs(got[0] - ref).max() <= 1e-5 * scale


@functools.lru_cache(maxsize=2)
def _q4k_tall(rows: int) -> bytes:
    """Random Q4_K rows of k = 2816 (11 super-blocks), shared by the pipelined GEMM's cases."""
    return _weights("q4_K", rows, 2816, seed=25)[0]


@needs_gpu
@pytest.mark.parametrize(("rows", "n"), [(16480, 25), (16480, 32), (34816, 64), (34816, 100)])
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.usefixtures("f16_wgmma_off")
def test_cuda_wgmma_pipelined_gives_the_same_bits(rows: int, n: int, split: bool, mma_restored: None) -> None:
    """The pipelined wgmma kernel (DFLASH_WGMMA_PIPE=1: a super-block's float step while the next
    one's wgmmas run) does the unpipelined kernel's float operations in the same order: the same
    bits, with and without the tail split (which [gate; up]'s 34816 rows take on an H200), on
    [gdn q; k; v; z]'s 16480 rows (wgmma from 25 columns) and [gate; up]'s (from 33; 100: launches
    of 64 and 36). 11 super-blocks, an odd count (the loop runs them in pairs). Off (0) by
    default; each launch counted."""
    want_mode = int(os.environ.get("DFLASH_WGMMA_PIPE", "0"))
    assert _core.wgmma_pipe() == (want_mode if GPU and want_mode in (1, 2) else 0)
    k = 2816
    w = _q4k_tall(rows)
    x = np.random.default_rng(26).standard_normal((n, k)).astype(np.float32)
    with _switched(_core.wgmma_split_enabled, _core.set_wgmma_split_enabled, split):
        ref, got, pipes = _a_b(
            (_core.wgmma_pipe, _core.set_wgmma_pipe),
            (0, 1),
            lambda: _core.op_mul_mat(w, "q4_K", rows, x, tiles=True, gpu=True),
            _core.wgmma_pipe_launches,
        )
    assert pipes == ((2 if n > 64 else 1) if _core.wgmma_built() and _gpu_is_sm90() else 0)
    assert np.array_equal(got, ref)


@needs_gpu
@pytest.mark.parametrize(("rows", "n"), [(16480, 25), (16480, 64), (34816, 48), (34816, 100)])
@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize(
    "form", ["early", "two_warpgroups", "chunks", "three_warpgroups", "specialized", "specialized_two"]
)
@pytest.mark.usefixtures("f16_wgmma_off")
def test_cuda_wgmma_forms_give_the_same_bits(
    rows: int, n: int, split: bool, form: str, mma_restored: None
) -> None:
    """Two forms of the unpipelined wgmma kernel against the form before them, each launch counted
    (100: 64 and 36): DFLASH_WGMMA_EARLY=1 (the pipelined kernel's staging: the next stage's copies
    after a super-block's first wgmmas; on by default) changes when the copies go out, not the
    arithmetic: the same bits, with and without the tail split. DFLASH_WGMMA_WG=2 (128 rows a block,
    two warpgroups on one copy of the activations; off by default) does each output's float steps
    in the same order as one warpgroup: the same bits unsplit (16480 rows: a last block of 96 rows);
    with the tail split its tiles and pieces differ, so within float rounding (1e-5 of the scale).
    DFLASH_WGMMA_CHUNKS=1 (waits a chunk at a time, 2 stages, 3 blocks a multiprocessor; mode 0
    around the others): the same bits unsplit; split, its pieces follow its own occupancy. DFLASH_WGMMA_WG=3
    (the chunk-waiting kernel, 192 rows a block; 16480 rows: a last block of 160): likewise.
    DFLASH_WGMMA_WS=1 / 2 (a producer warpgroup's copies on mbarriers for one / two consumer
    warpgroups at every column count; 3 takes one from 33 columns, the default 4 by shape, so off here
    around them): the same bits unsplit (2: as the early form's 64-row tiles, every output's float
    steps in the same order); split, its own pieces. The pipe mode (0 here) takes precedence over
    the first three; three warpgroups over it."""
    if form in ("two_warpgroups", "three_warpgroups"):
        assert _core.wgmma_warpgroups() == int(os.environ.get("DFLASH_WGMMA_WG", "1"))
    if form == "chunks":
        assert _core.wgmma_chunks_enabled() == (GPU and os.environ.get("DFLASH_WGMMA_CHUNKS") == "1")
    want_ws = int(os.environ.get("DFLASH_WGMMA_WS", "4"))
    assert _core.wgmma_ws() == (want_ws if GPU and want_ws in (1, 2, 3, 4) else 0)
    switch = {
        "early": ((_core.wgmma_early_enabled, _core.set_wgmma_early_enabled), (False, True)),
        "two_warpgroups": ((_core.wgmma_warpgroups, _core.set_wgmma_warpgroups), (1, 2)),
        "chunks": ((_core.wgmma_chunks_enabled, _core.set_wgmma_chunks_enabled), (False, True)),
        "three_warpgroups": ((_core.wgmma_warpgroups, _core.set_wgmma_warpgroups), (1, 3)),
        "specialized": ((_core.wgmma_ws, _core.set_wgmma_ws_mode), (0, 1)),
        "specialized_two": ((_core.wgmma_ws, _core.set_wgmma_ws_mode), (0, 2)),
    }[form]
    counter = {
        "early": _core.wgmma_early_launches,
        "two_warpgroups": _core.wgmma_two_wg_launches,
        "chunks": _core.wgmma_chunks_launches,
        "three_warpgroups": _core.wgmma_chunks_launches,
        "specialized": _core.wgmma_ws_launches,
        "specialized_two": _core.wgmma_ws_launches,
    }[form]
    k = 2816
    w = _q4k_tall(rows)
    x = np.random.default_rng(31).standard_normal((n, k)).astype(np.float32)
    with _switched(_core.wgmma_split_enabled, _core.set_wgmma_split_enabled, split):
        with (
            _switched(_core.wgmma_pipe, _core.set_wgmma_pipe, 0),
            _switched(_core.wgmma_chunks, _core.set_wgmma_chunks_mode, 0),
            _switched(_core.wgmma_ws, _core.set_wgmma_ws_mode, 0),
        ):
            with _switched(_core.wgmma_early_enabled, _core.set_wgmma_early_enabled, True):
                ref, got, launches = _a_b(
                    *switch, lambda: _core.op_mul_mat(w, "q4_K", rows, x, tiles=True, gpu=True), counter
                )
    assert launches == ((2 if n > 64 else 1) if _core.wgmma_built() and _gpu_is_sm90() else 0)
    if split and form != "early":
        assert np.abs(got - ref).max() <= 1e-5 * float(np.abs(ref).max())
    else:
        assert np.array_equal(got, ref)


@needs_gpu
@pytest.mark.parametrize(("rows", "k"), [(5120, 6144), (5120, 17408), (1000, 2304)])
@pytest.mark.parametrize("n", [33, 64, 100])
@pytest.mark.usefixtures("f16_wgmma_off")
def test_cuda_wgmma_short_matrices_match_the_mma_gemm(rows: int, k: int, n: int, mma_restored: None) -> None:
    """DFLASH_WGMMA_SHORT=1: Q4_K matrices under 16384 rows (the 27B's ssm_out / attn_output, its
    ffn_down; 1000 rows: a last tile 40 rows short) at 33..64 columns through the wgmma forms (the
    warp-specialized one by default there), every tile split along K where the grid is under one
    wave: the same integer sums as the mma.sync GEMM, so within float rounding (1e-5 of the scale),
    and numpy within 3e-2; a launch of each 64 or fewer columns counted (100: 64 and 36). The
    pipelined kernel gives the early kernel's bits (on the H200 both hold 2 blocks a multiprocessor,
    so they split alike; the warp-specialized kernel plans its split by its own). Mode 1 is off by
    default (mode 2, long rows only, is the default). Modes set and restored as modes (not on /
    off), so the default mode is back after the test."""
    short = os.environ.get("DFLASH_WGMMA_SHORT", "2")
    assert _core.wgmma_short() == (int(short) if GPU and short in ("1", "2") else 0)
    dense, x, product = _q4k_product(rows, k, n, seed=29)
    modes = (_core.wgmma_short, _core.set_wgmma_short_mode)
    with _switched(_core.wgmma_pipe, _core.set_wgmma_pipe, 0):
        ref, got, launches = _a_b(modes, (0, 1), product, _core.wgmma_launches)
        with _switched(*modes, 1), _switched(_core.wgmma_ws, _core.set_wgmma_ws_mode, 0):
            early = product()
    with _switched(*modes, 1), _switched(_core.wgmma_pipe, _core.set_wgmma_pipe, 1):
        piped = product()
    assert launches == ((2 if n > 64 else 1) if _core.wgmma_built() and _gpu_is_sm90() else 0)
    want = x.astype(np.float64) @ dense.T.astype(np.float64)
    scale = float(np.abs(want).max())
    for form in (got, early):
        assert np.abs(form - ref).max() <= 1e-5 * scale
        assert np.abs(form - want).max() <= 3e-2 * scale
    assert np.array_equal(piped, early)


def _gate_up_at_32_columns_alike(
    switch: tuple[Callable[[], int], Callable[[int], None]],
    values: tuple[int, int],
    launches: Callable[[], int],
) -> None:
    """[gate; up] (34816 rows) at 32 columns with the switch at values[0] (the mma.sync GEMM), then
    at values[1] (a wgmma kernel): the same integer sums, so within float rounding (1e-5 of the
    scale), and numpy within 3e-2; one launch counted by `launches`."""
    k, rows, n = 2304, 34816, 32
    w, dense = _weights("q4_K", rows, k, seed=27)
    x = np.random.default_rng(28).standard_normal((n, k)).astype(np.float32)
    ref, got, counted = _a_b(
        switch, values, lambda: _core.op_mul_mat(w, "q4_K", rows, x, tiles=True, gpu=True), launches
    )
    assert counted == (1 if _core.wgmma_built() and _gpu_is_sm90() else 0)
    want = x.astype(np.float64) @ dense.T.astype(np.float64)
    scale = float(np.abs(want).max())
    assert np.abs(got - ref).max() <= 1e-5 * scale
    assert np.abs(got - want).max() <= 3e-2 * scale


def test_mma_tall_two_tiles_is_off_by_default() -> None:
    """DFLASH_MMA_TALL_TWO_TILES=1 (off by default; nothing to switch without CUDA) puts [gate; up]
    at up to 16 columns on two row tiles a warp."""
    assert _core.mma_tall_two_tiles_enabled() == (GPU and os.environ.get("DFLASH_MMA_TALL_TWO_TILES") == "1")
    if not GPU:
        _core.set_mma_tall_two_tiles_enabled(True)
        assert not _core.mma_tall_two_tiles_enabled() and _core.mma_tall_two_tiles_launches() == 0


@needs_gpu
@pytest.mark.parametrize("n", [9, 16])
@pytest.mark.usefixtures("f16_wgmma_off")
def test_cuda_mma_tall_two_tiles_takes_gate_up_up_to_16_columns(n: int, mma_restored: None) -> None:
    """[gate; up] (34816 rows) at 9 / 16 columns on one row tile a warp (the switch off: more
    blocks than two waves of one-tile blocks hold), then on two (DFLASH_MMA_TALL_TWO_TILES=1): the
    same operations a row, so within float rounding (1e-5 of the scale), numpy within 3e-2, and
    one two-tile launch counted."""
    k, rows = 2304, 34816
    w, dense = _weights("q4_K", rows, k, seed=41)
    x = np.random.default_rng(42).standard_normal((n, k)).astype(np.float32)
    switch = (_core.mma_tall_two_tiles_enabled, _core.set_mma_tall_two_tiles_enabled)
    run = lambda: _core.op_mul_mat(w, "q4_K", rows, x, tiles=True, gpu=True)  # noqa: E731
    before = _core.mma_tall_two_tiles_launches()
    ref, got, counted = _a_b(switch, (False, True), run, _core.mma_tall_two_tiles_launches)
    assert counted == 1 and _core.mma_tall_two_tiles_launches() - before == 1  # none with the switch off
    want = x.astype(np.float64) @ dense.T.astype(np.float64)
    scale = float(np.abs(want).max())
    assert np.abs(got - ref).max() <= 1e-5 * scale
    assert np.abs(got - want).max() <= 3e-2 * scale


def test_mma_tma_is_on_by_default_where_built() -> None:
    """Q4_K's mma.sync GEMM of up to 32 columns fills its stages with 2D bulk tensor copies on a
    Hopper GPU of an sm_90 build: on by default there (DFLASH_MMA_TMA=0 turns it off), never
    without CUDA or in a build without the sm_90a pass (nothing to switch)."""
    built = _core.wgmma_built()
    assert _core.mma_tma_enabled() == (built and os.environ.get("DFLASH_MMA_TMA") != "0")
    if not built:
        _core.set_mma_tma_enabled(True)
        assert not _core.mma_tma_enabled() and _core.mma_tma_launches() == 0


@needs_gpu
@pytest.mark.parametrize(
    ("rows", "k", "n"),
    [(34816, 2304, 16), (1000, 6144, 9), (12800, 2304, 16), (34816, 2304, 8)],
    ids=["gate-up", "long-rows-8-warps", "two-row-tiles", "one-column-tile"],
)
@pytest.mark.usefixtures("f16_wgmma_off")
def test_cuda_mma_tma_staging_gives_the_same_bits(rows: int, k: int, n: int, mma_restored: None) -> None:
    """Q4_K through the mma.sync GEMM with its stages filled by the lanes' cp.asyncs, then by one
    bulk tensor copy a super-block (DFLASH_MMA_TMA, on by default): the same bits ([gate; up]; 1000 rows of 24
    super-blocks, the 8-warp blocks with a last tile of 8 rows; two row tiles a warp), numpy within
    3e-2, and one launch counted on a Hopper GPU of an sm_90 build (none elsewhere)."""
    w, dense = _weights("q4_K", rows, k, seed=43)
    x = np.random.default_rng(44).standard_normal((n, k)).astype(np.float32)
    switch = (_core.mma_tma_enabled, _core.set_mma_tma_enabled)
    run = lambda: _core.op_mul_mat(w, "q4_K", rows, x, tiles=True, gpu=True)  # noqa: E731
    ref, got, counted = _a_b(switch, (False, True), run, _core.mma_tma_launches)
    assert counted == (1 if _core.wgmma_built() and _gpu_is_sm90() else 0)
    np.testing.assert_array_equal(got, ref)
    want = x.astype(np.float64) @ dense.T.astype(np.float64)
    assert np.abs(got - want).max() <= 3e-2 * float(np.abs(want).max())


@needs_gpu
@pytest.mark.usefixtures("f16_wgmma_off")
def test_cuda_wgmma_pipe_mode_2_takes_gate_up_at_32_columns(mma_restored: None) -> None:
    """DFLASH_WGMMA_PIPE=2 also gives [gate; up] at 25..32 columns to the pipelined wgmma kernel,
    which mode 1 leaves to the mma.sync GEMM (with [gate; up] from 33 columns: DFLASH_WGMMA_TALL_FROM
    held at 33)."""
    with _switched(_core.wgmma_tall_from, _core.set_wgmma_tall_from, 33):
        _gate_up_at_32_columns_alike(
            (_core.wgmma_pipe, _core.set_wgmma_pipe), (1, 2), _core.wgmma_pipe_launches
        )


@needs_gpu
@pytest.mark.usefixtures("f16_wgmma_off")
def test_cuda_wgmma_tall_from_25_takes_gate_up_at_32_columns(mma_restored: None) -> None:
    """DFLASH_WGMMA_TALL_FROM=25 (the default since session 38) gives [gate; up] at 25..32 columns
    to the wgmma GEMM (33 leaves them to the mma.sync GEMM); the pipe mode held at 0."""
    want_from = int(os.environ.get("DFLASH_WGMMA_TALL_FROM", "25"))
    assert _core.wgmma_tall_from() == (want_from if 25 <= want_from <= 64 else 25)
    with _switched(_core.wgmma_pipe, _core.set_wgmma_pipe, 0):
        _gate_up_at_32_columns_alike(
            (_core.wgmma_tall_from, _core.set_wgmma_tall_from), (33, 25), _core.wgmma_launches
        )


@needs_gpu
@pytest.mark.usefixtures("f16_wgmma_off", "ws_by_columns")
def test_cuda_wgmma_chunks_mode_2_takes_gate_up_up_to_32_columns(mma_restored: None) -> None:
    """DFLASH_WGMMA_CHUNKS=2 (the default since session 39): [gate; up] (34816 rows) at 32 columns through the
    chunk-waiting wgmma kernel, within float rounding of the default wgmma form (their tail splits
    differ); 16480 rows at 32 columns and [gate; up] at 48 keep the default form (no launch counted).
    The pipe mode held at 0, [gate; up] through wgmma from 25 columns."""
    env = os.environ.get("DFLASH_WGMMA_CHUNKS")
    want = 2 if env is None else int(env)
    assert _core.wgmma_chunks() == ((want if want in (1, 2) else 0) if GPU else 0)
    chunks = (_core.wgmma_chunks, _core.set_wgmma_chunks_mode)
    with _switched(_core.wgmma_pipe, _core.set_wgmma_pipe, 0):
        with _switched(_core.wgmma_tall_from, _core.set_wgmma_tall_from, 25):
            _gate_up_at_32_columns_alike(chunks, (0, 2), _core.wgmma_chunks_launches)
            k = 2304
            for rows, n in ((16480, 32), (34816, 48)):
                w, _ = _weights("q4_K", rows, k, seed=rows + n)
                x = np.random.default_rng(n).standard_normal((n, k)).astype(np.float32)
                ref, got, counted = _a_b(
                    chunks,
                    (0, 2),
                    lambda w=w, x=x, rows=rows: _core.op_mul_mat(w, "q4_K", rows, x, tiles=True, gpu=True),
                    _core.wgmma_chunks_launches,
                )
                assert counted == 0
                assert np.array_equal(got, ref)


@pytest.fixture
def ws_by_columns() -> Iterator[None]:
    """DFLASH_WGMMA_WS's mode 3 (the warp-specialized kernel from 33 columns, on the shapes the other
    wgmma switches route there) in place of the default by-shape mode 4, which takes ffn_down's long
    rows from 17 columns, [gate; up] from 25 and products with a fused residual, for tests of the
    forms it would replace; the mode restored after."""
    with _switched(_core.wgmma_ws, _core.set_wgmma_ws_mode, 3):
        yield


def test_wgmma_res_mode_is_off_unless_asked() -> None:
    want = int(os.environ.get("DFLASH_WGMMA_RES", "0"))
    assert _core.wgmma_res() == (want if GPU and want in (1, 2) else 0)


@needs_gpu
@pytest.mark.parametrize("k", [6144, 17408])
@pytest.mark.parametrize("n", [9, 16, 32, 48])
@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.usefixtures("f16_wgmma_off", "ws_by_columns")
def test_cuda_wgmma_res_mode_fuses_the_residual_into_the_wgmma_gemm(
    k: int, n: int, mode: int, mma_restored: None
) -> None:
    """DFLASH_WGMMA_RES: w x + residual for Q4_K at 9..48 columns (the engine's ffn_down with k =
    17408, its ssm_out / attn_output with 6144) through the early wgmma kernel with the residual
    added as it writes, split along K (5120 rows are 80 row tiles): mode 1 takes rows of 64
    super-blocks or more only, mode 2 every one (a launch counted). The same integer sums as the
    mma.sync GEMM's fused form, so within float rounding (1e-5 of the scale), and numpy within 3e-2."""
    rows = 5120
    w, dense = _weights("q4_K", rows, k, seed=41)
    rng = np.random.default_rng(42)
    x = rng.standard_normal((n, k)).astype(np.float32)
    res = rng.standard_normal((n, rows)).astype(np.float32)
    _core.set_mma_enabled(True)
    _core.set_fuse_add_enabled(True)
    ref, got, launches = _a_b(
        (_core.wgmma_res, _core.set_wgmma_res_mode),
        (0, mode),
        lambda: _core.op_mul_mat_fused(w, "q4_K", rows, x, residual=res, gpu=True),
        _core.wgmma_res_launches,
    )
    takes = mode == 2 or k >= 64 * 256
    assert launches == (int(takes) if _core.wgmma_built() and _gpu_is_sm90() else 0)
    want = x.astype(np.float64) @ dense.T.astype(np.float64) + res
    scale = float(np.abs(want).max())
    assert np.abs(got - ref).max() <= 1e-5 * scale
    assert np.abs(got - want).max() <= 3e-2 * scale
    with _switched(_core.wgmma_res, _core.set_wgmma_res_mode, mode):
        assert np.array_equal(_core.op_mul_mat_fused(w, "q4_K", rows, x, residual=res, gpu=True), got)


# Mode 4's first column count by matrix (gemm_kquant_mma.cu's ws_shape_from; 65: never; ssm_out's
# from DFLASH_WS_SHORT_FROM when set to 17..64).
def _ws_short_from() -> int:
    try:
        n = int(os.environ.get("DFLASH_WS_SHORT_FROM", "65"))
    except ValueError:  # the engine's atoi: 0, so never
        return 65
    return n if 17 <= n <= 64 else 65


_WS_SHAPES = [
    (34816, 2304, 25),
    (16480, 2304, 49),
    (12288, 2304, 25),
    (5120, 17408, 17),
    (5120, 6144, _ws_short_from()),
]


# (columns, a fused residual)
_WS_COLUMNS = [(16, True), (24, True), (32, False), (40, True), (48, True), (64, False)]


def _product_and_numpy(
    wtype: str, rows: int, k: int, n: int, residual: bool, seed: int
) -> tuple[np.ndarray, Callable[[], np.ndarray]]:
    """Weights of rows x k (seed), n random columns and, with `residual`, a residual [n, rows]
    (seed + 1); the tensor-core GEMM and its add fusion on. Numpy's w x (+ residual) in float64,
    and the engine's product (its residual fused) to run under each switch a test compares."""
    w, dense = _weights(wtype, rows, k, seed=seed)
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((n, k)).astype(np.float32)
    res = rng.standard_normal((n, rows)).astype(np.float32) if residual else None
    _core.set_mma_enabled(True)
    _core.set_fuse_add_enabled(True)

    def product() -> np.ndarray:
        if res is None:
            return _core.op_mul_mat(w, wtype, rows, x, tiles=True, gpu=True)
        return _core.op_mul_mat_fused(w, wtype, rows, x, residual=res, gpu=True)

    want = x.astype(np.float64) @ dense.T.astype(np.float64) + (0.0 if res is None else res)
    return want, product


@needs_gpu
@pytest.mark.parametrize(("rows", "k", "first"), _WS_SHAPES)
@pytest.mark.parametrize(("n", "residual"), _WS_COLUMNS)
@pytest.mark.usefixtures("f16_wgmma_off")
def test_cuda_wgmma_ws_mode_4_takes_each_matrix_from_its_columns(
    rows: int, k: int, first: int, n: int, residual: bool, mma_restored: None
) -> None:
    """DFLASH_WGMMA_WS=4: the warp-specialized int8 kernel takes each Q4_K matrix from its own column
    count ([gate; up] and attn_q from 25, [gdn q; k; v; z] from 49, ffn_down's long rows from 17,
    ssm_out's never unless DFLASH_WS_SHORT_FROM is set), the residual of a fused add (up to 48
    columns) written by it: one launch counted where it takes the matrix, none elsewhere; within
    float rounding (1e-5 of the scale) of the forms without it (its own split), numpy within 3e-2;
    the same bits on a second run."""
    want, product = _product_and_numpy("q4_K", rows, k, n, residual, seed=43)
    modes = (_core.wgmma_ws, _core.set_wgmma_ws_mode)
    ref, got, launches = _a_b(modes, (0, 4), product, _core.wgmma_ws_launches)
    with _switched(*modes, 4):
        again = product()
    takes = n >= first and _core.wgmma_built() and _gpu_is_sm90()
    assert launches == int(takes)
    scale = float(np.abs(want).max())
    assert np.abs(got - ref).max() <= 1e-5 * scale
    assert np.abs(got - want).max() <= 3e-2 * scale
    assert np.array_equal(again, got)


@functools.cache
def _q4k_bytes(rows: int, k: int, seed: int) -> bytes:
    """_weights' Q4_K bytes alone (no float64 copy: 34816 x 17408 is 341 MB of blocks)."""
    rng = np.random.default_rng(seed)
    return np.ascontiguousarray(random_blocks(rng, rows, k, GGMLQuantizationType.Q4_K, std=0.05)).tobytes()


@needs_gpu
@pytest.mark.parametrize(
    ("rows", "k", "n", "runs"),
    [(5120, 17408, 64, 60), (5120, 17408, 48, 60), (34816, 5120, 64, 30), (34816, 17408, 64, 8)],
)
@pytest.mark.parametrize("short", [0, 2])
@pytest.mark.usefixtures("f16_wgmma_off", "ws_by_columns")
def test_cuda_wgmma_gives_the_same_bits_every_run(
    rows: int, k: int, n: int, runs: int, short: int, mma_restored: None
) -> None:
    """The Q4_K wgmma GEMM is deterministic: identical launches give identical bits, however many
    super-blocks a block walks (session 42, H100: the warp-specialized kernel gave the 27B's
    ffn_down, 5120 x 17408 split in pieces of 22-23 super-blocks, a stale super-block's sums in some
    warp now and then, 5-14 runs of 60 differing at 64 columns, and 34816 x 17408 in every run;
    [gate; up], 34816 x 5120, never). Mode 2 of DFLASH_WGMMA_SHORT sends the short matrices through
    the warp-specialized kernel too (DFLASH_WGMMA_WS's mode 3 here: the default mode 4 sends them
    whatever the short mode); each launch counted on an sm_90a build on sm_90."""
    w = _q4k_bytes(rows, k, seed=43)
    x = np.random.default_rng(44).standard_normal((n, k)).astype(np.float32)
    with _switched(_core.wgmma_short, _core.set_wgmma_short_mode, short):
        before = _core.wgmma_launches()
        first = _core.op_mul_mat(w, "q4_K", rows, x, tiles=True, gpu=True)
        differing = sum(
            not np.array_equal(_core.op_mul_mat(w, "q4_K", rows, x, tiles=True, gpu=True), first)
            for _ in range(runs)
        )
        launches = _core.wgmma_launches() - before
    takes = rows >= 16384 or short == 2
    assert launches == ((runs + 1) if takes and _core.wgmma_built() and _gpu_is_sm90() else 0)
    assert differing == 0


@needs_gpu
@pytest.mark.parametrize("k", [6144, 17408])
@pytest.mark.usefixtures("f16_wgmma_off")
def test_cuda_wgmma_short_mode_2_takes_long_rows_only(k: int, mma_restored: None) -> None:
    """DFLASH_WGMMA_SHORT=2: of the Q4_K matrices under 16384 rows, only rows of 64 super-blocks or
    more (the 27B's ffn_down, k = 17408; not ssm_out's 6144) take the wgmma form at 33..64
    columns: within float rounding (1e-5 of the scale) of the mma.sync GEMM either way."""
    rows, n = 5120, 64
    w, _ = _weights("q4_K", rows, k, seed=29)
    x = np.random.default_rng(35).standard_normal((n, k)).astype(np.float32)
    with _switched(_core.wgmma_pipe, _core.set_wgmma_pipe, 0):
        ref, got, launches = _a_b(
            (_core.wgmma_short, _core.set_wgmma_short_mode),
            (0, 2),
            lambda: _core.op_mul_mat(w, "q4_K", rows, x, tiles=True, gpu=True),
            _core.wgmma_launches,
        )
    assert launches == (int(k >= 64 * 256) if _core.wgmma_built() and _gpu_is_sm90() else 0)
    scale = float(np.abs(ref).max())
    assert np.abs(got - ref).max() <= 1e-5 * scale


@needs_gpu
@pytest.mark.parametrize("n", [2, 9, 16])
@pytest.mark.parametrize("mode", [1, 2])
@pytest.mark.usefixtures("f16_wgmma_off")
def test_cuda_q6k_long_rows_on_8_warps_match_4(n: int, mode: int, mma_restored: None) -> None:
    """Q6_K rows of 24 super-blocks (k = 6144, the 27B's ssm_out and attn_output length; its
    ffn_down has 68) at up to 16 columns with DFLASH_MMA_Q6K_LONG_8's 8 warps a block (the stages
    in dynamic shared memory; mode 1 at 3 blocks a multiprocessor, 2 with the compiler's registers)
    against the 4-warp kernel: the same integer sums added in another warp order, so within float
    rounding (1e-5 of the scale), and numpy within 3e-2. Off (0) by default."""
    want_mode = int(os.environ.get("DFLASH_MMA_Q6K_LONG_8", "0"))
    assert _core.mma_q6k_long_8() == (want_mode if GPU and want_mode in (1, 2) else 0)
    k, rows = 6144, 1000
    w, dense = _weights("q6_K", rows, k, seed=23)
    x = np.random.default_rng(24).standard_normal((n, k)).astype(np.float32)
    ref, got, _ = _a_b(
        (_core.mma_q6k_long_8, _core.set_mma_q6k_long_8),
        (0, mode),
        lambda: _core.op_mul_mat(w, "q6_K", rows, x, tiles=True, gpu=True),
    )
    want = x.astype(np.float64) @ dense.T.astype(np.float64)
    scale = float(np.abs(want).max())
    assert not np.array_equal(got, ref), "the 8-warp form did not run (its warps add in another order)"
    assert np.abs(got - ref).max() <= 1e-5 * scale
    assert np.abs(got - want).max() <= 3e-2 * scale


def _residual_inputs(
    wtype: str, n: int, rows: int, seed: int, k: int = 1024
) -> tuple[bytes, np.ndarray, np.ndarray]:
    """Weights of rows x k, n random columns and a residual [n, rows]."""
    w, _ = _weights(wtype, rows, k, seed=seed)
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((n, k)).astype(np.float32)
    return w, x, rng.standard_normal((n, rows)).astype(np.float32)


@pytest.fixture
def add_limit_restored() -> Iterator[None]:
    """The add fusion's column limit as it was."""
    yield from _restoring(_core.fuse_add_max_columns, _core.set_fuse_add_max_columns)


@needs_gpu
@pytest.mark.parametrize("wtype", TYPES)
@pytest.mark.parametrize("n", [2, 9, 16, 33, 48, 64, 100])
@pytest.mark.parametrize("limit", [48, 64])
def test_cuda_mma_gemm_with_residual_is_the_product_plus_the_residual(
    wtype: str, n: int, limit: int, mma_restored: None, add_limit_restored: None
) -> None:
    """w x + residual, the engine's residual shape (patches/0008): up to the limit (48 or 64
    columns, fuse_add_max_columns) the GEMM adds the residual as it writes (the fusion counter
    moves), bit for bit what the add node gives its output (one float addition: the product plus
    the residual in numpy's float32); above it, or switched off, ggml's add node gives the same."""
    rows = 1000
    w, x, res = _residual_inputs(wtype, n, rows, seed=16)
    _core.set_mma_enabled(True)
    _core.set_mma_q80_enabled(True)
    _core.set_fuse_add_max_columns(limit)
    assert _core.fuse_add_max_columns() == limit
    want = _core.op_mul_mat(w, wtype, rows, x, tiles=True, gpu=True) + res
    for fused in (True, False):
        _core.set_fuse_add_enabled(fused)
        before = _core.mul_mat_add_fusions()
        got = _core.op_mul_mat_fused(w, wtype, rows, x, residual=res, gpu=True)
        assert _core.mul_mat_add_fusions() - before == (1 if fused and n <= limit else 0)
        np.testing.assert_array_equal(got, want, err_msg=f"{wtype}, {n} columns, fused={fused}")


@needs_gpu
@pytest.mark.parametrize(("rows", "k"), [(1000, 16384), (1000, 6144)])
@pytest.mark.parametrize("n", [48, 49, 64])
@pytest.mark.usefixtures("mma_restored", "add_limit_restored", "f16_wgmma_off")
def test_cuda_q4k_takes_its_residual_up_to_64_columns(rows: int, k: int, n: int) -> None:
    """At the default limit (64) a Q4_K product of long rows (64 super-blocks: ffn_down's, the
    int8 warp-specialized kernel's from 17 columns under DFLASH_WGMMA_WS=4) takes its residual up
    to 64 columns, written by that kernel (its launch counted), and shorter rows (ssm_out's) through
    the mma.sync GEMM; the outputs are the add node's bit for bit."""
    w, x, res = _residual_inputs("q4_K", n, rows, seed=19, k=k)
    _core.set_mma_enabled(True)
    _core.set_fuse_add_enabled(True)
    _core.set_fuse_add_max_columns(64)
    with _switched(_core.wgmma_ws, _core.set_wgmma_ws_mode, 4):
        want = _core.op_mul_mat(w, "q4_K", rows, x, tiles=True, gpu=True) + res
        before, ws_before = _core.mul_mat_add_fusions(), _core.wgmma_ws_launches()
        got = _core.op_mul_mat_fused(w, "q4_K", rows, x, residual=res, gpu=True)
        fused, ws = _core.mul_mat_add_fusions() - before, _core.wgmma_ws_launches() - ws_before
    hopper = _core.wgmma_built() and _gpu_is_sm90()
    assert fused == 1
    assert ws == (1 if hopper and k == 16384 else 0)
    np.testing.assert_array_equal(got, want, err_msg=f"{rows} x {k}, {n} columns")


@pytest.fixture
def mma_split_restored() -> Iterator[None]:
    yield from _restoring(_core.mma_split, _core.set_mma_split)


@pytest.fixture
def f16_wgmma_off() -> Iterator[None]:
    """The f16 wgmma GEMM off (Q6_K's long rows take it from 9 columns by default; Q4_K's tall
    matrices with DFLASH_Q4K_F16_TALL), for tests of the int8 forms it would replace; its switches
    restored after."""
    q6, q4 = _core.q6k_wgmma_from_columns(), _core.q4k_f16_from_columns()
    tall = _core.q4k_f16_tall_from_columns()
    _core.set_q6k_wgmma_from(0)
    _core.set_q4k_f16_from(0)
    _core.set_q4k_f16_tall_from(0)
    yield
    _core.set_q6k_wgmma_from(q6)
    _core.set_q4k_f16_from(q4)
    _core.set_q4k_f16_tall_from(tall)


@pytest.fixture
def wgmma_short_off(ws_by_columns: None) -> Iterator[None]:
    """Q4_K's long rows under 16384 rows at 33..64 columns on the mma.sync GEMM (DFLASH_WGMMA_SHORT's
    mode 0 and the warp-specialized kernel by column count, whatever the default or the
    environment), for tests of the mma.sync forms."""
    was = _core.wgmma_short()
    _core.set_wgmma_short_mode(0)
    yield
    _core.set_wgmma_short_mode(was)


def test_mma_split_is_off_unless_asked() -> None:
    env = os.environ.get("DFLASH_MMA_SPLIT", "0")
    want = int(env) if env.isdigit() and 2 <= int(env) <= 8 else -1 if env == "auto" else 0
    assert _core.mma_split() == (want if GPU else 0)


@needs_gpu
@pytest.mark.parametrize("wtype", ("q4_K", "q6_K", "q5_K"))
@pytest.mark.parametrize("n", [16, 17, 32, 64])
@pytest.mark.parametrize("pieces,k", [(2, 6144), (3, 6144), (-1, 6144), (-1, 2304)])
@pytest.mark.usefixtures(
    "mma_restored", "add_limit_restored", "mma_split_restored", "f16_wgmma_off", "wgmma_short_off"
)
def test_cuda_mma_split_along_k_is_the_product(wtype: str, n: int, pieces: int, k: int) -> None:
    """Long rows (24 super-blocks) at 17..64 columns split along K (DFLASH_MMA_SPLIT), and with
    `auto` (-1) shorter rows too (9 super-blocks: 4 pieces): the unsplit GEMM's outputs to float
    rounding (the pieces' sums added in piece order), the split counter moving once a product; with
    a residual (up to 64 columns) that product plus the residual bit for bit. 16 columns stay
    unsplit (8 warps a block there)."""
    rows = 1000
    w, _ = _weights(wtype, rows, k, seed=41)
    rng = np.random.default_rng(42)
    x = rng.standard_normal((n, k)).astype(np.float32)
    res = rng.standard_normal((n, rows)).astype(np.float32)
    _core.set_mma_enabled(True)
    _core.set_fuse_add_enabled(True)
    _core.set_fuse_add_max_columns(64)
    _core.set_mma_split(0)
    whole = _core.op_mul_mat(w, wtype, rows, x, tiles=True, gpu=True)
    _core.set_mma_split(pieces)
    before = _core.mma_split_launches()
    split = _core.op_mul_mat(w, wtype, rows, x, tiles=True, gpu=True)
    assert _core.mma_split_launches() - before == (1 if n > 16 else 0)
    np.testing.assert_allclose(split, whole, rtol=0, atol=1e-5 * np.abs(whole).max())
    if n <= 16:
        np.testing.assert_array_equal(split, whole)
    fused = _core.op_mul_mat_fused(w, wtype, rows, x, residual=res, gpu=True)
    np.testing.assert_array_equal(fused, split + res, err_msg=f"{wtype}, {n} columns, {pieces} pieces")


@needs_gpu
@pytest.mark.parametrize("wtype", ("q4_K", "q6_K"))
@pytest.mark.parametrize("n", [24, 64])
@pytest.mark.parametrize("k", [2304, 17408])
@pytest.mark.usefixtures("mma_restored", "mma_split_restored", "f16_wgmma_off", "wgmma_short_off")
def test_cuda_mma_split_with_staged_activations_gives_the_same_bits(wtype: str, n: int, k: int) -> None:
    """The split along K (auto pieces) with its activations staged in shared memory a block
    (DFLASH_MMA_ACT_SMEM) gives the split's outputs without staging bit for bit."""
    rows = 1000
    w, _ = _weights(wtype, rows, k, seed=47)
    x = np.random.default_rng(48).standard_normal((n, k)).astype(np.float32)
    _core.set_mma_enabled(True)
    _core.set_mma_split(-1)
    was = _core.mma_act_smem()
    try:
        _core.set_mma_act_smem(False)
        before = _core.mma_split_launches()
        plain = _core.op_mul_mat(w, wtype, rows, x, tiles=True, gpu=True)
        _core.set_mma_act_smem(True)
        staged = _core.op_mul_mat(w, wtype, rows, x, tiles=True, gpu=True)
    finally:
        _core.set_mma_act_smem(was)
    assert _core.mma_split_launches() - before == 2
    np.testing.assert_array_equal(staged, plain, err_msg=f"{wtype}, {n} columns, k {k}")


@pytest.fixture
def glu_restored() -> Iterator[None]:
    yield from _restoring(_core.fuse_glu_enabled, _core.set_fuse_glu_enabled)


def _swiglu_inputs(wtype: str, n: int, rows: int, k: int) -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
    """Weights, the stacked [gate | up] rows of n columns, a residual, and w @ silu(gate) * up in
    float64 (the oracle up to the 8-bit activations)."""
    w, dense = _weights(wtype, rows, k, seed=31)
    rng = np.random.default_rng(32)
    gate_up = rng.standard_normal((n, 2 * k)).astype(np.float32)
    res = rng.standard_normal((n, rows)).astype(np.float32)
    g, u = gate_up[:, :k].astype(np.float64), gate_up[:, k:].astype(np.float64)
    return w, gate_up, res, (g / (1.0 + np.exp(-g)) * u) @ dense.T.astype(np.float64)


@pytest.mark.parametrize("invariant", [False, True])
def test_swiglu_product_is_the_product_of_the_swiglu(invariant: bool) -> None:
    """The engine's stacked FFN shape (gate and up the halves of one product, then the down
    matmul and a residual) against numpy, on whatever backend this build has (CPU in CI)."""
    rows, k, n = 96, 512, 5
    w, gate_up, res, want = _swiglu_inputs("q4_K", n, rows, k)
    got = _core.op_swiglu_mul_mat(w, "q4_K", rows, gate_up, residual=res, invariant=invariant)
    assert got.shape == (n, rows)
    assert np.abs(got - res - want).max() <= 3e-2 * np.abs(want).max()


def test_glu_fusion_switch_is_on_with_cuda_by_default() -> None:
    assert _core.fuse_glu_enabled() == (GPU and os.environ.get("DFLASH_FUSE_GLU") != "0")


def test_add_fusion_limit_is_64_columns_with_cuda_by_default() -> None:
    """64 unless DFLASH_FUSE_ADD_MAX_COLUMNS asks for less (48); 0 (no fusion) without CUDA."""
    asked = os.environ.get("DFLASH_FUSE_ADD_MAX_COLUMNS", "64")
    assert _core.fuse_add_max_columns() == ((64 if int(asked) >= 64 else 48) if GPU else 0)


@needs_gpu
@pytest.mark.parametrize("wtype", ("q4_K", "q6_K"))
@pytest.mark.parametrize("n", [1, 2, 9, 16, 33, 48, 64, 100])
@pytest.mark.parametrize("invariant", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_cuda_swiglu_read_by_the_quantizer_gives_the_unfused_bits(
    wtype: str, n: int, invariant: bool, residual: bool, glu_restored: None, mma_restored: None
) -> None:
    """patches/0009: the SwiGLU before a tagged matmul is computed by the matmul's quantizer (the
    GEMV's at one column and in the batch-invariant form, the tensor-core GEMM's at 2..256; the
    residual add taken too where the GEMM takes it): one fusion counted, and the outputs are the
    unfused graph's (the GLU node, then the quantizer) bit for bit."""
    rows, k = 1000, 1024
    w, gate_up, res, want = _swiglu_inputs(wtype, n, rows, k)
    r = res if residual else None
    _core.set_fuse_glu_enabled(False)
    before = _core.mul_mat_glu_fusions()
    plain = _core.op_swiglu_mul_mat(w, wtype, rows, gate_up, residual=r, invariant=invariant, gpu=True)
    assert _core.mul_mat_glu_fusions() == before
    _core.set_fuse_glu_enabled(True)
    fused = _core.op_swiglu_mul_mat(w, wtype, rows, gate_up, residual=r, invariant=invariant, gpu=True)
    assert _core.mul_mat_glu_fusions() - before == 1
    np.testing.assert_array_equal(fused, plain, err_msg=f"{wtype}, {n} columns")
    got = fused - res if residual else fused
    assert np.abs(got - want).max() <= 3e-2 * np.abs(want).max()


def _engine_logits(path: str, seed: int) -> np.ndarray:
    """The engine's forwards on CUDA: a prefill of 16 tokens, a verify-sized forward of 16, then
    8 decode steps; their logits."""
    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.n_threads, cfg.n_gpu_layers = 256, 2, 99
    eng = _core.TargetEngine(path, cfg)
    tokens = np.random.default_rng(seed).integers(0, eng.hparams["n_vocab"], size=40).tolist()
    rows = [eng.forward(tokens[:16], True)[0], eng.forward(tokens[16:32], True)[0]]
    rows += [eng.forward([t], True)[0] for t in tokens[32:]]
    return np.concatenate(rows)


@pytest.fixture
def rms_norm_restored() -> Iterator[None]:
    was = _core.fuse_rms_norm_enabled()
    yield
    _core.set_fuse_rms_norm_enabled(was)


def _normed_inputs(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Columns x [n, k] of magnitudes far apart (the sum of squares' order shows in its bits), a
    norm weight [k], and rms_norm(x) * weight in float64."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((n, k)) * np.exp2(rng.uniform(-6, 6, (n, k)))).astype(np.float32)
    weight = (1.0 + 0.25 * rng.standard_normal(k)).astype(np.float32)
    x64 = x.astype(np.float64)
    normed = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + 1e-6) * weight
    return x, weight, normed


@pytest.mark.parametrize("n", [1, 3])
def test_normed_product_is_the_product_of_the_norm(n: int) -> None:
    """w @ (rms_norm(x) * weight) against numpy, on whatever backend this build has (CPU in CI)."""
    rows, k = 96, 512
    w, dense = _weights("q4_K", rows, k, seed=41)
    x, weight, normed = _normed_inputs(n, k, 42)
    got = _core.op_mul_mat_fused(w, "q4_K", rows, x, norm=weight, eps=1e-6)
    want = normed @ dense.T.astype(np.float64)
    assert np.abs(got - want).max() <= 3e-2 * np.abs(want).max()


def test_rms_norm_fusion_switch_is_on_with_cuda_by_default() -> None:
    assert _core.fuse_rms_norm_enabled() == (GPU and os.environ.get("DFLASH_FUSE_RMS_NORM") != "0")


def test_a_norm_weight_of_the_wrong_size_is_refused() -> None:
    w, _ = _weights("q4_K", 32, 256, seed=43)
    x = np.ones((2, 256), np.float32)
    with pytest.raises(_core.InvalidParameterError, match="norm must hold k values"):
        _core.op_mul_mat_fused(w, "q4_K", 32, x, norm=np.ones(255, np.float32))


@needs_gpu
@pytest.mark.parametrize("wtype", ("q4_K", "q6_K", "q8_0"))
@pytest.mark.parametrize("n", [1, 2, 16, 33, 64, 100])
@pytest.mark.parametrize("k", [768, 2304])
def test_cuda_rms_norm_read_by_the_quantizer_gives_the_unfused_bits(
    wtype: str, n: int, k: int, rms_norm_restored: None, mma_restored: None
) -> None:
    """patches/0010: the RMSNorm and its weight before a tagged matmul of 2..64 columns are
    computed by the GEMM's quantizer (k = 768: ggml's 256-thread norm; 2304: its 1024-thread one):
    one fusion counted, and the outputs are the unfused graph's (ggml's rms_norm_f32, then the
    quantizer) bit for bit; one column (the GEMV) and more than 64 keep the norm node."""
    rows = 1000
    _core.set_mma_q80_enabled(True)
    w, dense = _weights(wtype, rows, k, seed=44)
    x, weight, normed = _normed_inputs(n, k, 45)
    _core.set_fuse_rms_norm_enabled(False)
    before = _core.mul_mat_rms_norm_fusions()
    plain = _core.op_mul_mat_fused(w, wtype, rows, x, norm=weight, gpu=True)
    assert _core.mul_mat_rms_norm_fusions() == before
    _core.set_fuse_rms_norm_enabled(True)
    fused = _core.op_mul_mat_fused(w, wtype, rows, x, norm=weight, gpu=True)
    limit = int(os.environ.get("DFLASH_FUSE_RMS_NORM_COLUMNS", "64"))
    assert _core.mul_mat_rms_norm_fusions() - before == (1 if 2 <= n <= limit else 0)
    np.testing.assert_array_equal(fused, plain, err_msg=f"{wtype}, {n} columns, k {k}")
    want = normed @ dense.T.astype(np.float64)
    assert np.abs(fused - want).max() <= 3e-2 * np.abs(want).max()


def _fused_equals_plain(fusion: str, run: Callable[[], np.ndarray], taken: bool, what: str) -> np.ndarray:
    """run() with the fusion switched off, then on: its counter moves only while on (by one where
    `taken`), and both give the same bits. The fused outputs."""
    set_enabled = getattr(_core, f"set_fuse_{fusion}_enabled")
    count = getattr(_core, f"mul_mat_{fusion}_fusions")
    set_enabled(False)
    before = count()
    plain = run()
    assert count() == before
    set_enabled(True)
    fused = run()
    assert count() - before == (1 if taken else 0), what
    np.testing.assert_array_equal(fused, plain, err_msg=what)
    return fused


@pytest.fixture
def rms_norm_gemv_restored() -> Iterator[None]:
    was = _core.fuse_rms_norm_gemv_enabled()
    yield
    _core.set_fuse_rms_norm_gemv_enabled(was)


def test_one_column_norm_fusion_is_on_unless_turned_off() -> None:
    assert _core.fuse_rms_norm_gemv_enabled() == (GPU and os.environ.get("DFLASH_FUSE_RMS_NORM_GEMV") != "0")


@needs_gpu
@pytest.mark.parametrize("wtype", ("q4_K", "q6_K"))
@pytest.mark.parametrize("k", [512, 2048, 5120])  # even super-blocks: Q6_K rows the GEMV takes
def test_cuda_one_column_norm_read_by_the_gemv_quantizer_gives_the_unfused_bits(
    wtype: str, k: int, rms_norm_restored: None, rms_norm_gemv_restored: None
) -> None:
    """With DFLASH_FUSE_RMS_NORM_GEMV on, the RMSNorm before a tagged one-column matmul is computed
    by the GEMV's quantizer (k = 512: a block of ggml's 256 norm threads; 2048, 5120: of its 1024):
    one fusion counted, and the output is the unfused graph's (ggml's rms_norm_f32, then the
    GEMV's quantizer) bit for bit."""
    rows = 1000
    w, dense = _weights(wtype, rows, k, seed=46)
    x, weight, normed = _normed_inputs(1, k, 47)
    _core.set_fuse_rms_norm_enabled(True)

    def run() -> np.ndarray:
        return _core.op_mul_mat_fused(w, wtype, rows, x, norm=weight, gpu=True)

    fused = _fused_equals_plain("rms_norm_gemv", run, True, f"{wtype}, k {k}")
    want = normed @ dense.T.astype(np.float64)
    assert np.abs(fused - want).max() <= 3e-2 * np.abs(want).max()


@needs_gpu
@pytest.mark.parametrize(
    "fusion,seed",
    [
        ("glu", 5),
        ("rms_norm", 6),
        ("rms_norm_pair", 7),
        ("head_norm", 8),
        ("sigmoid_gate", 9),
        ("rms_norm_gemv", 10),
    ],
)
def test_cuda_fusion_changes_no_logit_of_the_engine(synth_model, fusion: str, seed: int) -> None:
    """The engine's forwards with a fusion on against off: glu, the SwiGLU nodes read by the
    matmuls' quantizers (the FFN's stacked [gate; up] on CUDA, the delta rule's gated outputs);
    rms_norm, the norms before the FFN and the GDN layers' stacked input projections read by the
    GEMMs' quantizers (the 16-token forwards); rms_norm_pair, the norms read by a layer's Q6_K
    projection and the Q4_K stack of its others (one quantizer for both); head_norm, the delta
    rule's per-head output norms read by ssm_out's quantizer; sigmoid_gate, the attention's output
    gates read in place by o_proj's quantizer (test_quantizer_fusions.py); rms_norm_gemv, the norms
    of the decode steps read by the GEMV's quantizer. Some are taken, and no logit changes."""
    set_enabled = getattr(_core, f"set_fuse_{fusion}_enabled")
    was = getattr(_core, f"fuse_{fusion}_enabled")()
    fusions = getattr(_core, f"mul_mat_{fusion}_fusions")
    path = str(synth_model("small", "q4_K_M"))
    try:
        set_enabled(False)
        plain = _engine_logits(path, seed)
        set_enabled(True)
        before = fusions()
        fused = _engine_logits(path, seed)
    finally:
        set_enabled(was)
    assert fusions() > before
    np.testing.assert_array_equal(fused, plain)


@pytest.mark.parametrize(
    ("env", "get"),
    [("DFLASH_Q6K_WGMMA", "q6k_wgmma_from_columns"), ("DFLASH_Q4K_F16", "q4k_f16_from_columns")],
)
def test_f16_wgmma_gemm_defaults(env: str, get: str) -> None:
    """The f16 wgmma GEMM takes Q6_K's long rows from 9 columns by default and its output matrix
    from 17 (DFLASH_Q6K_WGMMA_OUTPUT), through its warp-specialized form, and Q4_K never (slower in
    the engine); DFLASH_Q6K_WGMMA=n / DFLASH_Q4K_F16=n (2..64) start it from n columns, 0 turns it
    off, for long rows and the output matrix unless DFLASH_F16_WGMMA_ALL=1. The warp-specialized
    form is on (DFLASH_F16_WS=0 turns it off). Q4_K's long rows take the int8 warp-specialized
    kernel at 33..64 columns (DFLASH_WGMMA_SHORT's mode 2; session 42 found it nondeterministic on
    them, session 43 saw its fix deterministic), and Q4_K's tall matrices take the f16 form from 33
    columns (DFLASH_Q4K_F16_TALL; faster at 64 on session 54's H100, 0 turns it off)."""
    value = os.environ.get(env, "9" if env == "DFLASH_Q6K_WGMMA" else "0")
    want = int(value) if GPU and value.isdigit() and 2 <= int(value) <= 64 else 0
    assert getattr(_core, get)() == want
    assert _core.f16_wgmma_all() == (GPU and os.environ.get("DFLASH_F16_WGMMA_ALL") == "1")
    assert _core.f16_ws_enabled() == (GPU and os.environ.get("DFLASH_F16_WS", "1") != "0")
    short = os.environ.get("DFLASH_WGMMA_SHORT", "2")
    assert _core.wgmma_short() == (int(short) if GPU and short in ("1", "2") else 0)
    output = os.environ.get("DFLASH_Q6K_WGMMA_OUTPUT", "17")
    assert _core.q6k_output_from_columns() == (
        int(output) if GPU and output.isdigit() and 2 <= int(output) <= 64 else 0
    )
    other = os.environ.get("DFLASH_Q6K_WGMMA_OTHER", "25")
    assert _core.q6k_other_from_columns() == (
        int(other) if GPU and other.isdigit() and 2 <= int(other) <= 64 else 0
    )
    tall = os.environ.get("DFLASH_Q4K_F16_TALL", "33")
    want_tall = int(tall) if GPU and tall.isdigit() and 2 <= int(tall) <= 64 else 0
    assert _core.q4k_f16_tall_from_columns() == want_tall


def test_f16_convert_v8_is_on_unless_asked() -> None:
    assert _core.f16_convert_v8() == (GPU and os.environ.get("DFLASH_F16_CONVERT_V8", "1") != "0")


@needs_gpu
@pytest.mark.parametrize(("wtype", "k"), [("q6_K", 6144), ("q6_K", 2304), ("q4_K", 16384)])
@pytest.mark.parametrize("n", [9, 17, 33, 64])
@pytest.mark.parametrize("residual", [False, True])
def test_cuda_f16_convert_v8_gives_the_same_bits(
    wtype: str, k: int, n: int, residual: bool, mma_restored: None
) -> None:
    """The f16 wgmma GEMM (Q6_K's long rows from 9 columns, its other rows from 25, Q4_K's with
    DFLASH_Q4K_F16=9) gives the same outputs with its activations converted 8 values a thread
    (DFLASH_F16_CONVERT_V8, the default above 16 columns) as with a value a thread, with and without a fused
    residual; numpy within 3e-2 of the scale. The other source forms (SwiGLU, norms, gates) are
    held to the same halves on the emulator (check_f16_convert)."""
    rows = 1000
    want, product = _product_and_numpy(wtype, rows, k, n, residual, seed=61)
    with _switched(_core.q4k_f16_from_columns, _core.set_q4k_f16_from, 9):
        switch = (_core.f16_convert_v8, _core.set_f16_convert_v8)
        ref, got, launches = _a_b(switch, (False, True), product, _core.f16_wgmma_launches)
    f16 = _core.wgmma_built() and _gpu_is_sm90() and not (k == 2304 and n < 25)
    assert launches == int(f16)
    assert np.array_equal(got, ref)
    assert np.abs(got - want).max() <= 3e-2 * float(np.abs(want).max())


@pytest.fixture
def f16_wgmma_restored() -> Iterator[None]:
    """The f16 wgmma GEMM's switches as they were; every matrix shape taken meanwhile (by default
    only long rows and the output matrix)."""
    q6, q4, every = _core.q6k_wgmma_from_columns(), _core.q4k_f16_from_columns(), _core.f16_wgmma_all()
    _core.set_f16_wgmma_all(True)
    yield
    _core.set_q6k_wgmma_from(q6)
    _core.set_q4k_f16_from(q4)
    _core.set_f16_wgmma_all(every)


@pytest.fixture
def f16_shapes_restored() -> Iterator[None]:
    """The f16 wgmma GEMM's column thresholds as they were, by shape as the engine chooses them
    (DFLASH_F16_WGMMA_ALL off meanwhile)."""
    q6, q4, out, other, tall, every = (
        _core.q6k_wgmma_from_columns(),
        _core.q4k_f16_from_columns(),
        _core.q6k_output_from_columns(),
        _core.q6k_other_from_columns(),
        _core.q4k_f16_tall_from_columns(),
        _core.f16_wgmma_all(),
    )
    _core.set_f16_wgmma_all(False)
    yield
    _core.set_q6k_wgmma_from(q6)
    _core.set_q4k_f16_from(q4)
    _core.set_q6k_output_from(out)
    _core.set_q6k_other_from(other)
    _core.set_q4k_f16_tall_from(tall)
    _core.set_f16_wgmma_all(every)


@needs_gpu
@pytest.mark.parametrize(
    ("wtype", "rows", "k", "n", "taken"),
    [
        ("q6_K", 65536, 256, 16, False),  # the output matrix: from DFLASH_Q6K_WGMMA_OUTPUT's 17
        ("q6_K", 65536, 256, 24, True),
        ("q6_K", 1024, 6144, 16, True),  # long rows (24 super-blocks): from DFLASH_Q6K_WGMMA's 9
        ("q6_K", 1024, 2304, 16, False),  # other rows: from DFLASH_Q6K_WGMMA_OTHER's 25
        ("q6_K", 1024, 2304, 24, False),
        ("q6_K", 1024, 2304, 25, True),
        ("q6_K", 1024, 2304, 64, True),
        ("q4_K", 1024, 6144, 32, False),  # Q4_K: ffn_down's rows only (64 super-blocks or more)
        ("q4_K", 256, 16384, 32, True),
    ],
)
def test_cuda_f16_wgmma_takes_its_shapes(
    wtype: str, rows: int, k: int, n: int, taken: bool, mma_restored: None, f16_shapes_restored: None
) -> None:
    """Which products the f16 wgmma GEMM takes, with DFLASH_Q6K_WGMMA=9, DFLASH_Q4K_F16=9, the
    output matrix's floor of 17 columns and Q6_K's other matrices' of 25: counted launches on an
    sm_90a build on sm_90, none elsewhere."""
    _core.set_mma_enabled(True)
    _core.set_q6k_wgmma_from(9)
    _core.set_q4k_f16_from(9)
    _core.set_q6k_output_from(17)
    _core.set_q6k_other_from(25)
    _core.set_q4k_f16_tall_from(0)
    w, _ = _weights(wtype, rows, k, seed=58)
    x = np.random.default_rng(59).standard_normal((n, k)).astype(np.float32)
    before = _core.f16_wgmma_launches()
    _core.op_mul_mat(w, wtype, rows, x, tiles=True, gpu=True)
    ran = _core.wgmma_built() and _gpu_is_sm90()
    assert _core.f16_wgmma_launches() - before == (1 if taken and ran else 0)


@needs_gpu
@pytest.mark.parametrize(
    ("rows", "n", "taken"),
    [(16384, 48, True), (16384, 32, False), (16320, 48, False)],
)
def test_cuda_q4k_f16_tall_takes_tall_matrices(
    rows: int, n: int, taken: bool, mma_restored: None, f16_shapes_restored: None
) -> None:
    """DFLASH_Q4K_F16_TALL=33: Q4_K matrices of 16384 rows or more (the 27B's [gate; up] and
    [gdn q; k; v; z]) take the f16 wgmma GEMM from 33 columns, whatever DFLASH_Q4K_F16 says (off
    here); fewer rows or columns stay on the int8 forms. Counted launches on an sm_90a build on
    sm_90, none elsewhere; within 2e-3 of numpy's float64 product when taken."""
    _core.set_mma_enabled(True)
    _core.set_q4k_f16_from(0)
    _core.set_q4k_f16_tall_from(33)
    k = 512
    w, dense = _weights("q4_K", rows, k, seed=60)
    x = np.random.default_rng(61).standard_normal((n, k)).astype(np.float32)
    before = _core.f16_wgmma_launches()
    got = _core.op_mul_mat(w, "q4_K", rows, x, tiles=True, gpu=True)
    ran = taken and _core.wgmma_built() and _gpu_is_sm90()
    assert _core.f16_wgmma_launches() - before == int(ran)
    want = x.astype(np.float64) @ dense.T.astype(np.float64)
    assert np.abs(got - want).max() <= (2e-3 if ran else 3e-2) * float(np.abs(want).max())


_F16_SWITCH = {
    "q6_K": (_core.q6k_wgmma_from_columns, _core.set_q6k_wgmma_from),
    "q4_K": (_core.q4k_f16_from_columns, _core.set_q4k_f16_from),
}


@needs_gpu
@pytest.mark.parametrize("wtype", ["q6_K", "q4_K"])
@pytest.mark.parametrize(("rows", "k"), [(5120, 17408), (1000, 2304), (31040, 5120)])
@pytest.mark.parametrize("n", [9, 16, 33, 64, 100])
def test_cuda_f16_wgmma_gemm_is_the_f16_product(
    wtype: str, rows: int, k: int, n: int, mma_restored: None, f16_wgmma_restored: None
) -> None:
    """Q6_K / Q4_K through the f16 wgmma GEMM (weights half(half(d sc) (q - 32)), half(half(d sc) q +
    half(-dmin m)); activations f16, f32 sums; 1000 rows: a last tile 40 short; 5120 x 17408: the
    27B's ffn_down, split along K): a launch of each 64 or fewer columns counted (100: 64 and 36) on
    an sm_90a build on sm_90, and within 2e-3 of numpy's float64 product, which the int8 GEMMs
    (their activations in 8 bits) are not held to (3e-2 elsewhere)."""
    _core.set_mma_enabled(True)
    w, dense = _weights(wtype, rows, k, seed=51)
    x = np.random.default_rng(52).standard_normal((n, k)).astype(np.float32)
    ref, got, launches = _a_b(
        _F16_SWITCH[wtype],
        (0, 2),
        lambda: _core.op_mul_mat(w, wtype, rows, x, tiles=True, gpu=True),
        _core.f16_wgmma_launches,
    )
    ran = _core.wgmma_built() and _gpu_is_sm90()
    assert launches == ((2 if n > 64 else 1) if ran else 0)
    want = x.astype(np.float64) @ dense.T.astype(np.float64)
    scale = float(np.abs(want).max())
    assert np.abs(got - want).max() <= (2e-3 if ran else 3e-2) * scale
    assert np.abs(ref - want).max() <= 3e-2 * scale


@needs_gpu
@pytest.mark.parametrize("wtype", ["q6_K", "q4_K"])
@pytest.mark.parametrize(("rows", "k"), [(5120, 17408), (1000, 2304), (31040, 5120)])
@pytest.mark.parametrize("n", [9, 32, 33, 64, 100])
@pytest.mark.parametrize("residual", [False, True])
def test_cuda_f16_wgmma_warp_specialized_gives_the_same_bits(
    wtype: str, rows: int, k: int, n: int, residual: bool, mma_restored: None, f16_wgmma_restored: None
) -> None:
    """DFLASH_F16_WS=1: the f16 wgmma GEMM's warp-specialized form, one consumer warpgroup up to 32
    columns and two above, each output's wgmmas in the f16 form's order: its bits, with the
    residual fused or not, wherever both split a matrix alike (the tail split each launch reports).
    Each form plans its split by its own blocks a multiprocessor, and these differ for some shapes
    (session 41, H100: Q4_K at 32 columns, its smaller stages fit more f16-form blocks), so there
    the outputs are held to float rounding (1e-5 of the scale). Each launch counted (100: 64 and
    36) on an sm_90a build on sm_90."""
    _core.set_mma_enabled(True)
    _F16_SWITCH[wtype][1](2)
    w, _ = _weights(wtype, rows, k, seed=55)
    x = np.random.default_rng(56).standard_normal((n, k)).astype(np.float32)
    res = np.random.default_rng(57).standard_normal((n, rows)).astype(np.float32)
    splits: list[tuple[int, int, int]] = []

    def product() -> np.ndarray:
        if residual:
            out = _core.op_mul_mat_fused(w, wtype, rows, x, residual=res, gpu=True)
        else:
            out = _core.op_mul_mat(w, wtype, rows, x, tiles=True, gpu=True)
        splits.append(tuple(_core.f16_wgmma_last_split()))
        return out

    ref, got, launches = _a_b(
        (_core.f16_ws_enabled, _core.set_f16_ws_enabled), (False, True), product, _core.f16_ws_launches
    )
    ran = _core.wgmma_built() and _gpu_is_sm90()
    assert launches == ((2 if n > 64 else 1) if ran else 0)
    if splits[0] == splits[1]:
        np.testing.assert_array_equal(got, ref)
    else:
        assert np.abs(got - ref).max() <= 1e-5 * float(np.abs(ref).max())


@needs_gpu
@pytest.mark.parametrize("wtype", ["q6_K", "q4_K"])
@pytest.mark.parametrize("n", [16, 48])
def test_cuda_f16_wgmma_gemm_adds_the_residual(
    wtype: str, n: int, mma_restored: None, f16_wgmma_restored: None
) -> None:
    """The fused residual add in the f16 wgmma GEMM: its output plus the residual, one float
    addition, bit for bit what the add node gives (the fusion counted)."""
    rows = 1000
    w, x, res = _residual_inputs(wtype, n, rows, seed=53)
    _core.set_mma_enabled(True)
    _core.set_fuse_add_enabled(True)
    _F16_SWITCH[wtype][1](2)
    want = _core.op_mul_mat(w, wtype, rows, x, tiles=True, gpu=True) + res
    before = _core.mul_mat_add_fusions()
    got = _core.op_mul_mat_fused(w, wtype, rows, x, residual=res, gpu=True)
    assert _core.mul_mat_add_fusions() - before == 1
    np.testing.assert_array_equal(got, want)


@needs_gpu
def test_cuda_f16_wgmma_engine_logits_stay_close(synth_model, f16_wgmma_restored: None) -> None:
    """The engine's forwards (a q4_K_M model: its Q6_K and Q4_K products, alone, in a norm's pair,
    after a SwiGLU, with a residual) with the f16 wgmma GEMM against the int8 ones: launches counted
    on sm_90, and logits alike, not equal: the f16 activations are another rounding, which this
    small random model amplifies (on the H100 the largest difference was 25% of the largest logit,
    4.55 of 18.2; the products themselves are held to 2e-3 of float64 above), so within 40% of the
    scale and 20% in the mean."""
    path = str(synth_model("small", "q4_K_M"))
    _core.set_q6k_wgmma_from(0)
    _core.set_q4k_f16_from(0)
    plain = _engine_logits(path, 11)
    _core.set_q6k_wgmma_from(2)
    _core.set_q4k_f16_from(2)
    before = _core.f16_wgmma_launches()
    got = _engine_logits(path, 11)
    assert (_core.f16_wgmma_launches() > before) == (_core.wgmma_built() and _gpu_is_sm90())
    scale = float(np.abs(plain).max())
    assert np.isfinite(got).all()
    assert np.abs(got - plain).max() <= 0.4 * scale
    assert np.abs(got - plain).mean() <= 0.2 * float(np.abs(plain).mean())
