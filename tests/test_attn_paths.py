"""ggml_ext::attn_paths, the batch-invariant mode's attention (ggml_ext_attn.h): each query's softmax
attention over its own cache rows (the prefix 0..P-1, then its path), against a numpy reference
(CPU; CUDA on the GPU machine), and the property the mode rests on: a query's output depends only
on the rows it sees, not on the other queries, the batch or where its rows lie in the cache."""

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
KV_TYPES = ["f32", "f16", "bf16"]


def _round(x: np.ndarray, kv_type: str) -> np.ndarray:
    """K/V as the op stores them."""
    if kv_type == "f16":
        return x.astype(np.float16).astype(np.float32)
    if kv_type == "bf16":  # round to nearest even on the top 16 bits
        b = x.astype(np.float32).view(np.uint32)
        b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
        return b.view(np.float32)
    return x


def _paths(specs: list[tuple[int, list[int]]]) -> np.ndarray:
    """[n, W]: each query's (P, L, rows...)."""
    width = max(len(r) for _, r in specs) + 2
    out = np.zeros((len(specs), width), np.int32)
    for i, (p, rows) in enumerate(specs):
        out[i, : len(rows) + 2] = [p, len(rows), *rows]
    return out


def _reference(q, k, v, paths, scale):
    n, h, _ = q.shape
    gqa = h // k.shape[1]
    out = np.zeros(q.shape, np.float64)
    for i in range(n):
        p, ln = int(paths[i, 0]), int(paths[i, 1])
        rows = list(range(p)) + paths[i, 2 : 2 + ln].tolist()
        for hh in range(h):
            kk = k[rows, hh // gqa].astype(np.float64)
            s = kk @ q[i, hh].astype(np.float64) * scale
            w = np.exp(s - s.max())
            out[i, hh] = (w / w.sum()) @ v[rows, hh // gqa].astype(np.float64)
    return out


def _inputs(rng, n_rows, n, h, hkv, d):
    q = rng.standard_normal((n, h, d)).astype(np.float32)
    k = rng.standard_normal((n_rows, hkv, d)).astype(np.float32)
    v = rng.standard_normal((n_rows, hkv, d)).astype(np.float32)
    return q, k, v


def _as_decode(k, v, paths, i: int, prefix: int):
    """Query i's rows laid out as a decode finds them: its path moved behind the prefix, its own
    row last -> (k, v, the decode's paths)."""
    ln = int(paths[i, 1])
    rows = paths[i, 2 : 2 + ln]
    kd, vd = k.copy(), v.copy()
    kd[prefix : prefix + ln], vd[prefix : prefix + ln] = k[rows], v[rows]
    return kd, vd, _paths([(prefix + ln - 1, [prefix + ln - 1])])


def _tree_specs(rng, start: int, parents: list[int]) -> list[tuple[int, list[int]]]:
    specs = []
    for i in range(len(parents)):
        path, a = [], i
        while a >= 0:
            path.append(start + a)
            a = parents[a]
        specs.append((start, path[::-1]))
    return specs


@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize(("d", "h", "hkv"), [(64, 4, 1), (128, 8, 2), (256, 6, 2)])
def test_cpu_op_equals_the_reference(kv_type: str, d: int, h: int, hkv: int) -> None:
    rng = np.random.default_rng(d + h)
    start, parents = 70, [-1, 0, 0, 1, 2, 4, 1]  # a prefix over several tiles, then a tree
    q, k, v = _inputs(rng, 90, len(parents), h, hkv, d)
    paths = _paths(_tree_specs(rng, start, parents))
    scale = 1.0 / np.sqrt(d)
    got = _core.op_attn_paths(q, k, v, paths, kv_type, scale)
    want = _reference(q, _round(k, kv_type), _round(v, kv_type), paths, scale)
    assert np.abs(got - want).max() <= 2e-5 * max(1.0, float(np.abs(want).max()))


@settings(max_examples=25, deadline=None)
@given(
    st.integers(0, 80),
    st.lists(st.integers(0, 1000), min_size=1, max_size=20),
    st.sampled_from(KV_TYPES),
    st.integers(0, 2**31 - 1),
)
def test_a_query_depends_only_on_its_rows(
    prefix: int, raw_parents: list[int], kv_type: str, seed: int
) -> None:
    """Property (CPU): any tree's nodes, computed together, one at a time, and as decodes of the
    same rows laid out consecutively (where a decode would find them), give the same bits."""
    parents = [-1] + [p % (i + 1) for i, p in enumerate(raw_parents[1:])]
    rng = np.random.default_rng(seed)
    n, d, h, hkv = len(parents), 64, 4, 2
    q, k, v = _inputs(rng, prefix + n + 40, n, h, hkv, d)
    paths = _paths(_tree_specs(rng, prefix, parents))
    together = _core.op_attn_paths(q, k, v, paths, kv_type)
    for i in range(n):
        alone = _core.op_attn_paths(q[i : i + 1], k, v, paths[i : i + 1], kv_type)
        np.testing.assert_array_equal(alone[0], together[i])
        kd, vd, decode = _as_decode(k, v, paths, i, prefix)  # node i as the decode of its token
        np.testing.assert_array_equal(
            _core.op_attn_paths(q[i : i + 1], kd, vd, decode, kv_type)[0], together[i]
        )


def test_bad_shapes_and_rows_are_refused() -> None:
    rng = np.random.default_rng(0)
    q, k, v = _inputs(rng, 8, 2, 4, 2, 64)
    good = _paths([(3, [3]), (3, [3, 4])])
    with pytest.raises(_core.InvalidParameterError, match="out of range"):
        _core.op_attn_paths(q, k, v, _paths([(3, [3]), (3, [3, 8])]))
    with pytest.raises(_core.InvalidParameterError, match="shapes"):
        _core.op_attn_paths(q[:, :3], k, v, good)  # 3 heads over 2 KV heads
    with pytest.raises(_core.InvalidParameterError, match="kv_type"):
        _core.op_attn_paths(q, k, v, good, "q8_0")


@needs_gpu
@pytest.mark.parametrize("kv_type", KV_TYPES)
@pytest.mark.parametrize(("d", "h", "hkv"), [(64, 4, 1), (128, 8, 2), (256, 24, 4)])
def test_cuda_op_equals_the_cpu_and_is_batch_invariant(kv_type: str, d: int, h: int, hkv: int) -> None:
    """CUDA vs the CPU op (1e-5 of the scale), and on CUDA the bits of a query alone, in a batch,
    and as the decode of the same rows are the same."""
    rng = np.random.default_rng(d)
    start, parents = 300, [-1, 0, 1, 1, 3, 0, 5, 6, 7, 2]
    q, k, v = _inputs(rng, start + len(parents) + 5, len(parents), h, hkv, d)
    paths = _paths(_tree_specs(rng, start, parents))
    cpu = _core.op_attn_paths(q, k, v, paths, kv_type)
    gpu = _core.op_attn_paths(q, k, v, paths, kv_type, gpu=True)
    assert np.abs(gpu - cpu).max() <= 1e-5 * max(1.0, float(np.abs(cpu).max()))
    for i in range(len(parents)):
        alone = _core.op_attn_paths(q[i : i + 1], k, v, paths[i : i + 1], kv_type, gpu=True)
        np.testing.assert_array_equal(alone[0], gpu[i])
        kd, vd, decode = _as_decode(k, v, paths, i, start)
        np.testing.assert_array_equal(
            _core.op_attn_paths(q[i : i + 1], kd, vd, decode, kv_type, gpu=True)[0], gpu[i]
        )
