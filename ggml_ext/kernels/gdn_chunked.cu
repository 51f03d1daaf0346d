// The delta rule over a chain of tokens in chunks of 64, as matrix products (the WY form of the
// gated delta rule) instead of one token after another.
//
// The chain kernel (gdn_chain.cu) updates a head's state once a token: 64 dependent updates, each
// two warp reductions deep, for a 64-token verify (39 us a 27B layer on the H200, the forward's
// third cost after the GEMMs). Here a chunk of L tokens of one head, state M0 (S x S, rows the key
// dimension), cumulative log gates G_t (G_t = g_0 + ... + g_t within the chunk) and betas b_t:
//   A[t][i] = b_t exp(G_t - G_i) k_t.k_i  (i < t)      P[t][i] = exp(G_t - G_i) q_t.k_i  (i <= t)
//   T = (I + A)^-1                                     R_t = b_t (v_t - exp(G_t) M0^T k_t)
//   D = T R  (the tokens' deltas, delta_t of the recurrence, as rows)
//   o_t = scale (exp(G_t) M0^T q_t + sum_{i <= t} P[t][i] D_i)
//   M = exp(G_{L-1}) M0 + sum_i exp(G_{L-1} - G_i) k_i D_i^T   (the state after the chunk)
// which unrolls the recurrence M_t = g_t M_{t-1} + k_t delta_t^T, delta_t = b_t (v_t - g_t
// M_{t-1}^T k_t) exactly (tests/test_gdn_chunked.py checks the algebra in numpy). A, P and T depend
// on k, q, g and beta only, so one kernel (prep) makes them for every (head, chunk) at once; a
// second (apply) walks the chunks of a head for a slab of C state columns. The sums run in another
// order than the recurrence's: not the chain kernel's bits, so the batch-invariant mode never takes
// this form; the graph opts a node in (ggml_ext::allow_reordered_delta_rule).
//
// Measured on the H200 (session 20, the 27B's 48 GDN layers, kernel_profile; bench/results/
// h200-s20-27b-kernels-*): SLOWER than the chain kernel at every length, so off by default
// (DFLASH_GDN_CHUNKED=1 / ggml_ext::set_gdn_chunked(true) turn it on for marked nodes):
//   us a forward (48 layers)     8 tokens      16           32            64        DDTree b32
//   first version (apply+prep)  1189+333   1253+413    1449+723     2226+1454    1393+1136
//   loads batched (this one)    1299+380   1562+513    2070+906     3145+1898    2221+1153
//   chain / tree kernel            -          563        1000          1867      1476 (s18)
// Even at 8 tokens, where a block's arithmetic is ~1 us, apply takes 25 us a layer: its blocks
// (384 of 256 threads, 86 KB of shared memory, 2 a multiprocessor: 1.45 waves) wait through ~5
// dependent phases of global loads and barriers each, and prep runs before it on 48
// multiprocessors. Batching the loads made it slower, so that guess was wrong too. Not profiled
// yet (no device time was left in session 20): tools/device/gdn_chunked_standalone.cu times the
// kernels alone and runs them once for ncu. Next: one wave (fewer, wider blocks, q not staged),
// every load of a chunk issued at the start (cp.async), prep folded into apply. The tests hold
// this form to the equations either way.
//
// A DDTree verify's nodes are the same algebra over ancestors instead of earlier tokens: G_t =
// g_t + G_parent(t), A and P nonzero only where i is an ancestor of t (or t itself, for P), and
// the output is each node's; no state is kept (tree_ops.cu sends trees of up to 64 nodes here).
#include "ggml-cuda/common.cuh"
#include "ggml_ext_gdn.h"
#include "ggml_ext_gdn_chain_cuda.cuh"
#include "launch.cuh"

#include <cstdlib>

namespace {

constexpr int kL = 64;             // tokens a chunk
constexpr int kLP = kL + 4;        // row stride of the L x L matrices in shared memory (banks)
constexpr int kThreads = 256;      // both kernels
constexpr int kApplyColumns = 16;  // state columns an apply block

template <int S>
constexpr int kRowStride = S + 4;  // k and q rows in shared memory: 16-byte aligned, 4 banks apart

// per (sequence, head, chunk): T [L][L], P [L][L], G [L]
constexpr int64_t kPrepFloats = 2 * kL * kL + kL;

template <int S>
constexpr size_t prep_smem_bytes() {  // + a tree's ancestor masks and parents
    return sizeof(float) * (2 * kL * kRowStride<S> + kL * kLP + 2 * kL) + (sizeof(uint64_t) + sizeof(int)) * kL;
}

template <int S>
constexpr size_t apply_smem_bytes() {
    constexpr int qt = kL * kRowStride<S> > 2 * kL * kLP ? kL * kRowStride<S> : 2 * kL * kLP;
    return sizeof(float) * (kL * kRowStride<S> + qt + S * kApplyColumns + 2 * kL * kApplyColumns + 3 * kL);
}

// put(i, load(i)) for i < count, the block's threads kBatch loads at a time each: all of a batch's
// loads are issued before the first store waits on one (a loop that stores each value it loads
// pays a memory round trip an iteration: 30 us of a 64-token chunk's 46 in the first version).
template <int kBatch, typename Load, typename Put>
__device__ __forceinline__ void batched_copy(const int count, const Load & load, const Put & put) {
    for (int base = threadIdx.x; base < count; base += kBatch * kThreads) {
        float r[kBatch];
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
            const int i = base + j * kThreads;
            r[j] = i < count ? load(i) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < kBatch; ++j) {
            const int i = base + j * kThreads;
            if (i < count) put(i, r[j]);
        }
    }
}

// A chunk's first n k and q rows into shared memory (the rows past n are never read).
template <int S>
__device__ __forceinline__ void load_kq(const GdnChainArgs & a, int64_t seq, int64_t h, int64_t t0, int n, float * sK,
                                        float * sQ) {
    const int64_t iq1 = h % a.neqk1, iq3 = seq / a.rq3;
    const float * kb = a.k + iq3 * a.sq3 + t0 * a.sq2 + iq1 * a.sq1;
    const float * qb = a.q + iq3 * a.sq3 + t0 * a.sq2 + iq1 * a.sq1;
    const int half = n * S;  // k's values, then q's
    batched_copy<32>(
        2 * half,
        [&](int i) {
            const int j = i % half;
            return (i < half ? kb : qb)[(j / S) * a.sq2 + j % S];
        },
        [&](int i, float x) {
            const int j = i % half;
            (i < half ? sK : sQ)[(j / S) * kRowStride<S> + j % S] = x;
        });
}

template <int S>
__device__ __forceinline__ void dot2(const float * x, const float * y, const float * z, float & xy, float & zy) {
    float a = 0.0f, b = 0.0f;
#pragma unroll 8
    for (int d = 0; d < S; d += 4) {
        const float4 xv = *reinterpret_cast<const float4 *>(x + d);
        const float4 yv = *reinterpret_cast<const float4 *>(y + d);
        const float4 zv = *reinterpret_cast<const float4 *>(z + d);
        a += xv.x * yv.x + xv.y * yv.y + xv.z * yv.z + xv.w * yv.w;
        b += zv.x * yv.x + zv.y * yv.y + zv.z * yv.z + zv.w * yv.w;
    }
    xy = a;
    zy = b;
}

// grid (H, n_seqs, chunks): a chunk's G, P and T into `prep`.
template <int S>
__global__ void __launch_bounds__(kThreads) gdn_chunk_prep_kernel(const GdnChainArgs a, float * __restrict__ prep) {
    DFLASH_DYNAMIC_SMEM(smem);
    float * sK = smem;
    float * sQ = sK + kL * kRowStride<S>;
    float * sA = sQ + kL * kRowStride<S>;
    float * sG = sA + kL * kLP;
    float * sB = sG + kL;
    uint64_t * sAnc = reinterpret_cast<uint64_t *>(sB + kL);  // a tree's nodes: bit i for ancestor i
    int * sPar = reinterpret_cast<int *>(sAnc + kL);
    const int64_t h = blockIdx.x, seq = blockIdx.y, chunk = blockIdx.z, t0 = chunk * kL;
    const int n = (int)(a.n_tokens - t0 < kL ? a.n_tokens - t0 : kL);
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
    float * out = prep + ((seq * a.H + h) * gridDim.z + chunk) * kPrepFloats;

    // a token's gate, beta (and a tree node's parent) in flight with k and q
    const bool tree = a.parents != nullptr;
    const int64_t gb = seq * a.sb3 + (t0 + tid) * a.sb2 + h * a.sb1;
    const float g_t = tid < n ? a.g[gb] : 0.0f, b_t = tid < n ? a.beta[gb] : 0.0f;
    const int p_t = tree && tid < n ? a.parents[tid] : -1;
    load_kq<S>(a, seq, h, t0, n, sK, sQ);
    for (int i = tid; i < kL * kLP; i += kThreads) sA[i] = 0.0f;
    if (tid < kL) {
        sG[tid] = g_t;
        sB[tid] = b_t;
        sPar[tid] = p_t < tid ? p_t : -1;  // parents come first (tree_builder.h); never read past a node
    }
    __syncthreads();
    if (tree) {  // one chunk: G and the ancestors along the parents, in order
        if (tid == 0) {
            for (int t = 0; t < n; ++t) {
                const int p = sPar[t];
                sG[t] += p >= 0 ? sG[p] : 0.0f;
                sAnc[t] = p >= 0 ? sAnc[p] | (uint64_t{1} << p) : 0;
            }
        }
    } else if (warp == 0) {  // a chain's G: the gates' running sum, two tokens a lane
        float lo = sG[lane], hi = sG[lane + 32];
#pragma unroll
        for (int o = 1; o < WARP_SIZE; o *= 2) {
            const float l = __shfl_up_sync(0xffffffff, lo, o), u = __shfl_up_sync(0xffffffff, hi, o);
            if (lane >= o) {
                lo += l;
                hi += u;
            }
        }
        hi += __shfl_sync(0xffffffff, lo, WARP_SIZE - 1);
        sG[lane] = lo;
        sG[lane + 32] = hi;
    }
    __syncthreads();

    // A and P over the pairs i <= t, enumerated row by row
    const int pairs = n * (n + 1) / 2;
    for (int p = tid; p < pairs; p += kThreads) {
        int t = (int)((sqrtf(8.0f * (float)p + 1.0f) - 1.0f) * 0.5f);
        while (t * (t + 1) / 2 > p) --t;
        while ((t + 1) * (t + 2) / 2 <= p) ++t;
        const int i = p - t * (t + 1) / 2;
        if (a.parents != nullptr && i < t && !((sAnc[t] >> i) & 1)) {  // not on t's path: zero
            out[kL * kL + t * kL + i] = 0.0f;
            continue;
        }
        float kk, qk;
        dot2<S>(sK + t * kRowStride<S>, sK + i * kRowStride<S>, sQ + t * kRowStride<S>, kk, qk);
        const float decay = expf(sG[t] - sG[i]);
        if (i < t) sA[t * kLP + i] = sB[t] * decay * kk;
        out[kL * kL + t * kL + i] = decay * qk;
    }
    __syncthreads();

    // T = (I + A)^-1, A strictly lower: warp w the columns 8w..8w+7, lane l the rows l and l + 32;
    // row s of T is final at step s and is subtracted, times A[u][s], from every row u below it
    // (A[u][s] = 0 for u <= s, so every row takes the update unconditionally)
    constexpr int kCols = kL / (kThreads / WARP_SIZE);
    float x[2][kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
        x[0][c] = lane == warp * kCols + c ? 1.0f : 0.0f;
        x[1][c] = lane + 32 == warp * kCols + c ? 1.0f : 0.0f;
    }
    for (int s = 0; s < n; ++s) {
        const float a0 = sA[lane * kLP + s], a1 = sA[(lane + 32) * kLP + s];
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
            const float xs = __shfl_sync(0xffffffff, s < 32 ? x[0][c] : x[1][c], s % 32);
            x[0][c] -= a0 * xs;
            x[1][c] -= a1 * xs;
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int u = lane + 32 * r;
        if (u < n) {
#pragma unroll
            for (int c = 0; c < kCols; ++c) out[u * kL + warp * kCols + c] = x[r][c];
        }
    }
    if (tid < n) out[2 * kL * kL + tid] = sG[tid];
}

// grid (H, n_seqs, S / C): the chunks of a head, one after another, for state columns c0..c0+C-1.
template <int S>
__global__ void __launch_bounds__(kThreads)
    gdn_chunk_apply_kernel(const GdnChainArgs a, const float * __restrict__ prep) {
    constexpr int C = kApplyColumns, KS = kRowStride<S>;
    constexpr int qt = kL * KS > 2 * kL * kLP ? kL * KS : 2 * kL * kLP;
    DFLASH_DYNAMIC_SMEM(smem);
    float * sK = smem;
    float * sQ = sK + kL * KS;  // q until M0^T q is made, then T and P
    float * sT = sQ;
    float * sP = sQ + kL * kLP;
    float * sM = sQ + qt;      // [S][C] the state's columns
    float * sR = sM + S * C;   // [L][C] v, then R
    float * sD = sR + kL * C;  // [L][C] D, then D scaled for the state
    float * sG = sD + kL * C;
    float * sB = sG + kL;
    float * sW = sB + kL;
    const int64_t h = blockIdx.x, seq = blockIdx.y, c0 = (int64_t)blockIdx.z * C;
    const int64_t chunks = (a.n_tokens + kL - 1) / kL;
    const int tid = threadIdx.x;
    const int t = tid / (C / 4), c4 = (tid % (C / 4)) * 4;  // a thread's token and 4 columns
    constexpr int kMPer = S * C / kThreads;                 // state values a thread updates
    const int md = tid / (C / kMPer), mc = (tid % (C / kMPer)) * kMPer;
    static_assert(kL * C == 4 * kThreads && S * C % kThreads == 0 && C % kMPer == 0, "thread mapping");

    const float * init = a.s0 + (seq * a.H + h) * S * S;
    batched_copy<S * C / kThreads>(
        S * C, [&](int i) { return init[(c0 + i / S) * S + i % S]; },
        [&](int i, float x) { sM[(i % S) * C + i / S] = x; });
    for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        const int64_t t0 = chunk * kL;
        const int n = (int)(a.n_tokens - t0 < kL ? a.n_tokens - t0 : kL);
        const float * pc = prep + ((seq * a.H + h) * chunks + chunk) * kPrepFloats;
        __syncthreads();  // the previous chunk's reads of sK, sD and sM are done
        {                 // v, G and beta in flight together, then k and q
            const float g_t = tid < n ? pc[2 * kL * kL + tid] : 0.0f;
            const float b_t = tid < n ? a.beta[seq * a.sb3 + (t0 + tid) * a.sb2 + h * a.sb1] : 0.0f;
            const float * vb = a.v + seq * a.sv3 + t0 * a.sv2 + h * a.sv1 + c0;
            batched_copy<kL * C / kThreads>(
                n * C, [&](int i) { return vb[(i / C) * a.sv2 + i % C]; }, [&](int i, float x) { sR[i] = x; });
            if (tid < kL) {
                sG[tid] = g_t;
                sB[tid] = b_t;
            }
        }
        load_kq<S>(a, seq, h, t0, n, sK, sQ);
        __syncthreads();

        // M0^T k_t and M0^T q_t for this thread's token and columns
        float y[4] = {}, z[4] = {};
        if (t < n) {
            for (int d = 0; d < S; d += 4) {
                const float4 kv = *reinterpret_cast<const float4 *>(sK + t * KS + d);
                const float4 qv = *reinterpret_cast<const float4 *>(sQ + t * KS + d);
                const float kd[4] = {kv.x, kv.y, kv.z, kv.w}, qd[4] = {qv.x, qv.y, qv.z, qv.w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const float4 m = *reinterpret_cast<const float4 *>(sM + (d + j) * C + c4);
                    y[0] += kd[j] * m.x, y[1] += kd[j] * m.y, y[2] += kd[j] * m.z, y[3] += kd[j] * m.w;
                    z[0] += qd[j] * m.x, z[1] += qd[j] * m.y, z[2] += qd[j] * m.z, z[3] += qd[j] * m.w;
                }
            }
        }
        const float eg = t < n ? expf(sG[t]) : 0.0f;
        float o[4];
        __syncthreads();  // sQ and sR are read; T and P go where q was
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            if (t < n) sR[t * C + c4 + c] = sB[t] * (sR[t * C + c4 + c] - eg * y[c]);
            o[c] = eg * z[c];
        }
        batched_copy<16>(  // T's rows, then P's (rows past n are never read)
            2 * n * kL, [&](int i) { return pc[i < n * kL ? i : kL * kL + i - n * kL]; },
            [&](int i, float x) {
                const int j = i < n * kL ? i : i - n * kL;
                (i < n * kL ? sT : sP)[(j / kL) * kLP + j % kL] = x;
            });
        __syncthreads();

        // D = T R (T lower triangular, unit diagonal)
        float dl[4] = {};
        if (t < n) {
            for (int i = 0; i <= t; ++i) {
                const float w = sT[t * kLP + i];
                const float4 r = *reinterpret_cast<const float4 *>(sR + i * C + c4);
                dl[0] += w * r.x, dl[1] += w * r.y, dl[2] += w * r.z, dl[3] += w * r.w;
            }
        }
#pragma unroll
        for (int c = 0; c < 4; ++c) sD[t * C + c4 + c] = dl[c];
        if (tid < kL) sW[tid] = tid < n ? expf(sG[n - 1] - sG[tid]) : 0.0f;
        __syncthreads();

        // the outputs
        if (t < n) {
            for (int i = 0; i <= t; ++i) {
                const float w = sP[t * kLP + i];
                const float4 dv = *reinterpret_cast<const float4 *>(sD + i * C + c4);
                o[0] += w * dv.x, o[1] += w * dv.y, o[2] += w * dv.z, o[3] += w * dv.w;
            }
            float * dst = a.dst + ((seq * a.n_tokens + t0 + t) * a.H + h) * S + c0 + c4;
#pragma unroll
            for (int c = 0; c < 4; ++c) dst[c] = o[c] * a.scale;
        }
        __syncthreads();  // D is read
#pragma unroll
        for (int c = 0; c < 4; ++c) sD[t * C + c4 + c] *= sW[t];
        __syncthreads();

        if (!a.write_state && chunk + 1 == chunks) break;  // a tree's outputs are all it gives
        // the state after the chunk: each thread its own kMPer values of row md
        const float decay = expf(sG[n - 1]);
        float m[kMPer];
#pragma unroll
        for (int j = 0; j < kMPer; ++j) m[j] = decay * sM[md * C + mc + j];
        for (int i = 0; i < n; ++i) {
            const float kd = sK[i * KS + md];
#pragma unroll
            for (int j = 0; j < kMPer; ++j) m[j] += kd * sD[i * C + mc + j];
        }
#pragma unroll
        for (int j = 0; j < kMPer; ++j) sM[md * C + mc + j] = m[j];
    }
    if (!a.write_state) return;
    __syncthreads();
    float * st = a.state + (seq * a.H + h) * S * S;
    for (int i = tid; i < S * C; i += kThreads) {
        const int c = i / S, r = i % S;
        st[(c0 + c) * S + r] = sM[r * C + c];
    }
}

bool chunked_flag = [] {  // off by default: slower than the chain kernel on the H200 (see the top)
    const char * e = std::getenv("DFLASH_GDN_CHUNKED");
    return e && e[0] == '1';
}();
int min_tokens_flag = [] {
    const char * e = std::getenv("DFLASH_GDN_CHUNKED_MIN");
    const int v = e ? std::atoi(e) : 0;
    return v > 0 ? v : ggml_ext::kChunkedDeltaRuleMinTokens;
}();

template <int S>
void launch(const GdnChainArgs & a, float * prep, cudaStream_t stream) {
    const unsigned chunks = (unsigned)((a.n_tokens + kL - 1) / kL);
    constexpr size_t prep_bytes = prep_smem_bytes<S>(), apply_bytes = apply_smem_bytes<S>();
    static const bool attrs = [] {  // past the 48 KiB a block gets without asking
        cudaFuncSetAttribute(gdn_chunk_prep_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)prep_bytes);
        cudaFuncSetAttribute(gdn_chunk_apply_kernel<S>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)apply_bytes);
        return true;
    }();
    (void)attrs;
    DFLASH_LAUNCH(dim3((unsigned)a.H, (unsigned)a.n_seqs, chunks), dim3(kThreads), prep_bytes, stream,
                  gdn_chunk_prep_kernel<S>)(a, prep);
    DFLASH_LAUNCH(dim3((unsigned)a.H, (unsigned)a.n_seqs, (unsigned)(S / kApplyColumns)), dim3(kThreads), apply_bytes,
                  stream, gdn_chunk_apply_kernel<S>)(a, prep);
}

}  // namespace

namespace ggml_ext {
void set_gdn_chunked(bool on) { chunked_flag = on; }
bool gdn_chunked() { return chunked_flag; }
void set_gdn_chunked_min_tokens(int n) { min_tokens_flag = n > 0 ? n : kChunkedDeltaRuleMinTokens; }
int gdn_chunked_min_tokens() { return min_tokens_flag; }
}  // namespace ggml_ext

bool ggml_ext_cuda_gated_delta_net_chunked(const GdnChainArgs & a, ggml_backend_cuda_context & ctx) {
    if (!chunked_flag || a.n_tokens < min_tokens_flag || a.n_tokens > ggml_ext::kChunkedDeltaRuleMaxTokens) {
        return false;
    }
    if (a.parents != nullptr && (a.n_tokens > kL || a.n_seqs != 1)) return false;
    if (a.S != 64 && a.S != 128) return false;
    const int64_t chunks = (a.n_tokens + kL - 1) / kL;
    ggml_cuda_pool_alloc<float> prep(ctx.pool(), (size_t)(a.n_seqs * a.H * chunks * kPrepFloats));
    if (a.S == 64) {
        launch<64>(a, prep.get(), ctx.stream());
    } else {
        launch<128>(a, prep.get(), ctx.stream());
    }
    return true;
}
