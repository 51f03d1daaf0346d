// One token's (or tree node's) gated delta rule update of the C state columns a warp holds, shared
// by the chain kernel (gdn_chain.cu) and the tree kernel (tree_ops.cu): one source for both, so a
// tree node and a decode step of the same state give the same bits (the batch-invariant mode relies
// on it). A column's arithmetic is ggml's gated_delta_net kernel's: the sums in row order from 0,
// ggml's warp butterfly, the fused update. Lane `lane` holds rows r * warp + lane of each column.
#pragma once

#include "ggml-cuda/common.cuh"

// st: the columns (updated in place); k_t, q_t: the token's k and q (S floats); v_cols: its v at
// this warp's first column; o: the columns' outputs, reduced (every lane), not yet scaled.
template <int warp, int rows, int C>
__device__ __forceinline__ void delta_rule_step(float (&st)[C][rows], const float * __restrict__ k_t,
                                                const float * __restrict__ q_t, const float * __restrict__ v_cols,
                                                const float g_val, const float beta_val, const int lane,
                                                float (&o)[C]) {
    float kr[rows], qr[rows];
#pragma unroll
    for (int r = 0; r < rows; ++r) {
        kr[r] = k_t[r * warp + lane];
        qr[r] = q_t[r * warp + lane];
    }
    float kv[C];
#pragma unroll
    for (int c = 0; c < C; ++c) {
        kv[c] = 0.0f;
#pragma unroll
        for (int r = 0; r < rows; ++r) kv[c] += st[c][r] * kr[r];
    }
#pragma unroll
    for (int c = 0; c < C; ++c) kv[c] = warp_reduce_sum<warp>(kv[c]);
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const float delta = (v_cols[c] - g_val * kv[c]) * beta_val;
        o[c] = 0.0f;
#pragma unroll
        for (int r = 0; r < rows; ++r) {
            st[c][r] = g_val * st[c][r] + kr[r] * delta;
            o[c] += st[c][r] * qr[r];
        }
    }
#pragma unroll
    for (int c = 0; c < C; ++c) o[c] = warp_reduce_sum<warp>(o[c]);
}
