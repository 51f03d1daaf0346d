"""Fusions whose work the tensor-core GEMM's activation quantizer takes over, besides the
SwiGLU and the single RMSNorm (test_gemv_kquant.py): a norm read by two tagged matmuls right
after it (one quantizer launch for both products, both types' layouts; rms_norm_fusion.cu), the
delta rule's gated output, silu(z) * (rms_norm(o per head) * w), read by ssm_out's quantizer
(rms_norm_fusion.cu), and the attention's sigmoid output gate read in place by o_proj's quantizer
(glu_fusion.cu), and one activation launch for a norm's pair of products in two forms
(gemm_kquant_mma.cu). All are on by default (=0 of DFLASH_FUSE_RMS_NORM_PAIR, DFLASH_FUSE_HEAD_NORM,
DFLASH_FUSE_SIGMOID_GATE or DFLASH_FUSE_PAIR_ACT turns one off). Oracles: numpy for the graphs the ops build
(any backend: the CPU in CI); the engine's own graphs hold each form where it is meant to apply;
on CUDA the unfused graph's outputs bit for bit (the same float operations), and the engine's
logits unchanged (test_gemv_kquant.py's test_cuda_fusion_changes_no_logit_of_the_engine). The
quantizer's bytes and the GEMM's entry points for every form are also checked on the CPU
emulator in CI (tests/test_cuda_emu.py)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from test_gemv_kquant import GPU, _fused_equals_plain, _normed_inputs, mma_restored, needs_gpu  # noqa: F401
from test_mul_mat_invariant import _weights

from dflash import _core

SWITCHES = ("rms_norm", "rms_norm_pair", "head_norm", "sigmoid_gate", "rms_norm_gemv", "pair_act")


@pytest.fixture
def fusions_restored() -> Iterator[None]:
    was = {name: getattr(_core, f"fuse_{name}_enabled")() for name in SWITCHES}
    yield
    for name, on in was.items():
        getattr(_core, f"set_fuse_{name}_enabled")(on)


def test_the_quantizer_fusions_are_on_unless_turned_off() -> None:
    assert _core.fuse_rms_norm_pair_enabled() == (GPU and os.environ.get("DFLASH_FUSE_RMS_NORM_PAIR") != "0")
    assert _core.fuse_head_norm_enabled() == (GPU and os.environ.get("DFLASH_FUSE_HEAD_NORM") != "0")
    assert _core.fuse_sigmoid_gate_enabled() == (GPU and os.environ.get("DFLASH_FUSE_SIGMOID_GATE") != "0")
    assert _core.fuse_pair_act_enabled() == (GPU and os.environ.get("DFLASH_FUSE_PAIR_ACT") != "0")


def _gate_heads(qg: np.ndarray, k: int, hd: int) -> np.ndarray:
    """The gate heads of [q; gate] rows (head h at hd + 2 hd h), [n, k] in float64."""
    n = qg.shape[0]
    return qg[:, : 2 * k].reshape(n, k // hd, 2, hd)[:, :, 1, :].reshape(n, k).astype(np.float64)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _gated_norm_inputs(
    n: int, heads: int, S: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """o (magnitudes far apart: the sum of squares' order shows in its bits), z [n, heads * S], a
    norm weight [S], and silu(z) * (rms_norm(o per head) * w) in float64."""
    rng = np.random.default_rng(seed)
    o = (rng.standard_normal((n, heads * S)) * np.exp2(rng.uniform(-6, 6, (n, heads * S)))).astype(np.float32)
    z = rng.standard_normal((n, heads * S)).astype(np.float32)
    w = (1.0 + 0.25 * rng.standard_normal(S)).astype(np.float32)
    o64 = o.astype(np.float64).reshape(n, heads, S)
    normed = o64 / np.sqrt((o64**2).mean(axis=2, keepdims=True) + 1e-6) * w
    return o, z, w, _silu(z.astype(np.float64)) * normed.reshape(n, heads * S)


def _expected_forms(eng: _core.TargetEngine) -> dict[str, int]:
    """Each fusion form a verify graph should hold, from the loaded layers: a layer's input norm
    feeds its input products (one a stack of projections the loader placed back to back, one each
    projection left apart) and its FFN norm [gate; up] (one stacked product, or two): one product
    is the single form, two the pair; the output norm feeds the LM head (single); a Gated DeltaNet
    layer has one per-head output norm (head), an attention layer one sigmoid output gate (gate);
    an FFN's two products are read by its SwiGLU right after them (glu, among the pairs)."""
    forms = {"single": 1, "pair": 0, "head": 0, "gate": 0, "glu": 0}
    for inputs, ffn, gdn in eng.layer_products:
        for products in (inputs, ffn):
            forms["single"] += products == 1
            forms["pair"] += products == 2
        forms["glu"] += ffn == 2
        forms["head"] += gdn
        forms["gate"] += not gdn
    return forms


@pytest.mark.parametrize("preset,weight_type", [("small", "q4_K_M"), ("tiny-b", "q4_K_M"), ("small", "q8_0")])
def test_the_engines_verify_graph_holds_each_fusion_form(synth_model, preset: str, weight_type: str) -> None:
    """The forward graph a CUDA engine builds for a 16-token verify (built on this backend, not
    run): every norm in the form rms_norm_fusion.cu expects, its products right after it
    (qwen35_graph.cpp's project()), and every attention layer's sigmoid gate in glu_fusion.cu's.
    A Q4_K_M file has layers with two input products (its Q6_K attn_qkv / attn_v beside Q4_K); a
    Q8_0 one has none."""
    path = str(synth_model(preset, weight_type))
    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.n_threads, cfg.n_gpu_layers = 256, 2, 0
    eng = _core.TargetEngine(path, cfg)
    want = _expected_forms(eng)
    assert eng.fusion_patterns(16, verify=True) == want
    # a forward's LM head reads the last row of the output norm: that norm is in no form
    assert eng.fusion_patterns(16) == {**want, "single": want["single"] - 1}
    # a decode step keeps every FFN's gate and up apart, both read by the SwiGLU right after them:
    # the pair the one-column fusion runs as one gated GEMV from the norm's quantizer
    decode = eng.fusion_patterns(1)
    assert decode["glu"] == len(eng.layer_products) and decode["pair"] >= decode["glu"]
    assert want["head"] > 0 and want["gate"] > 0
    if weight_type == "q4_K_M":
        assert want["pair"] > 0
    else:
        assert want["pair"] == 0


@pytest.mark.parametrize("n", [1, 3])
def test_gated_norm_product_is_the_product_of_the_gated_norm(n: int) -> None:
    """w @ (silu(z) * rms_norm(o per head) * weight) (+ residual) against numpy, on whatever backend
    this build has (CPU in CI): the graph the head-norm fusion takes."""
    rows, heads, S = 96, 4, 64
    w, dense = _weights("q4_K", rows, heads * S, seed=61)
    o, z, weight, gated = _gated_norm_inputs(n, heads, S, 62)
    res = np.random.default_rng(63).standard_normal((n, rows)).astype(np.float32)
    got = _core.op_gated_norm_mul_mat(w, "q4_K", rows, o, z, weight, residual=res)
    want = gated @ dense.T.astype(np.float64)
    assert got.shape == (n, rows)
    assert np.abs(got - res - want).max() <= 3e-2 * np.abs(want).max()


def test_a_gated_norm_weight_that_does_not_divide_the_rows_is_refused() -> None:
    w, _ = _weights("q4_K", 32, 256, seed=64)
    o = np.ones((2, 256), np.float32)
    with pytest.raises(_core.InvalidParameterError, match="norm \\[S\\]"):
        _core.op_gated_norm_mul_mat(w, "q4_K", 32, o, o, np.ones(96, np.float32))


@pytest.mark.parametrize("gate_type", ["q4_K", "q6_K"])
def test_normed_pair_of_products_is_their_product(gate_type: str) -> None:
    """swiglu(gate @ x', w @ x'), x' = rms_norm(x) * weight read by both products (the pair's
    graph; the gate of another type: two activation layouts on CUDA) against numpy."""
    rows, k, n = 96, 512, 3
    w, dense = _weights("q4_K", rows, k, seed=65)
    g, gate_dense = _weights(gate_type, rows, k, seed=66)
    x, weight, normed = _normed_inputs(n, k, 67)
    got = _core.op_mul_mat_fused(w, "q4_K", rows, x, gate=g, gate_type=gate_type, norm=weight)
    a = normed @ gate_dense.T.astype(np.float64)
    want = _silu(a) * (normed @ dense.T.astype(np.float64))
    assert np.abs(got - want).max() <= 5e-2 * np.abs(want).max()


def _gated_product_cases(test: Callable[..., None]) -> Callable[..., None]:
    """The CUDA cases of a gated output read by the product's quantizer: Q4_K, Q6_K and Q8_0 weights,
    1..100 columns (1 keeps the unfused nodes, 100 runs launches of 64 and 36), with and without the
    residual add; the switches put back after each."""
    for mark in (
        pytest.mark.parametrize("residual", [False, True]),
        pytest.mark.parametrize("n", [1, 2, 16, 33, 64, 100]),
        pytest.mark.parametrize("wtype", ["q4_K", "q6_K", "q8_0"]),
        pytest.mark.usefixtures("fusions_restored", "mma_restored"),
        needs_gpu,
    ):
        test = mark(test)
    return test


@needs_gpu
@pytest.mark.usefixtures("fusions_restored", "mma_restored")
@pytest.mark.parametrize("types", [("q4_K", "q6_K"), ("q6_K", "q4_K"), ("q4_K", "q4_K"), ("q5_K", "q6_K")])
@pytest.mark.parametrize("n", [1, 2, 16, 33, 64, 100])
def test_cuda_norm_read_by_two_products_gives_the_unfused_bits(types: tuple[str, str], n: int) -> None:
    """A norm read by two tagged products of 2..64 columns: one fusion counted (one quantizer for
    both), and the outputs are the unfused graph's (ggml's norm kernel, a quantizer each) bit for
    bit; one column (the GEMV) and more than 64 keep the norm node."""
    rows, k = 1000, 2304
    w, _ = _weights(types[0], rows, k, seed=71)
    g, _ = _weights(types[1], rows, k, seed=72)
    x, weight, _ = _normed_inputs(n, k, 73)
    _core.set_fuse_rms_norm_enabled(True)

    def run() -> np.ndarray:
        return _core.op_mul_mat_fused(w, types[0], rows, x, gate=g, gate_type=types[1], norm=weight, gpu=True)

    _fused_equals_plain("rms_norm_pair", run, 2 <= n <= 64, f"{types}, {n} columns")


@needs_gpu
@pytest.mark.usefixtures("fusions_restored", "mma_restored")
@pytest.mark.parametrize("types", [("q4_K", "q6_K"), ("q6_K", "q4_K"), ("q5_K", "q6_K"), ("q4_K", "q4_K")])
@pytest.mark.parametrize("n", [2, 16, 17, 33, 64, 100])
def test_cuda_pair_with_an_f16_product_takes_both_activation_forms_from_one_launch(
    types: tuple[str, str], n: int
) -> None:
    """DFLASH_FUSE_PAIR_ACT: a norm read by a Q6_K product in the f16 wgmma form (every Q6_K matrix
    asked into it here) and a Q4_K / Q5_K one in an int8 form: both activation forms from one launch
    (gemm_kq::quantize_act_and_f16), counted where the f16 form runs (from 9 columns up to 64 on an
    sm_90a build on Hopper), and the bits of the two launches it replaces; a pair of one form keeps
    them."""
    rows, k = 1000, 2304
    w, _ = _weights(types[0], rows, k, seed=77)
    g, _ = _weights(types[1], rows, k, seed=78)
    x, weight, _ = _normed_inputs(n, k, 79)
    _core.set_fuse_rms_norm_enabled(True)
    _core.set_fuse_rms_norm_pair_enabled(True)

    def run() -> np.ndarray:
        return _core.op_mul_mat_fused(w, types[0], rows, x, gate=g, gate_type=types[1], norm=weight, gpu=True)

    was_all, was_on = _core.f16_wgmma_all(), _core.fuse_pair_act_enabled()
    _core.set_f16_wgmma_all(True)
    try:
        _core.set_fuse_pair_act_enabled(False)
        f16_before = _core.f16_wgmma_launches()
        run()
        one_f16 = _core.f16_wgmma_launches() - f16_before == 1  # one of the pair (up to 64 columns: a launch)
        _fused_equals_plain("pair_act", run, one_f16 and n <= 64, f"{types}, {n} columns")
    finally:
        _core.set_f16_wgmma_all(was_all)
        _core.set_fuse_pair_act_enabled(was_on)


@needs_gpu
@pytest.mark.usefixtures("fusions_restored", "mma_restored")
@pytest.mark.parametrize("types", [("q4_K", "q6_K"), ("q6_K", "q4_K"), ("q4_K", "q4_K")])
@pytest.mark.parametrize("k", [512, 2048])  # even super-blocks: Q6_K rows the GEMV takes
def test_cuda_one_column_norm_before_a_swiglu_feeds_the_gated_gemv(types: tuple[str, str], k: int) -> None:
    """With DFLASH_FUSE_RMS_NORM_GEMV on, a norm read by the gate and up products of a SwiGLU at one
    column (the FFN of a decode step): the gated GEMV that ggml-cuda's {mul_mat, mul_mat, glu}
    fusion reaches runs from the norm's quantizer (rms_norm_fusion.cu's fuse_gemv_glu), one fusion
    counted, the same bits; gate and up of two types (which that GEMV does not take) keep the norm
    node. The pairs no GLU reads (a GDN layer's input products) take one quantizer launch for both:
    the engine's logits with the fusion on are its logits without (test_gemv_kquant.py's
    test_cuda_fusion_changes_no_logit_of_the_engine[rms_norm_gemv]). A residual add after the GLU
    holds the node count: a fusion that skipped one node too many would leave that add unrun."""
    rows = 1000
    w, _ = _weights(types[0], rows, k, seed=74)
    g, _ = _weights(types[1], rows, k, seed=75)
    x, weight, _ = _normed_inputs(1, k, 76)
    res = np.random.default_rng(77).standard_normal((1, rows)).astype(np.float32)
    _core.set_fuse_rms_norm_enabled(True)
    _core.set_fuse_rms_norm_pair_enabled(True)

    def run() -> np.ndarray:
        return _core.op_mul_mat_fused(
            w, types[0], rows, x, gate=g, gate_type=types[1], residual=res, norm=weight, gpu=True
        )

    _fused_equals_plain("rms_norm_gemv", run, types[0] == types[1], f"{types}, k {k}")


@_gated_product_cases
@pytest.mark.parametrize("S", [64, 128])
def test_cuda_head_norm_read_by_the_quantizer_gives_the_unfused_bits(
    wtype: str, n: int, S: int, residual: bool
) -> None:
    """The delta rule's gated output before a tagged product of 2..256 columns: the quantizer
    computes the heads' norms and the SwiGLU (the residual add taken too where the GEMM takes it),
    one fusion counted, and the outputs are the unfused graph's bit for bit; one column keeps
    the norm node."""
    rows, heads = 1000, 48 * 128 // S
    _core.set_mma_q80_enabled(True)
    w, dense = _weights(wtype, rows, heads * S, seed=74)
    o, z, weight, gated = _gated_norm_inputs(n, heads, S, 75)
    res = np.random.default_rng(76).standard_normal((n, rows)).astype(np.float32) if residual else None
    fused = _fused_equals_plain(
        "head_norm",
        lambda: _core.op_gated_norm_mul_mat(w, wtype, rows, o, z, weight, residual=res, gpu=True),
        n >= 2,
        f"{wtype}, {n} columns, heads of {S}",
    )
    want = gated @ dense.T.astype(np.float64)
    got = fused - res if residual else fused
    assert np.abs(got - want).max() <= 3e-2 * np.abs(want).max()


@pytest.mark.parametrize("n", [1, 3])
def test_sigmoid_gated_product_is_the_product_of_the_gated_output(n: int) -> None:
    """w @ (o * sigmoid(gate)) (+ residual), the gate's heads between the query heads of one
    product's rows, against numpy, on whatever backend this build has (CPU in CI): the graph the
    sigmoid-gate fusion takes."""
    rows, hd, k = 96, 64, 256
    w, dense = _weights("q4_K", rows, k, seed=91)
    rng = np.random.default_rng(92)
    o = rng.standard_normal((n, k)).astype(np.float32)
    qg = (2 * rng.standard_normal((n, 2 * k + 32))).astype(np.float32)
    res = rng.standard_normal((n, rows)).astype(np.float32)
    got = _core.op_sigmoid_gate_mul_mat(w, "q4_K", rows, o, qg, hd, residual=res)
    want = (o.astype(np.float64) / (1.0 + np.exp(-_gate_heads(qg, k, hd)))) @ dense.T.astype(np.float64)
    assert np.abs(got - res - want).max() <= 3e-2 * np.abs(want).max()


@_gated_product_cases
@pytest.mark.parametrize("hd", [128, 256])
def test_cuda_sigmoid_gate_read_in_place_gives_the_unfused_bits(
    wtype: str, n: int, hd: int, residual: bool
) -> None:
    """The attention's gated output before a tagged product of 2..256 columns: the quantizer reads
    the gate in place and computes o * sigmoid(gate) (the residual add taken too where the GEMM
    takes it), one fusion counted, and the outputs are the unfused graph's (the gate's copy, ggml's
    fused sigmoid and multiply) bit for bit; one column keeps the nodes."""
    rows, k = 1000, 6144
    _core.set_mma_q80_enabled(True)
    w, dense = _weights(wtype, rows, k, seed=93)
    rng = np.random.default_rng(94)
    o = rng.standard_normal((n, k)).astype(np.float32)
    qg = (2 * rng.standard_normal((n, 2 * k + 1024))).astype(np.float32)
    res = rng.standard_normal((n, rows)).astype(np.float32) if residual else None
    fused = _fused_equals_plain(
        "sigmoid_gate",
        lambda: _core.op_sigmoid_gate_mul_mat(w, wtype, rows, o, qg, hd, residual=res, gpu=True),
        n >= 2,
        f"{wtype}, {n} columns, heads of {hd}",
    )
    gate = _gate_heads(qg, k, hd)
    want = (o.astype(np.float64) / (1.0 + np.exp(-gate))) @ dense.T.astype(np.float64)
    got = fused - res if residual else fused
    assert np.abs(got - want).max() <= 3e-2 * np.abs(want).max()
