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
    // sums: its thread vt (of norm_threads: 256 or 1024) adds x[vt], x[vt + norm_threads], ... one
    // by one, each warp's 32 sums go through warp_reduce_sum, then the warps' sums through another.
    // Here the block's 256 threads play ggml's threads vt = tid + 256 m (the same lanes, so the same
    // butterflies), their NV = norm_threads / 256 sums in one pass, every load in flight at once
    // (one pass per vt was ~2x slower on the H200: 4 us more a launch at 16 columns, session 24).
    // Every thread of the block calls it (a barrier inside); 1 without a norm.
    template <int kThreads>
    __device__ __forceinline__ float column_scale(int64_t col, int k) const {
        static_assert(kThreads == 256, "ggml's 256- and 1024-thread norms played by 256 threads");
        if (!norm_w) return 1.0f;
        __shared__ float warp_sums[1024 / WARP_SIZE];
        const float * xc = x + col * sx;
        if (norm_threads == kThreads) {
            sum_squares<kThreads, 1>(xc, k, warp_sums);
        } else {
            sum_squares<kThreads, 4>(xc, k, warp_sums);
        }
        __syncthreads();
        const int lane = threadIdx.x % WARP_SIZE;
        const float sum = warp_reduce_sum(lane < norm_threads / WARP_SIZE ? warp_sums[lane] : 0.0f);
        const float mean = sum / k;
        return rsqrtf(mean + norm_eps);
    }

    // The warp sums of ggml's threads vt = tid + kThreads m (m < NV) into warp_sums[vt / 32].
    // Values past k enter as 0 * 0, which leaves a sum of squares as it is.
    template <int kThreads, int NV>
    static __device__ __forceinline__ void sum_squares(const float * xc, int k, float * warp_sums) {
        const int tid = threadIdx.x;
        float tmp[NV];
#pragma unroll
        for (int m = 0; m < NV; ++m) tmp[m] = 0.0f;
#pragma unroll 4
        for (int c = tid; c < k; c += NV * kThreads) {
#pragma unroll
            for (int m = 0; m < NV; ++m) {
                const float xi = c + m * kThreads < k ? xc[c + m * kThreads] : 0.0f;
                tmp[m] += xi * xi;
            }
        }
#pragma unroll
        for (int m = 0; m < NV; ++m) {
            tmp[m] = warp_reduce_sum(tmp[m]);
            if (tid % WARP_SIZE == 0) warp_sums[(tid + m * kThreads) / WARP_SIZE] = tmp[m];
        }
    }
};
