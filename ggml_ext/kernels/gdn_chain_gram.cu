// The delta rule over a chain of tokens, 16 tokens at a time in parallel, for nodes the graph
// marked as not needing a decode step's bits (ggml_ext::allow_reordered_delta_rule); DFLASH_GDN_GRAM=1
// (ggml_ext::set_gdn_gram) runs it in place of the one-round kernel for chains of 2 tokens or more.
//
// The one-round kernel (gdn_chain_one_round.cu) still walks the tokens one after another: a token's
// dot products need the state its predecessor updated, so each token waits for a butterfly and an
// update (~775 cycles a token on the H200, 1.5 warps a scheduler, 44% of issue slots busy). Here,
// for a chunk of T tokens with a column m of the state at its start (log gates l_u, betas b_t):
//   seg(i, t) = l_{i+1} + ... + l_t,   Gam_t = exp(seg(-1, t)),   E_i = exp(seg(i, T - 1))
//   A_t = m . k_t,  B_t = m . q_t                          (every token at once: no dependency)
//   d_t = b_t (v_t - Gam_t A_t) - sum_{i<t} W[i][t] d_i,   W[i][t] = b_t exp(seg(i, t)) k_i . k_t
//   o_t = scale (Gam_t B_t + sum_{i<=t} P[i][t] d_i),     P[i][t] = exp(seg(i, t)) k_i . q_t
//   m'  = Gam_{T-1} m + sum_i E_i d_i k_i
// which is the recurrence m <- g_t m + k_t d_t, d_t = b_t (v_t - g_t m . k_t), o_t = scale m . q_t
// unrolled (d_t is the delta of token t). Only the scalar forward substitution for d is sequential
// (16 dependent multiply-adds a column); the dot products, the chunk's Gram entries k_i . k_t and
// k_i . q_t, the outputs and the state update are independent work, and a token's sums go through
// 1.5 butterfly levels on average instead of 3. The sums run in another order than the chain
// kernel's (float32 either way; tests hold it to the equations and to the chain kernel).
// Off by default: on the H100 (session 33) it was slower than the one-round kernel, alone
// (tools/device/gdn_chain_standalone.cu, the 27B's 48 layers: 664 / 1140 / 2171 us at 16 / 32 / 64
// tokens against 615 / 1004 / 1753, bench/results/h100-s33-gdn-standalone-228bbfb.json) and in
// the engine (the 16 / 32 / 64-token forwards 11.06 / 14.35 / 19.49 ms of kernels against 10.45 /
// 13.66 / 18.44, h100-s33-f1-27b-kernels-gdn-gram-1-*).
//
// A block: 16 state columns of one head (8 lane groups of 8 lanes, 2 columns a lane, S / 8 rows a
// lane), 64 threads; each lane group also forms two rows of the chunk's Gram matrices (rows g and
// 15 - g: 32 entries each way); 16 threads put the chunk's segment sums seg(i, t) in a table first,
// each summed in registers from t down. Tokens staged 16 at a time with cp.async, the next chunk in flight
// during the current one; a partial chunk is padded with zero tokens (zero k, q, v, beta and log
// gate: they add nothing). Chains only (trees keep the one-round kernel); S of 64 or 128.
#include "async_copy.cuh"
#include "gdn_chunk_walk.cuh"
#include "ggml-cuda/common.cuh"
#include "ggml_ext_gdn.h"
#include "ggml_ext_gdn_chain_cuda.cuh"
#include "launch.cuh"

#include <cstdint>
#include <cstdlib>

namespace gdn_gram {

constexpr int kT = 16;                   // tokens a chunk
constexpr int kL = 8;                    // lanes a state column
constexpr int kCL = 2;                   // columns a lane
constexpr int kColumns = 16;             // state columns a block
constexpr int kGroups = kColumns / kCL;  // lane groups a block: 8, each two Gram rows
constexpr int kThreads = kGroups * kL;   // 64
constexpr int kMinTokens = 2;            // one token keeps the chain kernel's bits
static_assert(kGroups * 2 == kT, "the lane groups' Gram rows g and T - 1 - g cover the chunk");
static_assert(kL == 8, "the reductions below are three butterfly levels");

bool enabled_flag = [] {
    const char * e = std::getenv("DFLASH_GDN_GRAM");
    return e && e[0] == '1';
}();

template <int R4>
__device__ __forceinline__ float dot_rows(const float4 (&a)[R4], const float4 (&b)[R4]) {
    float s0 = 0.0f, s1 = 0.0f;  // two chains: half the dependent depth
#pragma unroll
    for (int i = 0; i < R4; ++i) {
        float & s = (i & 1) ? s1 : s0;
        s = fmaf(a[i].x, b[i].x, s);
        s = fmaf(a[i].y, b[i].y, s);
        s = fmaf(a[i].z, b[i].z, s);
        s = fmaf(a[i].w, b[i].w, s);
    }
    return s0 + s1;
}

// One halving level: lanes with bit M of j keep the upper half of x[0 .. 2H), the others the
// lower, each adding its partner's (lane ^ M) copy of the half it keeps, into x[0 .. H).
template <int M, int H, int N>
__device__ __forceinline__ void halve(float (&x)[N], const int j) {
    const bool upper = (j & M) != 0;
#pragma unroll
    for (int e = 0; e < H; ++e) {
        const float keep = upper ? x[H + e] : x[e], send = upper ? x[e] : x[H + e];
        x[e] = keep + __shfl_xor_sync(0xffffffff, send, M);
    }
}

// The column group's 8 lanes (lane % 8 = j) sum x[0..N) and lane j keeps the sums of
// x[j N / 8 .. (j + 1) N / 8), in x[0 .. N / 8): three halving levels of xor shuffles (template
// arguments, so that x stays in registers).
template <int N>
__device__ __forceinline__ void reduce_scatter8(float (&x)[N], const int j) {
    static_assert(N % 8 == 0, "eight lanes' shares");
    halve<4, N / 2>(x, j);
    halve<2, N / 4>(x, j);
    halve<1, N / 8>(x, j);
}

// rows 4 (L i + j) .. + 3 of a row of S floats in shared memory
template <int R4>
__device__ __forceinline__ void load_rows(float4 (&r)[R4], const float * row, const int j) {
    const float4 * p = reinterpret_cast<const float4 *>(row);
#pragma unroll
    for (int i = 0; i < R4; ++i) r[i] = p[kL * i + j];
}

template <int S>
__global__ void __launch_bounds__(kThreads)
    gdn_chain_gram_kernel(const float * __restrict__ q, const float * __restrict__ k, const float * __restrict__ v,
                          const float * __restrict__ g, const float * __restrict__ beta, const float * __restrict__ s0,
                          float * __restrict__ dst, float * __restrict__ state, const int64_t H, const int64_t n_tokens,
                          const int64_t sq1, const int64_t sq2, const int64_t sq3, const int64_t sv1, const int64_t sv2,
                          const int64_t sv3, const int64_t sb1, const int64_t sb2, const int64_t sb3,
                          const int64_t neqk1, const int64_t rq3, const float scale) {
    constexpr int R4 = S / kL / 4;  // float4s of rows a lane
    __shared__ __align__(16) float s_k[2][kT][S];
    __shared__ __align__(16) float s_q[2][kT][S];
    __shared__ __align__(16) float s_v[2][kT][kColumns];
    __shared__ float s_l[2][kT], s_b[2][kT];     // log gates and betas (0 for padding)
    __shared__ __align__(16) float s_w[kT][kT];  // W[i][t] (0 unless i < t)
    __shared__ __align__(16) float s_p[kT][kT];  // P[i][t] (0 unless i <= t)
    __shared__ float s_gam[kT], s_e[kT];         // Gam_t, E_t
    __shared__ float s_seg[kT][kT];              // seg(i, t) for i < t

    const int64_t h = blockIdx.x, seq = blockIdx.y;
    const int64_t iq1 = h % neqk1, iq3 = seq / rq3;
    const int tid = threadIdx.x, warp = tid / 32, j = tid % kL, grp = tid / kL;
    const int c0 = grp * kCL;  // this lane's columns c0, c0 + 1 of the block's
    const int64_t col_block = (int64_t)blockIdx.z * kColumns;

    // states are stored transposed (row `col` = column col of S), as in ggml
    float4 st[kCL][R4];
    {
        const float4 * init = reinterpret_cast<const float4 *>(s0 + ((seq * H + h) * S + col_block + c0) * S);
#pragma unroll
        for (int c = 0; c < kCL; ++c) {
#pragma unroll
            for (int i = 0; i < R4; ++i) st[c][i] = init[c * (S / 4) + kL * i + j];
        }
    }

    // chunk rows t0 .. t0 + tn - 1 into buffer buf (cp.async, one commit group), zeros past tn
    auto stage = [&](int buf, int64_t t0, int tn) {
        for (int p = tid; p < kT * (S / 4); p += kThreads) {
            const int t = p / (S / 4), e = 4 * (p % (S / 4));
            if (t < tn) {
                const int64_t qk = iq3 * sq3 + (t0 + t) * sq2 + iq1 * sq1 + e;
                cp_async_16(&s_k[buf][t][e], k + qk);
                cp_async_16(&s_q[buf][t][e], q + qk);
            } else {
                *reinterpret_cast<float4 *>(&s_k[buf][t][e]) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                *reinterpret_cast<float4 *>(&s_q[buf][t][e]) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        }
        for (int p = tid; p < kT * (kColumns / 4); p += kThreads) {
            const int t = p / (kColumns / 4), e = 4 * (p % (kColumns / 4));
            if (t < tn) {
                cp_async_16(&s_v[buf][t][e], v + seq * sv3 + (t0 + t) * sv2 + h * sv1 + col_block + e);
            } else {
                *reinterpret_cast<float4 *>(&s_v[buf][t][e]) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        }
        cp_async_commit();
    };
    // thread t < kT: token t's log gate and beta (zeros past tn)
    auto gate_beta = [&](int64_t t0, int tn, float & lv, float & bv) {
        lv = 0.0f, bv = 0.0f;
        if (tid < tn) {
            const int64_t gb = seq * sb3 + (t0 + tid) * sb2 + h * sb1;
            lv = g[gb];
            bv = beta[gb];
        }
    };

    float * out = dst + (seq * n_tokens * H + h) * S + col_block + c0;  // + token S H
    {
        const int tn = gdn_chunk_tokens<kT>(n_tokens, 0);
        stage(0, 0, tn);
        float lv, bv;
        gate_beta(0, tn, lv, bv);
        if (tid < kT) s_l[0][tid] = lv, s_b[0][tid] = bv;
    }
    // The lane group's Gram rows: a (= grp) and b (= T - 1 - grp). Warp w's a rows are 4w .. 4w + 3
    // and need tokens t >= 4w; its b rows 12 - 4w .. 15 - 4w need t >= 12 - 4w (uniform a warp).
    const int ra = grp, rb = kT - 1 - grp;
    const int a_from = 4 * warp, b_from = kT - 4 - 4 * warp;

    for (int64_t t0 = 0, ci = 0; t0 < n_tokens; t0 += kT, ++ci) {
        const int buf = (int)(ci & 1);
        const int tn = gdn_chunk_tokens<kT>(n_tokens, t0);
        const int64_t t1 = t0 + kT;
        const int tn1 = gdn_chunk_tokens<kT>(n_tokens, t1);
        float lv1 = 0.0f, bv1 = 0.0f;
        gdn_stage_next_wait_this(tn1, [&] {
            stage(buf ^ 1, t1, tn1);
            gate_beta(t1, tn1, lv1, bv1);
        });
        __syncthreads();  // this chunk's rows, gates and betas are in shared memory
        const float * lg = s_l[buf];
        const float * bt = s_b[buf];

        if (tid < kT) {  // thread t: seg(i, t) for i < t (summed from t down), Gam_t and E_t
            float l[kT];
#pragma unroll
            for (int u = 0; u < kT; ++u) l[u] = lg[u];
            float seg = 0.0f, e = 0.0f;
#pragma unroll
            for (int i = kT - 2; i >= 0; --i) {
                if (i < tid) {
                    seg += l[i + 1];
                    s_seg[i][tid] = seg;
                }
            }
#pragma unroll
            for (int u = kT - 1; u > 0; --u) {
                if (u > tid) e += l[u];
            }
            s_gam[tid] = expf(seg + l[0]);
            s_e[tid] = expf(e);
        }

        // The Gram rows' partial sums over this lane's rows: [row a, b][k . k, k . q][t]
        {
            float gram[2 * 2 * kT];
#pragma unroll
            for (int e = 0; e < 2 * 2 * kT; ++e) gram[e] = 0.0f;
            float4 ka[R4], kb[R4];
            load_rows(ka, s_k[buf][ra], j);
            load_rows(kb, s_k[buf][rb], j);
#pragma unroll
            for (int t = 0; t < kT; ++t) {
                const bool need_a = t >= a_from, need_b = t >= b_from;
                if (need_a || need_b) {
                    float4 kt[R4], qt[R4];
                    load_rows(kt, s_k[buf][t], j);
                    load_rows(qt, s_q[buf][t], j);
                    if (need_a) gram[t] = dot_rows(ka, kt), gram[kT + t] = dot_rows(ka, qt);
                    if (need_b) gram[2 * kT + t] = dot_rows(kb, kt), gram[3 * kT + t] = dot_rows(kb, qt);
                }
            }
            reduce_scatter8(gram, j);
            __syncthreads();  // seg is in shared memory
            // lane j holds entries 8j .. 8j + 7: row (j / 4 ? b : a), k . k or k . q ((j / 2) % 2),
            // tokens 8 (j % 2) .. + 7
            const int i = (j & 4) ? rb : ra, tb = 8 * (j & 1);
            const bool kq = (j & 2) != 0;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const int t = tb + e;
                const float dec = t > i ? expf(s_seg[i][t]) : 1.0f;  // 1 at t = i
                if (kq) {
                    s_p[i][t] = t >= i ? dec * gram[e] : 0.0f;
                } else {
                    s_w[i][t] = t > i ? bt[t] * dec * gram[e] : 0.0f;
                }
            }
        }

        // A_t (every lane of the column) and B_t (lane j: tokens 2j, 2j + 1) from the chunk's start
        float ak[kCL][kT];
        float bq[2 * kT];  // [t][c], scattered
#pragma unroll
        for (int t = 0; t < kT; ++t) {
            float4 kt[R4], qt[R4];
            load_rows(kt, s_k[buf][t], j);
            load_rows(qt, s_q[buf][t], j);
#pragma unroll
            for (int c = 0; c < kCL; ++c) {
                ak[c][t] = dot_rows(st[c], kt);
                bq[t * kCL + c] = dot_rows(st[c], qt);
            }
        }
#pragma unroll
        for (int m = 1; m < kL; m <<= 1) {
#pragma unroll
            for (int c = 0; c < kCL; ++c) {
#pragma unroll
                for (int t = 0; t < kT; ++t) ak[c][t] += __shfl_xor_sync(0xffffffff, ak[c][t], m);
            }
        }
        reduce_scatter8(bq, j);  // bq[0..3]: tokens 2j, 2j + 1, columns 0, 1
        __syncthreads();         // Gam, E, W and P are in shared memory

        // the deltas: forward substitution, the same in each of the column's lanes
        float d[kCL][kT];
#pragma unroll
        for (int t = 0; t < kT; ++t) {
#pragma unroll
            for (int c = 0; c < kCL; ++c) d[c][t] = bt[t] * (s_v[buf][t][c0 + c] - s_gam[t] * ak[c][t]);
        }
#pragma unroll
        for (int i = 0; i < kT - 1; ++i) {
            const float * wr = s_w[i];
#pragma unroll
            for (int t = i + 1; t < kT; ++t) {
                const float w = wr[t];
#pragma unroll
                for (int c = 0; c < kCL; ++c) d[c][t] = fmaf(-w, d[c][i], d[c][t]);
            }
        }

        // outputs: lane j writes tokens 2j and 2j + 1 of its two columns
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int t = 2 * j + u;
            float o[kCL];
#pragma unroll
            for (int c = 0; c < kCL; ++c) o[c] = s_gam[t] * bq[u * kCL + c];
#pragma unroll
            for (int i = 0; i < kT; ++i) {
                const float p = s_p[i][t];
#pragma unroll
                for (int c = 0; c < kCL; ++c) o[c] = fmaf(p, d[c][i], o[c]);
            }
            if (t < tn) {
#pragma unroll
                for (int c = 0; c < kCL; ++c) out[(t0 + t) * S * H + c] = o[c] * scale;
            }
        }

        // the state at the chunk's end
        {
            const float gam = s_gam[kT - 1];
#pragma unroll
            for (int c = 0; c < kCL; ++c) {
#pragma unroll
                for (int r = 0; r < R4; ++r) {
                    st[c][r].x *= gam, st[c][r].y *= gam, st[c][r].z *= gam, st[c][r].w *= gam;
                }
            }
#pragma unroll
            for (int i = 0; i < kT; ++i) {
                float4 ki[R4];
                load_rows(ki, s_k[buf][i], j);
                const float ei = s_e[i];
#pragma unroll
                for (int c = 0; c < kCL; ++c) {
                    const float f = ei * d[c][i];
#pragma unroll
                    for (int r = 0; r < R4; ++r) {
                        st[c][r].x = fmaf(ki[r].x, f, st[c][r].x);
                        st[c][r].y = fmaf(ki[r].y, f, st[c][r].y);
                        st[c][r].z = fmaf(ki[r].z, f, st[c][r].z);
                        st[c][r].w = fmaf(ki[r].w, f, st[c][r].w);
                    }
                }
            }
        }
        if (tn1 > 0 && tid < kT) s_l[buf ^ 1][tid] = lv1, s_b[buf ^ 1][tid] = bv1;
        __syncthreads();  // this chunk and W, P, Gam, E are read before the next chunk writes them
    }
    float4 * st_out = reinterpret_cast<float4 *>(state + ((seq * H + h) * S + col_block + c0) * S);
#pragma unroll
    for (int c = 0; c < kCL; ++c) {
#pragma unroll
        for (int i = 0; i < R4; ++i) st_out[c * (S / 4) + kL * i + j] = st[c][i];
    }
}

template <int S>
void launch(const GdnChainArgs & a, cudaStream_t stream) {
    const dim3 grid((unsigned)a.H, (unsigned)a.n_seqs, (unsigned)(S / kColumns));
    DFLASH_LAUNCH(grid, dim3(kThreads), 0, stream, gdn_chain_gram_kernel<S>)(
        a.q, a.k, a.v, a.g, a.beta, a.s0, a.dst, a.state, a.H, a.n_tokens, a.sq1, a.sq2, a.sq3, a.sv1, a.sv2, a.sv3,
        a.sb1, a.sb2, a.sb3, a.neqk1, a.rq3, a.scale);
}

}  // namespace gdn_gram

namespace ggml_ext {
void set_gdn_gram(bool on) { gdn_gram::enabled_flag = on; }
bool gdn_gram() { return gdn_gram::enabled_flag; }
}  // namespace ggml_ext

bool ggml_ext_cuda_gated_delta_net_gram(const GdnChainArgs & a, cudaStream_t stream) {
    using namespace gdn_gram;
    if (!enabled_flag || a.parents != nullptr || !a.write_state || !gdn_rows_aligned16(a, true) ||
        a.n_tokens < kMinTokens) {
        return false;
    }
    switch (a.S) {
        case 64:
            launch<64>(a, stream);
            return true;
        case 128:
            launch<128>(a, stream);
            return true;
        default:
            return false;
    }
}
