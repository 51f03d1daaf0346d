// Where the activation quantizers (the GEMV's and the tensor-core GEMM's) read their floats: a
// matrix x of columns sx floats apart, or a SwiGLU node's inputs, silu(x) * up, computed as
// ggml's unary_gated_op_kernel computes them (the same float operations, so the quantized values
// are those of the GLU node's output). Reading the GLU's inputs lets a SwiGLU feeding a weight
// matmul skip its own kernel and its output's round trip (glu_fusion.cu).
#pragma once

#include <cstdint>

#include "ggml-cuda/common.cuh"
#include "ggml-cuda/unary.cuh"

struct ActSource {
    const float * x = nullptr;   // the floats, or SwiGLU's gate (silu's argument)
    int64_t sx = 0;              // floats between columns of x
    const float * up = nullptr;  // SwiGLU's second operand, or null: x as it is
    int64_t sup = 0;

    // The source past the first c0 columns.
    ActSource columns_from(int64_t c0) const {
        ActSource s = *this;
        s.x += c0 * sx;
        if (up) s.up += c0 * sup;
        return s;
    }

    __device__ __forceinline__ float operator()(int64_t col, int64_t i) const {
        const float v = x[col * sx + i];
        return up ? ggml_cuda_op_silu_single(v) * up[col * sup + i] : v;
    }
};
