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
    // Or (the GEMM's quantizer only) up is a per-head RMSNorm's input: the value is silu(x) *
    // ((s up) * head_w), s the norm scale of the head of `head` values (32, 64, 128 or 256) holding
    // it, as ggml's rms_norm_f32<256> computes it for rows of `head` (the delta rule's gated output,
    // qwen35_graph.cpp's gated_output; rms_norm_fusion.cu). The quantizer computes s (head_scale_*).
    const float * head_w = nullptr;
    int head = 0;
    float head_eps = 0.0f;
    // Or (the GEMM's quantizer only) x times the sigmoid of a gate read in blocks: value i of column
    // col is sigmoid(gate[col sgate + (i / gate_block) gate_stride + i % gate_block]) * x[col sx + i],
    // as ggml-cuda's fused sigmoid and multiply computes it (the attention's output gate, whose heads
    // sit between the query heads of one product; glu_fusion.cu's sigmoid gates).
    const float * gate = nullptr;
    int64_t sgate = 0;
    int gate_block = 0, gate_stride = 0;
    // Set by the GEMM's quantizer launcher (gemm_kq::with_runs16): x, up and norm_w start 16 bytes
    // aligned and their columns are whole float4s apart, so runs of 4 values load as one float4.
    bool runs16 = false;

    // The source past the first c0 columns.
    ActSource columns_from(int64_t c0) const {
        ActSource s = *this;
        s.x += c0 * sx;
        if (up) s.up += c0 * sup;
        if (gate) s.gate += c0 * sgate;
        return s;
    }

    // Value i of column col; scale: the column's column_scale (used with a norm only).
    __device__ __forceinline__ float operator()(int64_t col, int64_t i, float scale = 1.0f) const {
        const float v = x[col * sx + i];
        if (norm_w) return scale * v * norm_w[i];  // rms_norm_f32's (scale * x) * mul
        return up ? ggml_cuda_op_silu_single(v) * up[col * sup + i] : v;
    }

    // Values i .. i + 3 of column col, each as operator() gives it, from 16-byte loads (runs16; i a
    // multiple of 4).
    __device__ __forceinline__ void run_of_4(int64_t col, int64_t i, float scale, float * out) const {
        const float4 v = *reinterpret_cast<const float4 *>(x + col * sx + i);
        const float xv[4] = {v.x, v.y, v.z, v.w};
        if (norm_w) {
            const float4 w = *reinterpret_cast<const float4 *>(norm_w + i);
            const float wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int m = 0; m < 4; ++m) out[m] = scale * xv[m] * wv[m];
        } else if (up) {
            const float4 u = *reinterpret_cast<const float4 *>(up + col * sup + i);
            const float uv[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int m = 0; m < 4; ++m) out[m] = ggml_cuda_op_silu_single(xv[m]) * uv[m];
        } else {
#pragma unroll
            for (int m = 0; m < 4; ++m) out[m] = xv[m];
        }
    }

    // gated_head_normed of values i .. i + 3 from 16-byte loads (runs16; i a multiple of 4, so the
    // run sits in one head).
    __device__ __forceinline__ void gated_head_normed_run_of_4(int64_t col, int64_t i, float s, float * out) const {
        const float4 a = *reinterpret_cast<const float4 *>(x + col * sx + i);
        const float4 u = *reinterpret_cast<const float4 *>(up + col * sup + i);
        const float4 w = *reinterpret_cast<const float4 *>(head_w + i % head);
        const float av[4] = {a.x, a.y, a.z, a.w}, uv[4] = {u.x, u.y, u.z, u.w}, wv[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int m = 0; m < 4; ++m) out[m] = ggml_cuda_op_silu_single(av[m]) * (s * uv[m] * wv[m]);
    }

    // silu(x) * ((s up) * head_w): the SwiGLU of a per-head norm's output, s its head's scale.
    __device__ __forceinline__ float gated_head_normed(int64_t col, int64_t i, float s) const {
        return ggml_cuda_op_silu_single(x[col * sx + i]) * (s * up[col * sup + i] * head_w[i % head]);
    }

    // sigmoid(gate) * x, the gate's value in its block layout; the sigmoid is ggml-cuda's op_sigmoid.
    __device__ __forceinline__ float sigmoid_gated(int64_t col, int64_t i) const {
        const float gv = gate[col * sgate + i / gate_block * gate_stride + i % gate_block];
        return 1.0f / (1.0f + expf(-gv)) * x[col * sx + i];
    }

    // The head norm's scale rsqrt(mean(up^2) + eps) from the head's sums of squares per 32 values,
    // w[0..head/32), added as ggml's block_reduce adds its warps' sums: a butterfly over 32 lanes
    // that hold them in lanes 0..head/32-1 and zeros elsewhere (x + 0 is x: the first levels
    // change nothing), so pairs m, m + o for o = head/64, ..., 1.
    __device__ __forceinline__ float head_scale_from(float * w) const {
        for (int o = head / 64; o >= 1; o >>= 1) {
            for (int m = 0; m < o; ++m) w[m] = w[m] + w[m + o];
        }
        return rsqrtf(w[0] / head + head_eps);
    }

    // The sum of squares of 32 values in ggml's warp_reduce_sum order (lane i holds value i; a
    // butterfly over offsets 16, 8, 4, 2, 1) where this lane holds values 8t..8t+7 (t = lane % 4)
    // of a sub-block spread over lanes 4j..4j+3: offsets 16 and 8 are lanes t ^ 2 and t ^ 1, 4, 2
    // and 1 are within the lane. Every lane of the four gets the same bits (x + y is y + x).
    static __device__ __forceinline__ float sum_squares_of_quad(const float (&v)[8]) {
        float q[8];
#pragma unroll
        for (int m = 0; m < 8; ++m) {
            q[m] = v[m] * v[m];
            q[m] += __shfl_xor_sync(0xffffffff, q[m], 2);
            q[m] += __shfl_xor_sync(0xffffffff, q[m], 1);
        }
        float r[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) r[m] = q[m] + q[m + 4];
        return (r[0] + r[2]) + (r[1] + r[3]);
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
        return norm_w ? scale_of_column<kThreads>(x + col * sx, k) : 1.0f;
    }

    // column_scale of the k values at xc (global or shared memory).
    template <int kThreads>
    __device__ __forceinline__ float scale_of_column(const float * xc, int k) const {
        static_assert(kThreads == 256, "ggml's 256- and 1024-thread norms played by 256 threads");
        __shared__ float warp_sums[1024 / WARP_SIZE];
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
