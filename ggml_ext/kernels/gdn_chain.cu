// The delta rule over a chain of tokens with several state columns a warp.
//
// ggml's gated_delta_net kernel gives each warp one column of a head's S x S state, so every warp
// loads the token's whole k and q (2 S floats) for one column: at S = 128 the 27B's 48 heads x
// 128 warps read ~1 KB each per token, ~6 MB a token and layer from L2, and the kernel's time
// grows with the tokens at about that traffic (17.6 / 33 / 64 us a layer for 16 / 32 / 64 tokens
// on the H200, session 11). Here a warp owns C columns and loads k and q once for all of them:
// C times less of that traffic, the same arithmetic per column (the order of every sum, the
// butterfly of the warp reductions and the fused update are ggml's), so the outputs and states
// are bit-equal to ggml's kernel (tests/test_gdn_chain.py on the GPU; the batch-invariant mode
// relies on it against the tree kernel). C (gdn_columns_for): 4, 2 or 1, the most that still give
// 2 blocks a multiprocessor (the 27B: 4; the trained pair's 8 heads of 64: 1, where 4 made its
// DDTree steps slower, latency over traffic), 1 for S < 64 (one row a lane: there the compiler
// contracts a column's sums differently with more columns, not ggml's bits); ggml_ext::
// set_gdn_columns (or DFLASH_GDN_COLUMNS: 1, 2, 4) forces it, for benches and tests.
#include "ggml-cuda/common.cuh"
#include "ggml_ext_gdn.h"
#include "delta_rule_step.cuh"
#include "ggml_ext_gdn_chain_cuda.cuh"
#include "launch.cuh"

#include <cstdlib>
#include <string>

namespace {

constexpr int kChainWarps = 4;   // warps per block
constexpr int kChainChunk = 16;  // tokens staged in shared memory at a time (S >= 64)

template <int S, int C, bool kStaged>
__global__ void __launch_bounds__((S < 32 ? S : 32) * kChainWarps, kDeltaRuleMinBlocks<S>)
    gdn_chain_kernel(const float * __restrict__ q, const float * __restrict__ k, const float * __restrict__ v,
                     const float * __restrict__ g, const float * __restrict__ beta, const float * __restrict__ s0,
                     float * __restrict__ dst, float * __restrict__ state, const int64_t H, const int64_t n_tokens,
                     const int64_t sq1, const int64_t sq2, const int64_t sq3, const int64_t sv1, const int64_t sv2,
                     const int64_t sv3, const int64_t sb1, const int64_t sb2, const int64_t sb3, const int64_t neqk1,
                     const int64_t rq3, const float scale) {
    constexpr int warp = S < 32 ? S : 32;
    constexpr int rows = S / warp;  // rows of a column held by each lane
    const int64_t h = blockIdx.x, seq = blockIdx.y;
    const int64_t iq1 = h % neqk1, iq3 = seq / rq3;
    const int lane = threadIdx.x;
    const int col0 = (blockIdx.z * kChainWarps + threadIdx.y) * C;  // this warp's columns col0 .. col0 + C - 1
    if (col0 >= S) return;

    // states are stored transposed (row `col` = column col of S), as in ggml
    const float * init = s0 + (seq * H + h) * S * S;
    float st[C][rows];
#pragma unroll
    for (int c = 0; c < C; ++c) {
#pragma unroll
        for (int r = 0; r < rows; ++r) st[c][r] = init[(col0 + c) * S + r * warp + lane];
    }
    float * out = dst + (seq * n_tokens * H + h) * S;

    if constexpr (kStaged) {
        // Tokens staged in shared memory a chunk at a time: the block's warps share the head's k
        // and q, and a token's update then waits on no global load (its loads used to sit on the
        // dependent path between consecutive tokens' updates). The arithmetic is unchanged.
        constexpr int cols = kChainWarps * C;  // the block's state columns
        static_assert(S % cols == 0, "every warp has columns: the barriers below see all threads");
        __shared__ float s_k[kChainChunk][S], s_q[kChainChunk][S], s_v[kChainChunk][cols];
        __shared__ float s_g[kChainChunk], s_b[kChainChunk];
        const int tid = threadIdx.y * warp + lane;
        const int64_t col_block = (int64_t)blockIdx.z * cols;
        for (int64_t t0 = 0; t0 < n_tokens; t0 += kChainChunk) {
            const int tn = (int)(n_tokens - t0 < kChainChunk ? n_tokens - t0 : kChainChunk);
            __syncthreads();  // the previous chunk is read
            for (int i = tid; i < tn * S; i += warp * kChainWarps) {
                const int t = i / S, e = i % S;
                const int64_t qk = iq3 * sq3 + (t0 + t) * sq2 + iq1 * sq1 + e;
                s_k[t][e] = k[qk];
                s_q[t][e] = q[qk];
            }
            for (int i = tid; i < tn * cols; i += warp * kChainWarps) {
                const int t = i / cols, j = i % cols;
                s_v[t][j] = v[seq * sv3 + (t0 + t) * sv2 + h * sv1 + col_block + j];
            }
            if (tid < tn) {
                const int64_t gb = seq * sb3 + (t0 + tid) * sb2 + h * sb1;
                s_g[tid] = g[gb];
                s_b[tid] = beta[gb];
            }
            __syncthreads();
            for (int t = 0; t < tn; ++t) {
                float o[C];
                delta_rule_step<warp, rows, C>(st, s_k[t], s_q[t], &s_v[t][threadIdx.y * C], &s_g[t], s_b[t], lane, o);
                if (lane == 0) {
#pragma unroll
                    for (int c = 0; c < C; ++c) out[col0 + c] = o[c] * scale;
                }
                out += S * H;
            }
        }
    } else {  // each token's inputs from global memory (one row a lane: ggml's order, its bits there)
        using Inputs = DeltaRuleInputs<warp, rows, C>;
        constexpr bool ahead = kDeltaRuleLoadAhead<rows, C>;
        auto load = [&](Inputs & in, int64_t t) {
            const int64_t qk = iq3 * sq3 + t * sq2 + iq1 * sq1, gb = seq * sb3 + t * sb2 + h * sb1;
            in.load(k + qk, q + qk, v + seq * sv3 + t * sv2 + h * sv1 + col0, g + gb, beta + gb, lane);
        };
        Inputs in;
        if (ahead && n_tokens > 0) load(in, 0);
        for (int64_t t = 0; t < n_tokens; ++t) {
            float o[C];
            if constexpr (ahead) {
                Inputs next;  // the next token's loads in flight during this token's update
                if (t + 1 < n_tokens) load(next, t + 1);
                delta_rule_apply<warp, rows, C>(st, in, o);
                in = next;
            } else {
                const float * q_t = q + iq3 * sq3 + t * sq2 + iq1 * sq1;
                const float * k_t = k + iq3 * sq3 + t * sq2 + iq1 * sq1;
                const float * v_t = v + seq * sv3 + t * sv2 + h * sv1;
                const int64_t gb = seq * sb3 + t * sb2 + h * sb1;
                const float beta_val = beta[gb];
                delta_rule_step<warp, rows, C>(st, k_t, q_t, v_t + col0, g + gb, beta_val, lane, o);
            }
            if (lane == 0) {
#pragma unroll
                for (int c = 0; c < C; ++c) out[col0 + c] = o[c] * scale;
            }
            out += S * H;
        }
    }
    float * st_out = state + (seq * H + h) * S * S;
#pragma unroll
    for (int c = 0; c < C; ++c) {
#pragma unroll
        for (int r = 0; r < rows; ++r) st_out[(col0 + c) * S + r * warp + lane] = st[c][r];
    }
}

int env_columns() {
    const char * e = std::getenv("DFLASH_GDN_COLUMNS");
    const int c = e ? std::atoi(e) : 0;
    return c == 1 || c == 2 || c == 4 ? c : 0;
}

int columns_flag = env_columns();  // 0: by the grid (gdn_columns_for)
bool chain_flag = [] {
    const char * e = std::getenv("DFLASH_GDN_CHAIN");
    return !(e && e[0] == '0');
}();
bool staged_flag = [] {
    const char * e = std::getenv("DFLASH_GDN_STAGED");
    return !(e && e[0] == '0');
}();

int tree_mode_flag = [] {  // 0 auto, 1 walk, 2 paths (tree_ops.cu)
    const char * e = std::getenv("DFLASH_TREE_GDN");
    if (!e) return 0;
    const std::string m = e;
    return m == "walk" ? 1 : m == "paths" ? 2 : 0;
}();

int multiprocessors() {
#ifdef DFLASH_CUDA_EMU
    return 132;
#else
    return ggml_cuda_info().devices[ggml_cuda_get_device()].nsm;
#endif
}

template <int S, int C, bool kStaged>
void launch_kernel(const GdnChainArgs & a, cudaStream_t stream) {
    constexpr int warp = S < 32 ? S : 32;
    const dim3 block(warp, kChainWarps, 1);
    const dim3 grid((unsigned)a.H, (unsigned)a.n_seqs, (unsigned)((S + kChainWarps * C - 1) / (kChainWarps * C)));
    DFLASH_LAUNCH(grid, block, 0, stream, gdn_chain_kernel<S, C, kStaged>)(
        a.q, a.k, a.v, a.g, a.beta, a.s0, a.dst, a.state, a.H, a.n_tokens, a.sq1, a.sq2, a.sq3, a.sv1, a.sv2, a.sv3,
        a.sb1, a.sb2, a.sb3, a.neqk1, a.rq3, a.scale);
}

template <int S, int C>
void launch(const GdnChainArgs & a, cudaStream_t stream) {
    if constexpr (S >= 64) {  // staging needs every warp to hold columns (S a multiple of the block's)
        if (staged_flag) return launch_kernel<S, C, true>(a, stream);
    }
    launch_kernel<S, C, false>(a, stream);
}

template <int S>
void launch_columns(const GdnChainArgs & a, cudaStream_t stream) {
    switch (gdn_columns_for(S, a.H * a.n_seqs)) {
        case 1:
            launch<S, 1>(a, stream);
            break;
        case 2:
            launch<S, 2>(a, stream);
            break;
        default:
            launch<S, 4>(a, stream);
    }
}

}  // namespace

int gdn_columns_for(int64_t S, int64_t units) {
    if (S < 64) return 1;  // one row a lane: more columns contract the sums otherwise (not ggml's bits)
    if (columns_flag != 0) return columns_flag;
    const int64_t min_blocks = 2 * multiprocessors();
    for (int c = 4; c > 1; c /= 2) {
        if (units * ((S + kChainWarps * c - 1) / (kChainWarps * c)) >= min_blocks) return c;
    }
    return 1;
}

bool tree_gdn_paths_for(int64_t walk_blocks, int64_t n) {
    if (tree_mode_flag != 0) return tree_mode_flag == 2;
    return n > 1 && walk_blocks < multiprocessors();  // the walk leaves most of the GPU idle
}

namespace ggml_ext {
void set_tree_gdn_mode(int mode) { tree_mode_flag = mode == 1 || mode == 2 ? mode : 0; }
int tree_gdn_mode() { return tree_mode_flag; }
void set_gdn_columns(int columns) { columns_flag = columns == 1 || columns == 2 || columns == 4 ? columns : 0; }
int gdn_columns() { return columns_flag; }
void set_gdn_chain_enabled(bool on) { chain_flag = on; }
bool gdn_chain_enabled() { return chain_flag; }
void set_gdn_staged(bool on) { staged_flag = on; }
bool gdn_staged() { return staged_flag; }
}  // namespace ggml_ext

bool ggml_ext_cuda_gated_delta_net(const GdnChainArgs & a, cudaStream_t stream) {
    if (!chain_flag) return false;
    switch (a.S) {
        case 16:
            launch_columns<16>(a, stream);
            return true;
        case 32:
            launch_columns<32>(a, stream);
            return true;
        case 64:
            launch_columns<64>(a, stream);
            return true;
        case 128:
            launch_columns<128>(a, stream);
            return true;
        default:
            return false;
    }
}
