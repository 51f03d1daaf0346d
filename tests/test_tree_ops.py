"""ggml_ext tree ops (GGML_OP_TREE_SSM_CONV, GGML_OP_TREE_GATED_DELTA_NET): every node's output
equals a numpy reference that runs the node's whole root-to-node path as a plain sequence, on
random trees (hypothesis); CPU vs CUDA on the GPU machine.

Tolerances: the CPU conv sums in the same order as the reference, so 1e-6; the delta rule
accumulates in a different order (SIMD dot products), so 2e-5 relative to the output scale.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dflash import _core

MAX_DEPTH = 32  # ggml_ext::kTreeMaxDepth


def path_to(parents: list[int], i: int) -> list[int]:
    path = []
    while i >= 0:
        path.append(i)
        i = parents[i]
    return path[::-1]


def ref_conv(x: np.ndarray, conv_state: np.ndarray, w: np.ndarray, parents: list[int]) -> np.ndarray:
    n, _ = x.shape
    k = w.shape[1]
    out = np.zeros_like(x)
    for i in range(n):
        seq = np.concatenate([conv_state.T, x[path_to(parents, i)]], axis=0)  # [time, C]
        out[i] = (seq[-k:].T * w).sum(axis=1)
    return out


def ref_gdn(q, k, v, g, beta, state, parents):  # noqa: ANN001, ANN201
    n, hv, s = v.shape
    hk = q.shape[1]
    out = np.zeros((n, hv, s), np.float64)
    for i in range(n):
        for h in range(hv):
            m = state[h].T.astype(np.float64)  # S[i][j]
            for t in path_to(parents, i):
                kk, qq = k[t, h % hk].astype(np.float64), q[t, h % hk].astype(np.float64)
                m = m * np.exp(g[t, h, 0])
                delta = (v[t, h] - m.T @ kk) * beta[t, h, 0]
                m = m + np.outer(kk, delta)
                o = m.T @ qq
            out[i, h] = o / np.sqrt(s)
    return out


@st.composite
def trees(draw, max_nodes: int = 24):  # noqa: ANN001, ANN201
    n = draw(st.integers(1, max_nodes))
    parents = [-1]
    depth = [0]
    for i in range(1, n):
        # mostly one root (the anchor); sometimes a forest
        p = draw(st.integers(-1 if draw(st.booleans()) and i % 7 == 0 else 0, i - 1))
        if p >= 0 and depth[p] >= MAX_DEPTH:
            p = 0
        parents.append(p)
        depth.append(0 if p < 0 else depth[p] + 1)
    return parents


def conv_inputs(rng: np.random.Generator, n: int, c: int = 24, k: int = 4):  # noqa: ANN201
    x = rng.standard_normal((n, c)).astype(np.float32)
    cs = rng.standard_normal((c, k - 1)).astype(np.float32)
    w = rng.standard_normal((c, k)).astype(np.float32)
    return x, cs, w


def gdn_inputs(rng: np.random.Generator, n: int, s: int = 16, hk: int = 2, hv: int = 4):  # noqa: ANN201
    def unit(*shape: int) -> np.ndarray:
        a = rng.standard_normal(shape)
        return (a / np.linalg.norm(a, axis=-1, keepdims=True)).astype(np.float32)

    q, k = unit(n, hk, s), unit(n, hk, s)
    v = rng.standard_normal((n, hv, s)).astype(np.float32)
    g = (-np.abs(rng.standard_normal((n, hv, 1))) * 0.5).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (n, hv, 1)).astype(np.float32)
    state = (rng.standard_normal((hv, s, s)) * 0.3).astype(np.float32)
    return q, k, v, g, beta, state


@settings(max_examples=40, deadline=None)
@given(parents=trees(), seed=st.integers(0, 2**31 - 1))
def test_tree_conv_matches_per_path_reference(parents: list[int], seed: int) -> None:
    x, cs, w = conv_inputs(np.random.default_rng(seed), len(parents))
    got = _core.op_tree_ssm_conv(x, cs, w, parents)
    np.testing.assert_allclose(got, ref_conv(x, cs, w, parents), rtol=1e-6, atol=1e-6)


@settings(max_examples=40, deadline=None)
@given(parents=trees(), seed=st.integers(0, 2**31 - 1))
def test_tree_delta_rule_matches_per_path_reference(parents: list[int], seed: int) -> None:
    args = gdn_inputs(np.random.default_rng(seed), len(parents))
    got = _core.op_tree_gated_delta_net(*args, parents)
    ref = ref_gdn(*args, parents)
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5 * max(1.0, float(np.abs(ref).max())))


def test_deep_chain_and_wide_star() -> None:
    rng = np.random.default_rng(1)
    for parents in ([-1, *range(MAX_DEPTH)], [-1] + [0] * 40):
        args = gdn_inputs(rng, len(parents), s=32, hk=1, hv=2)
        ref = ref_gdn(*args, parents)
        got = _core.op_tree_gated_delta_net(*args, parents)
        np.testing.assert_allclose(got, ref, rtol=0, atol=2e-5 * max(1.0, float(np.abs(ref).max())))


def test_bad_trees_are_refused() -> None:
    args = gdn_inputs(np.random.default_rng(0), 3)
    for parents in ([-1, 1, 0], [-1, 0, 5], [-1, -2, 0]):
        with pytest.raises(_core.InvalidParameterError, match="parent"):
            _core.op_tree_gated_delta_net(*args, parents)
    deep = [-1, *range(MAX_DEPTH + 1)]
    with pytest.raises(_core.InvalidParameterError, match="depth"):
        _core.op_tree_gated_delta_net(*gdn_inputs(np.random.default_rng(0), len(deep)), deep)


GPU = _core.gpu_backend_available()
REQUIRE_GPU = os.environ.get("DFLASH_REQUIRE_CUDA") == "1"


@pytest.mark.skipif(
    not GPU and not REQUIRE_GPU, reason="no GPU backend in this build (run on the GPU machine)"
)
@pytest.mark.parametrize("s", [16, 32, 64, 128])
def test_cuda_matches_cpu(s: int) -> None:
    rng = np.random.default_rng(s)
    for parents in (
        [-1, *range(15)],
        [-1, 0, 0, 1, 1, 2, 5, 5, 6, 3, 9, 10],
        [-1] + [0] * 30,
        [-1, 0, -1, 2, 1],
    ):
        n = len(parents)
        args = gdn_inputs(rng, n, s=s, hk=2, hv=6)
        cpu = _core.op_tree_gated_delta_net(*args, parents)
        gpu = _core.op_tree_gated_delta_net(*args, parents, gpu=True)
        np.testing.assert_allclose(gpu, cpu, rtol=0, atol=1e-5 * max(1.0, float(np.abs(cpu).max())))
        x, cs, w = conv_inputs(rng, n, c=3 * s)
        np.testing.assert_allclose(
            _core.op_tree_ssm_conv(x, cs, w, parents, gpu=True),
            _core.op_tree_ssm_conv(x, cs, w, parents),
            atol=1e-5,
        )
