// One token's (or tree node's) gated delta rule update of the C state columns a warp holds, shared
// by the chain kernel (gdn_chain.cu) and the tree kernel (tree_ops.cu): one source for both, so a
// tree node and a decode step of the same state give the same bits (the batch-invariant mode relies
// on it). A column's arithmetic is ggml's gated_delta_net kernel's: the sums in row order from 0,
// ggml's warp butterfly, the fused update. Lane `lane` holds rows r * warp + lane of each column.
#pragma once

#include "ggml-cuda/common.cuh"

// One token's inputs in registers: loaded for the next token while the current one is applied
// (each token's update waits on the previous one, its loads do not, so a loop that loads at the
// top of each step pays the memory latency once a token on top of the arithmetic).
template <int warp, int rows, int C>
struct DeltaRuleInputs {
    float kr[rows], qr[rows], v[C], g, beta;

    // k_t, q_t: the token's k and q (S floats); v_cols: its v at this warp's first column; g_raw:
    // the gate before expf.
    __device__ __forceinline__ void load(const float * __restrict__ k_t, const float * __restrict__ q_t,
                                         const float * __restrict__ v_cols, const float g_raw, const float beta_val,
                                         const int lane) {
#pragma unroll
        for (int r = 0; r < rows; ++r) {
            kr[r] = k_t[r * warp + lane];
            qr[r] = q_t[r * warp + lane];
        }
#pragma unroll
        for (int c = 0; c < C; ++c) v[c] = v_cols[c];
        g = g_raw;
        beta = beta_val;
    }
};

// st: the columns (updated in place); in: the token's inputs; o: the columns' outputs, reduced
// (every lane), not yet scaled.
template <int warp, int rows, int C>
__device__ __forceinline__ void delta_rule_apply(float (&st)[C][rows], const DeltaRuleInputs<warp, rows, C> & in,
                                                 float (&o)[C]) {
    const float g_val = expf(in.g);
    float kv[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
        kv[c] = 0.0f;
#pragma unroll
        for (int r = 0; r < rows; ++r) kv[c] += st[c][r] * in.kr[r];
    }
#pragma unroll
    for (int c = 0; c < C; ++c) kv[c] = warp_reduce_sum<warp>(kv[c]);
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const float delta = (in.v[c] - g_val * kv[c]) * in.beta;
        o[c] = 0.0f;
#pragma unroll
        for (int r = 0; r < rows; ++r) {
            st[c][r] = g_val * st[c][r] + in.kr[r] * delta;
            o[c] += st[c][r] * in.qr[r];
        }
    }
#pragma unroll
    for (int c = 0; c < C; ++c) o[c] = warp_reduce_sum<warp>(o[c]);
}
