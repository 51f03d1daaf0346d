// Where the activation quantizers (the GEMV's and the tensor-core GEMM's) read their floats: a
// matrix x of columns sx floats apart, a SwiGLU node's inputs, silu(x) * up, computed as ggml's
// unary_gated_op_kernel computes them, or (the GEMM's quantizer only) an RMSNorm's input times
// its weight, (s x) * w, as ggml's rms_norm_f32 computes it, s from the column's sum of squares in
// that kernel's order (column_scale). The same float operations, so the quantized values are
// those of the skipped node's output: a SwiGLU or an RMSNorm feeding a weight matmul skips its own
// kernel and its output's round trip (glu_fusion.cu, rms_norm_fusion.cu).
#pragma once

#include <cstdint>

#include "ggml-cuda/common.cuh"
#include "ggml-cuda/unary.cuh"

struct ActSource {
    const float * x = nullptr;   // the floats, or SwiGLU's gate (silu's argument)
    int64_t sx = 0;              // floats between columns of x
    const float * up = nullptr;  // SwiGLU's second operand, or null: x as it is
    int64_t sup = 0;
    const float * norm_w = nullptr;  // RMSNorm's weight (k floats), or null: no norm
    float norm_eps = 0.0f;
    int norm_threads = 0;  // the block of ggml's rms_norm_f32 for these rows (256 or 1024): its sum order

    // The source past the first c0 columns.
    ActSource columns_from(int64_t c0) const {
        ActSource s = *this;
        s.x += c0 * sx;
        if (up) s.up += c0 * sup;
        return s;
    }

    // Value i of column col; scale: the column's column_scale (used with a norm only).
    __device__ __forceinline__ float operator()(int64_t col, int64_t i, float scale = 1.0f) const {
        const float v = x[col * sx + i];
        if (norm_w) return scale * v * norm_w[i];  // rms_norm_f32's (scale * x) * mul
        return up ? ggml_cuda_op_silu_single(v) * up[col * sup + i] : v;
    }

    // RMSNorm's scale of column col of k values, rsqrt(mean(x^2) + eps), with ggml's rms_norm_f32
    // sums: its thread vt (of norm_threads) adds x[vt], x[vt + norm_threads], ... one by one, each
    // warp's 32 sums go through warp_reduce_sum, then the warps' sums through another. Here the
    // kThreads threads of a block play ggml's threads vt = tid, tid + kThreads, ... (the same lanes,
    // so the same butterflies). Every thread of the block calls it (a barrier inside); 1 without a norm.
    template <int kThreads>
    __device__ __forceinline__ float column_scale(int64_t col, int k) const {
        if (!norm_w) return 1.0f;
        static_assert(kThreads % WARP_SIZE == 0 && kThreads <= 1024, "whole warps");
        __shared__ float warp_sums[1024 / WARP_SIZE];
        const int tid = threadIdx.x, lane = tid % WARP_SIZE;
        const float * xc = x + col * sx;
        for (int vt = tid; vt < norm_threads; vt += kThreads) {  // the same trip count across a warp
            float tmp = 0.0f;
            for (int c = vt; c < k; c += norm_threads) {
                const float xi = xc[c];
                tmp += xi * xi;
            }
            tmp = warp_reduce_sum(tmp);
            if (lane == 0) warp_sums[vt / WARP_SIZE] = tmp;
        }
        __syncthreads();
        const float sum = warp_reduce_sum(lane < norm_threads / WARP_SIZE ? warp_sums[lane] : 0.0f);
        const float mean = sum / k;
        return rsqrtf(mean + norm_eps);
    }
};
