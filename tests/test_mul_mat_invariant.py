"""ggml_ext::mul_mat_invariant: a MUL_MAT tagged so that on CUDA each column gets the arithmetic
of the one-column product (ggml_ext/BATCH_INVARIANCE.md): ggml's mul_mat_vec_q, or ggml_ext's
GEMV for Q4_K / Q6_K. The tag changes nothing on the CPU; on the GPU, column j of a 2..64-column
product must equal, bit for bit, the tagged product of column j alone (what a one-token decode
computes), and stay close to the CPU's result."""

from __future__ import annotations

import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from dflash import _core
from dflash.synth.quant import random_blocks

Q = GGMLQuantizationType
TYPES = {"q8_0": Q.Q8_0, "q4_0": Q.Q4_0, "q4_K": Q.Q4_K, "q5_K": Q.Q5_K, "q6_K": Q.Q6_K}
GPU = _core.gpu_backend_available()
REQUIRE_GPU = os.environ.get("DFLASH_REQUIRE_CUDA") == "1"


def _weights(name: str, rows: int, k: int, seed: int = 0) -> tuple[bytes, np.ndarray]:
    blocks = random_blocks(np.random.default_rng(seed), rows, k, TYPES[name], std=0.05)
    w = np.ascontiguousarray(blocks).tobytes()
    return w, quants.dequantize(np.frombuffer(w, np.uint8).reshape(rows, -1), TYPES[name])


@pytest.mark.parametrize("name", sorted(TYPES))
def test_tag_changes_nothing_on_the_cpu(name: str) -> None:
    rows, k = 96, 512
    w, dense = _weights(name, rows, k)
    x = np.random.default_rng(1).standard_normal((5, k)).astype(np.float32)
    plain = _core.op_mul_mat(w, name, rows, x)
    tagged = _core.op_mul_mat(w, name, rows, x, tagged=True)
    np.testing.assert_array_equal(plain, tagged)
    ref = x.astype(np.float64) @ dense.T.astype(np.float64)  # activations are quantized to 8 bits
    assert np.abs(plain - ref).max() <= 2e-2 * np.abs(ref).max()


@pytest.mark.skipif(
    not GPU and not REQUIRE_GPU, reason="no GPU backend in this build (run on the GPU machine)"
)
@pytest.mark.parametrize("name", sorted(TYPES))
def test_cuda_columns_match_one_column_products(name: str) -> None:
    rows, k = 320, 2048
    w, _ = _weights(name, rows, k, seed=2)
    rng = np.random.default_rng(3)
    for n in (2, 4, 5, 16, 64):  # each op_mul_mat call starts a GPU backend: a few columns each
        x = rng.standard_normal((n, k)).astype(np.float32)
        got = _core.op_mul_mat(w, name, rows, x, tagged=True, gpu=True)
        for j in sorted({0, n // 2, n - 1}):
            one = _core.op_mul_mat(w, name, rows, x[j : j + 1], tagged=True, gpu=True)[0]
            np.testing.assert_array_equal(got[j], one, err_msg=f"{name}: column {j} of {n}")
        # Close to the CPU's: both quantize the activations to 8 bits, but not alike (CUDA q8_1
        # per 32 values; the CPU q8_0, or q8_K per 256 for k-quants), so 8-bit error, as above.
        cpu = _core.op_mul_mat(w, name, rows, x)
        assert np.abs(got - cpu).max() <= 2e-2 * max(1.0, float(np.abs(cpu).max()))
