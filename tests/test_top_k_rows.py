"""ggml_ext::top_k_rows: ggml_top_k tagged for ggml_ext's CUDA kernel (one pass over each long row
instead of ggml's sort of it; kernels/top_k_rows.cu). The drafter's DDTree candidates come from
it. On the CPU the tag changes nothing; on CUDA the kernel must return the CPU's index sets
(random values: no ties), for rows long enough to take it and rows that stay with ggml.
Also ggml_argmax, which CUDA computes with ggml_ext's kernel for rows of 32768 values or more
(kernels/argmax_rows.cu): the CPU's answer, numpy's where there are no ties, and on ties the
CPU's last maximum (ggml_vec_argmax_f32), which the kernel repeats."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dflash import _core

GPU = _core.gpu_backend_available()
REQUIRE_GPU = os.environ.get("DFLASH_REQUIRE_CUDA") == "1"


def _sets(ids: np.ndarray) -> list[set[int]]:
    return [set(map(int, row)) for row in ids]


@pytest.mark.parametrize(("n", "k"), [(4096, 8), (300, 5)])
def test_cpu_tag_changes_nothing_and_matches_numpy(n: int, k: int) -> None:
    x = np.random.default_rng(n).standard_normal((7, n)).astype(np.float32)
    want = [set(map(int, np.argpartition(-row, k)[:k])) for row in x]
    assert _sets(_core.op_top_k(x, k)) == want
    assert _sets(_core.op_top_k(x, k, tagged=True)) == want


@pytest.mark.skipif(
    not GPU and not REQUIRE_GPU, reason="no GPU backend in this build (run on the GPU machine)"
)
@pytest.mark.parametrize("k", [1, 8, 15, 16, 17, 32])
@pytest.mark.parametrize("n", [248320, 4096, 2048, 1000])
def test_cuda_top_k_rows_equals_the_cpu(n: int, k: int) -> None:
    rng = np.random.default_rng(k * n)
    x = (3 * rng.standard_normal((15, n))).astype(np.float32)
    x[3, :] = -np.inf  # a masked row: any k indices, all valid
    x[3, 5] = 1.0
    got = _core.op_top_k(x, k, tagged=True, gpu=True)
    assert got.shape == (15, k) and got.min() >= 0 and got.max() < n
    assert all(len(s) == k for s in _sets(got))
    cpu = _core.op_top_k(x, k)
    rows = [r for r in range(15) if r != 3]
    assert [_sets(got)[r] for r in rows] == [_sets(cpu)[r] for r in rows]
    assert 5 in _sets(got)[3]


TIES = [1, 4]  # _argmax_rows' rows with ties for the maximum


def _argmax_rows(n: int) -> np.ndarray:
    """Rows with ties for the maximum (rows TIES: the last one wins), a row whose maximum is its
    last value, a row of -inf but one value, a row of -inf."""
    rng = np.random.default_rng(n)
    x = rng.standard_normal((9, n)).astype(np.float32)
    x[1, [7, n // 2, n - 3]] = 50.0  # ties: index n - 3
    x[2, n - 1] = 60.0
    x[3, :] = -np.inf
    x[3, n // 3] = -1.0
    x[4, [5, 6]] = 70.0  # ties in the first chunk: index 6
    x[5, :] = -np.inf  # the last index
    return x


@pytest.mark.parametrize("n", [1000, 248320])
def test_cpu_argmax_matches_numpy(n: int) -> None:
    x = _argmax_rows(n)
    got, want = _core.op_argmax(x), np.argmax(x, axis=1)
    want[TIES] = [n - 3, 6]
    want[5] = n - 1
    np.testing.assert_array_equal(got, want)


@pytest.mark.skipif(
    not GPU and not REQUIRE_GPU, reason="no GPU backend in this build (run on the GPU machine)"
)
@pytest.mark.parametrize("n", [1000, 32768, 40000, 248320])
def test_cuda_argmax_equals_the_cpu(n: int) -> None:
    """ggml_ext's argmax of long rows (kernels/argmax_rows.cu, >= 32768 values: the 27B's logits)
    and ggml's for shorter ones: the CPU's answer (its last maximum on ties)."""
    x = _argmax_rows(n)
    if n < 32768:
        x = x[[0, 2, 3, 6, 7, 8]]  # ggml's own kernel: no promise on ties
    np.testing.assert_array_equal(_core.op_argmax(x, gpu=True), _core.op_argmax(x))
