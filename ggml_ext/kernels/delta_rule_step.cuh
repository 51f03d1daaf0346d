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
    float kr[rows], qr[rows], v[C], g, beta;  // g: the gate after expf

    // k_t, q_t: the token's k and q (S floats); v_cols: its v at this warp's first column; g_raw:
    // the gate before expf.
    __device__ __forceinline__ void load(const float * __restrict__ k_t, const float * __restrict__ q_t,
                                         const float * __restrict__ v_cols, const float * __restrict__ g_raw,
                                         const float * __restrict__ beta_val, const int lane) {
        beta = *beta_val;
        g = expf(*g_raw);
#pragma unroll
        for (int r = 0; r < rows; ++r) {
            kr[r] = k_t[r * warp + lane];
            qr[r] = q_t[r * warp + lane];
        }
#pragma unroll
        for (int c = 0; c < C; ++c) v[c] = v_cols[c];
    }
};

// Blocks a multiprocessor the delta rule kernels ask ptxas for (__launch_bounds__'s second
// argument) with two rows a lane or more (S >= 64; 0: none asked, S < 64 keeps the code that gives
// ggml's bits). Without it ptxas sank a token's q loads below the k . s reduction (48 registers
// instead of 56), a second memory latency on every token's dependent path: the 27B's chain delta
// rule took 967 us for 48 layers of 16 tokens on the H200 against 655 with it (session 12's kernel:
// 724; tools/device/gdn_chain_standalone.cu, bench/results/h200-s16-gdn-chain-standalone.json), and
// the SASS loads all of a token's inputs at the top of its step. ggml's own kernel asks for 2.
template <int S>
constexpr int kDeltaRuleMinBlocks = S >= 64 ? 2 : 0;

// Whether a kernel loads a token's inputs a step ahead (columns: the state columns a warp). It
// pays where few warps wait on memory: one column a warp (the trained pair's 8 heads of 64) and
// the tree's paths form (which passes columns 1). With several columns a warp (the 27B's 4) the
// H200 measured no gain (chain delta rule 717 / 1317 / 2515 us for 16 / 32 / 64 tokens against
// 685 / 1255 / 2385 without, tree walk 1869 against 1707 us; bench/results/README.md, session 14;
// standalone 788 against 724 us for 16 tokens in session 16), so those keep the plain order.
// With one row a lane (S < 64) loading ahead moved ptxas's fused multiply-adds off ggml's bits
// (tests/test_gdn_chain.py), so never there.
template <int rows, int columns>
constexpr bool kDeltaRuleLoadAhead = rows > 1 && columns == 1;

// The update itself. kr, qr: this lane's rows of k and q; v: the token's v at the warp's first
// column (a pointer, read after the reduction as ggml does, or registers loaded ahead); g_val: the
// gate after expf. st: the columns (updated in place); o: the columns' outputs, reduced (every
// lane), not yet scaled.
template <int warp, int rows, int C, typename V>
__device__ __forceinline__ void delta_rule_core(float (&st)[C][rows], const float (&kr)[rows], const float (&qr)[rows],
                                                const V & v, const float g_val, const float beta_val, float (&o)[C]) {
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
        const float delta = (v[c] - g_val * kv[c]) * beta_val;
        o[c] = 0.0f;
#pragma unroll
        for (int r = 0; r < rows; ++r) {
            // g * s + k * delta with one product rounded first, spelled out: which one the
            // compiler rounds depends on the code around it, and ggml's kernel rounds g * s with
            // one row a lane, k * delta with more (its PTX for S = 32 and 64).
            if constexpr (rows == 1) {
                st[c][r] = __fmaf_rn(kr[r], delta, __fmul_rn(g_val, st[c][r]));
            } else {
                st[c][r] = __fmaf_rn(g_val, st[c][r], __fmul_rn(delta, kr[r]));
            }
            o[c] += st[c][r] * qr[r];
        }
    }
#pragma unroll
    for (int c = 0; c < C; ++c) o[c] = warp_reduce_sum<warp>(o[c]);
}

// This lane's rows of a token's k and q.
template <int warp, int rows>
__device__ __forceinline__ void delta_rule_load_kq(const float * __restrict__ k_t, const float * __restrict__ q_t,
                                                   const int lane, float (&kr)[rows], float (&qr)[rows]) {
#pragma unroll
    for (int r = 0; r < rows; ++r) {
        kr[r] = k_t[r * warp + lane];
        qr[r] = q_t[r * warp + lane];
    }
}

// A token loaded at the top of its step (ggml's order: k and q, then v after the reduction).
// k_t, q_t: the token's k and q (S floats); v_cols: its v at this warp's first column; g_raw: its
// gate before expf, taken after the loads of k and q (session 12's order; the speed it lost since
// came from where ptxas put the q loads, not from this order: see kDeltaRuleMinBlocks).
template <int warp, int rows, int C>
__device__ __forceinline__ void delta_rule_step(float (&st)[C][rows], const float * __restrict__ k_t,
                                                const float * __restrict__ q_t, const float * __restrict__ v_cols,
                                                const float * __restrict__ g_raw, const float beta_val, const int lane,
                                                float (&o)[C]) {
    float kr[rows], qr[rows];
    delta_rule_load_kq<warp, rows>(k_t, q_t, lane, kr, qr);
    delta_rule_core<warp, rows, C>(st, kr, qr, v_cols, expf(*g_raw), beta_val, o);
}

// A token whose inputs were loaded a step ahead.
template <int warp, int rows, int C>
__device__ __forceinline__ void delta_rule_apply(float (&st)[C][rows], const DeltaRuleInputs<warp, rows, C> & in,
                                                 float (&o)[C]) {
    delta_rule_core<warp, rows, C>(st, in.kr, in.qr, in.v, in.g, in.beta, o);
}
