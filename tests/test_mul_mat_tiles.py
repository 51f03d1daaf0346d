"""ggml_ext::mul_mat_tiles: a MUL_MAT tagged for ggml_ext's launch policy of ggml's mmq on CUDA
(one block per output tile, no stream-k fixup pass, where that is cheaper; patches/0003). The
engine builds every weight matmul this way. The tag changes nothing on the CPU; on CUDA the
product equals ggml's untagged one up to the order of float sums. (Tagged Q4_K / Q5_K / Q6_K
products of 2..64 columns go to ggml_ext's tensor-core GEMM by default, whose activations are quantized per
256 values: these tests switch it off, test_gemv_kquant.py tests it.)"""

from __future__ import annotations

import os
from collections.abc import Iterator

import numpy as np
import pytest
from test_mul_mat_invariant import TYPES, _weights

from dflash import _core

GPU = _core.gpu_backend_available()
REQUIRE_GPU = os.environ.get("DFLASH_REQUIRE_CUDA") == "1"


@pytest.fixture(autouse=True)
def mmq_only() -> Iterator[None]:
    was = _core.mma_enabled()
    _core.set_mma_enabled(False)
    yield
    _core.set_mma_enabled(was)


@pytest.mark.parametrize("name", sorted(TYPES))
def test_tag_changes_nothing_on_the_cpu(name: str) -> None:
    w, _ = _weights(name, 64, 512)
    x = np.random.default_rng(1).standard_normal((17, 512)).astype(np.float32)
    plain = _core.op_mul_mat(w, name, 64, x)
    np.testing.assert_array_equal(plain, _core.op_mul_mat(w, name, 64, x, tiles=True))


def test_the_two_tags_are_exclusive() -> None:
    w, _ = _weights("q8_0", 32, 64)
    x = np.ones((2, 64), np.float32)
    with pytest.raises(_core.InvalidParameterError, match="exclusive"):
        _core.op_mul_mat(w, "q8_0", 32, x, tagged=True, tiles=True)


@pytest.mark.skipif(
    not GPU and not REQUIRE_GPU, reason="no GPU backend in this build (run on the GPU machine)"
)
@pytest.mark.parametrize("name", sorted(TYPES))
@pytest.mark.parametrize(("rows", "k"), [(1024, 512), (512, 1024), (5120, 4096), (4096, 256)])
def test_cuda_tiles_equal_ggml_up_to_summation_order(name: str, rows: int, k: int) -> None:
    """Small matrices take one block per tile (no fixup), the large one keeps stream-k: both must
    give ggml's product, whose K is then summed in other pieces (float rounding only). 4096 x 256
    is tiny-c's output matrix (one mmq iteration), where the q4_K oracle diverged on CUDA."""
    w, _ = _weights(name, rows, k, seed=4)
    rng = np.random.default_rng(5)
    for n in (9, 16, 33, 64):  # mmq's column counts (mmvq below 9)
        x = rng.standard_normal((n, k)).astype(np.float32)
        plain = _core.op_mul_mat(w, name, rows, x, gpu=True)
        tiles = _core.op_mul_mat(w, name, rows, x, tiles=True, gpu=True)
        scale = max(1.0, float(np.abs(plain).max()))
        assert np.abs(tiles - plain).max() <= 1e-5 * scale, f"{name} {rows}x{k}, {n} columns"
