"""ggml_ext's fused Gated DeltaNet inputs (GGML_OP_GDN_DECODE_INPUTS, ggml_ext_gdn.h), one token:
the conv over [cached state, token] with SiLU, the q/k head L2 norms, the gate and beta, and the
conv state advanced in place. Oracles: a numpy reference of the unfused graph's formulas (CPU op,
1e-5 of the output scale: float vs double sums), the CPU op for the CUDA kernel (1e-5), and on
the GPU machine the engine's decode with the fusion against the same engine without it, bit for
bit: the CUDA kernel repeats ggml's kernels' operations in their order (ssm_conv + silu, the
rms_norm block reduce + scale, add, softplus * a, sigmoid), so the fusion changes launches, not
values. (The first fused kernel reduced the L2 norm in another order: its decode drifted from
ggml's by up to 0.048 of 17.8 over 16 steps of tiny-b, and a greedy DDTree check at budget 4 then
diverged at token 123 beyond the near-tie bound.) The n-token mode (gdn_verify_inputs: verifies
and short prefills on the GPU) must give each token the one-token op's bits; the engine check
runs its prefill through it."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash import _core

GPU = _core.gpu_backend_available()
REQUIRE_GPU = os.environ.get("DFLASH_REQUIRE_CUDA") == "1"
needs_gpu = pytest.mark.skipif(
    not GPU and not REQUIRE_GPU, reason="no GPU backend in this build (run on the GPU machine)"
)
EPS = 1e-6


def _inputs(s: int, hk: int, hv: int, k: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    c = s * (2 * hk + hv)
    f = np.float32
    return {
        "qkv": rng.standard_normal(c).astype(f),
        "alpha": rng.standard_normal(hv).astype(f) * 4,  # both sides of softplus's threshold at 20 too
        "beta": rng.standard_normal(hv).astype(f),
        "conv_state": rng.standard_normal((c, k - 1)).astype(f),
        "w": rng.standard_normal((c, k)).astype(f) * 0.5,
        "dt_bias": np.where(np.arange(hv) == 0, 25.0, rng.standard_normal(hv)).astype(f),
        "a": -np.abs(rng.standard_normal(hv)).astype(f),
    }


def _reference(i: dict[str, np.ndarray], s: int, hk: int) -> tuple[np.ndarray, np.ndarray]:
    x, st_, w = (i[n].astype(np.float64) for n in ("qkv", "conv_state", "w"))
    conv = (st_ * w[:, :-1]).sum(axis=1) + x * w[:, -1]
    y = conv / (1.0 + np.exp(-conv))
    heads = y.reshape(-1, s)
    for h in range(2 * hk):  # rms_norm with eps / S, then times 1 / sqrt(S)
        heads[h] = heads[h] / np.sqrt((heads[h] ** 2).mean() + EPS / s) / np.sqrt(s)
    z = i["alpha"].astype(np.float64) + i["dt_bias"]
    gate = np.where(z > 20.0, z, np.log1p(np.exp(np.minimum(z, 20.0)))) * i["a"]
    beta = 1.0 / (1.0 + np.exp(-i["beta"].astype(np.float64)))
    state = np.concatenate([i["conv_state"][:, 1:], i["qkv"][:, None]], axis=1)
    return np.concatenate([heads.reshape(-1), gate, beta]), state


def _run(i: dict[str, np.ndarray], s: int, hk: int, gpu: bool) -> tuple[np.ndarray, np.ndarray]:
    return _core.op_gdn_decode_inputs(
        i["qkv"], i["alpha"], i["beta"], i["conv_state"], i["w"], i["dt_bias"], i["a"], s, hk, EPS, gpu=gpu
    )


@settings(max_examples=25, deadline=None)
@given(s=st.sampled_from([32, 64, 128]), hk=st.integers(1, 3), hv_mult=st.integers(1, 3), k=st.integers(2, 5))
def test_cpu_op_equals_the_unfused_formulas(s: int, hk: int, hv_mult: int, k: int) -> None:
    i = _inputs(s, hk, hk * hv_mult, k, seed=s + 10 * hk + 100 * k)
    out, state = _run(i, s, hk, gpu=False)
    want, want_state = _reference(i, s, hk)
    assert np.abs(out - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))
    np.testing.assert_array_equal(state, want_state)  # a shift: exact


def test_bad_shapes_are_refused() -> None:
    i = _inputs(32, 1, 2, 4, seed=1)
    with pytest.raises(_core.InvalidParameterError, match="gdn_decode_inputs"):
        _run(i, 32, 2, gpu=False)  # C != S (2 Hk + Hv)


@needs_gpu
@pytest.mark.parametrize(("s", "hk", "hv", "k"), [(32, 1, 2, 4), (128, 16, 48, 4), (64, 2, 4, 3)])
def test_cuda_op_equals_cpu_op(s: int, hk: int, hv: int, k: int) -> None:
    i = _inputs(s, hk, hv, k, seed=7)
    cpu, cpu_state = _run(i, s, hk, gpu=False)
    gpu, gpu_state = _run(i, s, hk, gpu=True)
    assert np.abs(gpu - cpu).max() <= 1e-5 * max(1.0, float(np.abs(cpu).max()))
    np.testing.assert_array_equal(gpu_state, cpu_state)


def _verify_inputs(s: int, hk: int, hv: int, k: int, n: int, seed: int) -> dict[str, np.ndarray]:
    i = _inputs(s, hk, hv, k, seed)
    rng = np.random.default_rng(seed + 1)
    c, f = s * (2 * hk + hv), np.float32
    i["qkv"] = rng.standard_normal((n, c)).astype(f)
    i["alpha"] = (rng.standard_normal((n, hv)) * 4).astype(f)
    i["beta"] = rng.standard_normal((n, hv)).astype(f)
    return i


def _run_n(i: dict[str, np.ndarray], s: int, hk: int, gpu: bool) -> tuple[np.ndarray, ...]:
    return _core.op_gdn_verify_inputs(
        i["qkv"], i["alpha"], i["beta"], i["conv_state"], i["w"], i["dt_bias"], i["a"], s, hk, EPS, gpu=gpu
    )


def _one_token_steps(i: dict[str, np.ndarray], s: int, hk: int, gpu: bool) -> tuple[np.ndarray, ...]:
    """The n-token op's expectation: the one-token op token after token, its state carried."""
    state, outs = i["conv_state"], []
    c = i["qkv"].shape[1]
    for t in range(i["qkv"].shape[0]):
        one = dict(i, qkv=i["qkv"][t], alpha=i["alpha"][t], beta=i["beta"][t], conv_state=state)
        out, state = _run(one, s, hk, gpu)
        outs.append(out)
    o = np.stack(outs)
    return o[:, :c], o[:, c : c + i["alpha"].shape[1]], o[:, c + i["alpha"].shape[1] :], state


@settings(max_examples=20, deadline=None)
@given(
    s=st.sampled_from([32, 64]),
    hk=st.integers(1, 2),
    hv_mult=st.integers(1, 2),
    k=st.integers(2, 5),
    n=st.integers(1, 7),
)
def test_n_token_cpu_op_equals_one_token_steps(s: int, hk: int, hv_mult: int, k: int, n: int) -> None:
    """ggml_ext::gdn_verify_inputs (a verify's or short prefill's tokens in one op, the conv state
    read only) gives each token the one-token op's values, and the state after the last token
    exactly (a copy); windows shorter and longer than the conv (n < K - 1 and n >= K - 1). To
    1e-6 of the output scale, not bit for bit: the compiler fuses the two CPU loops' steps
    differently on some CPUs (the H200 machine's: 1 ulp). The engine's CPU keeps ggml's ops; the
    CUDA kernels, which the GPU's verifies take, must agree bit for bit (below)."""
    i = _verify_inputs(s, hk, hk * hv_mult, k, n, seed=s + 10 * hk + 100 * k + 1000 * n)
    got, want = _run_n(i, s, hk, gpu=False), _one_token_steps(i, s, hk, gpu=False)
    for g, w in zip(got[:3], want[:3], strict=True):
        assert np.abs(g - w).max() <= 1e-6 * max(1.0, float(np.abs(w).max()))
    np.testing.assert_array_equal(got[3], want[3])


@needs_gpu
@pytest.mark.parametrize(
    ("s", "hk", "hv", "k", "n"), [(32, 1, 2, 4, 2), (128, 16, 48, 4, 16), (64, 2, 4, 3, 33)]
)
def test_n_token_cuda_op_equals_one_token_cuda_steps_and_the_cpu(
    s: int, hk: int, hv: int, k: int, n: int
) -> None:
    """On CUDA too the n-token kernel repeats the one-token kernel's operations (bit for bit), and
    agrees with the CPU op to 1e-5 of the output scale."""
    i = _verify_inputs(s, hk, hv, k, n, seed=11)
    got, want = _run_n(i, s, hk, gpu=True), _one_token_steps(i, s, hk, gpu=True)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    for g, c in zip(got, _run_n(i, s, hk, gpu=False), strict=True):
        assert np.abs(g - c).max() <= 1e-5 * max(1.0, float(np.abs(c).max()))


def _run_tree(
    i: dict[str, np.ndarray], s: int, hk: int, parents: list[int], gpu: bool
) -> tuple[np.ndarray, ...]:
    return _core.op_gdn_verify_inputs(
        i["qkv"],
        i["alpha"],
        i["beta"],
        i["conv_state"],
        i["w"],
        i["dt_bias"],
        i["a"],
        s,
        hk,
        EPS,
        parents=parents,
        gpu=gpu,
    )


@settings(max_examples=15, deadline=None)
@given(k=st.integers(2, 5), n=st.integers(1, 7))
def test_tree_cpu_op_on_a_chain_is_the_chain_op(k: int, n: int) -> None:
    """gdn_tree_inputs (a DDTree verify's nodes, each window along its ancestors as
    ggml_ext::tree_ssm_conv takes it) over a chain-shaped tree gives the chain op's bits."""
    i = _verify_inputs(32, 1, 2, k, n, seed=k + 10 * n)
    tree = _run_tree(i, 32, 1, [-1, *range(n - 1)], gpu=False)
    chain = _run_n(i, 32, 1, gpu=False)
    assert len(tree) == 3
    for t, c in zip(tree, chain[:3], strict=True):
        np.testing.assert_array_equal(t, c)


@st.composite
def _parents(draw, max_nodes: int = 12):  # noqa: ANN001, ANN202
    n = draw(st.integers(1, max_nodes))
    return [-1] + [draw(st.integers(0, i - 1)) for i in range(1, n)]


@settings(max_examples=20, deadline=None)
@given(parents=_parents(), k=st.integers(2, 5), seed=st.integers(0, 2**16))
def test_tree_cpu_op_equals_tree_conv_and_the_formulas(parents: list[int], k: int, seed: int) -> None:
    """gdn_tree_inputs on branching trees against an oracle: ggml_ext's tree conv (itself checked
    per root-to-leaf path in test_tree_ops.py), then the unfused graph's SiLU, L2 norms, gate and
    beta in numpy (float64), to 1e-5 of the output scale."""
    s, hk, hv = 32, 1, 2
    i = _verify_inputs(s, hk, hv, k, len(parents), seed=seed)
    q_k_v, gate, beta = _run_tree(i, s, hk, parents, gpu=False)
    conv = _core.op_tree_ssm_conv(i["qkv"], i["conv_state"], i["w"], parents).astype(np.float64)
    y = conv / (1.0 + np.exp(-conv))
    heads = y.reshape(len(parents), -1, s)
    heads[:, : 2 * hk] /= np.sqrt((heads[:, : 2 * hk] ** 2).mean(axis=2, keepdims=True) + EPS / s) * np.sqrt(
        s
    )
    z = i["alpha"].astype(np.float64) + i["dt_bias"]
    want_gate = np.where(z > 20.0, z, np.log1p(np.exp(np.minimum(z, 20.0)))) * i["a"]
    want_beta = 1.0 / (1.0 + np.exp(-i["beta"].astype(np.float64)))
    for got, want in ((q_k_v, heads.reshape(len(parents), -1)), (gate, want_gate), (beta, want_beta)):
        assert np.abs(got - want).max() <= 1e-5 * max(1.0, float(np.abs(want).max()))


@needs_gpu
def test_tree_cuda_op_equals_the_cpu_and_the_chain_kernel() -> None:
    """On CUDA: a random tree's nodes agree with the CPU op (1e-5 of the scale), and a
    chain-shaped tree gives the chain kernel's bits."""
    parents = [-1, 0, 0, 1, 1, 2, 5, 6, 3, 0, 9, 10, 11, 12, 7, 4]
    i = _verify_inputs(128, 16, 48, 4, len(parents), seed=3)
    for g, c in zip(_run_tree(i, 128, 16, parents, True), _run_tree(i, 128, 16, parents, False), strict=True):
        assert np.abs(g - c).max() <= 1e-5 * max(1.0, float(np.abs(c).max()))
    chain_tree = _run_tree(i, 128, 16, [-1, *range(len(parents) - 1)], True)
    for t, c in zip(chain_tree, _run_n(i, 128, 16, gpu=True)[:3], strict=True):
        np.testing.assert_array_equal(t, c)


@needs_gpu
@pytest.mark.parametrize("tokens", [4, 8, 16])
@pytest.mark.parametrize("tree", [False, True])
def test_cuda_tokens_a_block_give_the_same_bits(tokens: int, tree: bool) -> None:
    """DFLASH_GDN_INPUTS_TOKENS (0 by default: 8 from 48 tokens, else 1): the n-token and tree
    kernels with 4, 8 or 16 tokens a block (a head's weights, and a chain's conv window, read once
    for them) repeat each token's operations: the bits of one token a block (33 tokens: a last block
    short)."""
    want_default = int(os.environ.get("DFLASH_GDN_INPUTS_TOKENS", "0"))
    assert _core.gdn_inputs_tokens() == (want_default if want_default in (1, 4, 8, 16) else 0)
    n = 33
    i = _verify_inputs(128, 16, 48, 4, n, seed=5)
    rng = np.random.default_rng(tokens)
    parents = [-1] + [int(rng.integers(-1, t)) if rng.random() < 0.4 else t - 1 for t in range(1, n)]

    def run() -> tuple[np.ndarray, ...]:
        return _run_tree(i, 128, 16, parents, True) if tree else _run_n(i, 128, 16, gpu=True)

    was = _core.gdn_inputs_tokens()
    try:
        _core.set_gdn_inputs_tokens(1)
        one = run()
        _core.set_gdn_inputs_tokens(tokens)
        many = run()
    finally:
        _core.set_gdn_inputs_tokens(was)
    for a, b in zip(one, many, strict=True):
        np.testing.assert_array_equal(a, b)


def _decode(path: str, fuse: bool) -> tuple[np.ndarray, bool]:
    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.n_threads, cfg.n_gpu_layers = 256, 2, 99
    cfg.fuse_gdn_inputs = fuse
    eng = _core.TargetEngine(path, cfg)
    tokens = np.random.default_rng(5).integers(0, eng.hparams["n_vocab"], size=24).tolist()
    rows = [eng.forward(tokens[:8], True)[0]]
    rows += [eng.forward([t], True)[0] for t in tokens[8:]]
    return np.concatenate(rows), bool(eng.graph_shapes["fused_gdn_inputs"])


def test_the_cpu_keeps_ggml_ops(synth_model) -> None:
    """The fusion is for kernel launches: CPU engines keep ggml's ops (and their arithmetic)."""
    cfg = _core.EngineConfig()
    cfg.n_ctx, cfg.n_gpu_layers = 64, 0
    eng = _core.TargetEngine(str(synth_model("tiny-b", "f16")), cfg)
    assert eng.graph_shapes["fused_gdn_inputs"] is False


@needs_gpu
@pytest.mark.parametrize(("preset", "wtype"), [("tiny-c", "f16"), ("tiny-c", "q4_K_M")])
def test_cuda_decode_with_the_fused_op_matches_ggml_ops(synth_model, preset: str, wtype: str) -> None:
    """tiny-c's GDN heads (64 values) are whole warps: the fused op runs, and ggml's ops run on the
    GPU too. Not tiny-b: ggml's CUDA ssm_conv takes only channel counts that are multiples of 128
    (supports_op), so tiny-b's 320 channels run ggml's conv and SiLU on the CPU, whose expf rounds
    otherwise (seen on the H200 in sessions 6 and 8: 2/3 of its logits differed by up to 1e-3
    relative). Real models have 128 * k channels (the 27B: 10240)."""
    path = str(synth_model(preset, wtype))
    fused, used = _decode(path, True)
    plain, unused = _decode(path, False)
    assert used and not unused
    np.testing.assert_array_equal(fused, plain)
