// CUDA kernels of the fused Gated DeltaNet inputs (ggml_ext_gdn.h). One token: block h < C / S takes
// head h's S channels (one thread each: the conv taps, the state shift, SiLU; a block sum for the
// L2 norm of q and k heads); the last block the gate and beta. The operations, and their order,
// of ggml's CUDA kernels for ssm_conv + silu, rms_norm + scale, add, softplus * a and sigmoid, so
// a decode step's values do not depend on the fusion (heads of up to 256 values: ggml's
// rms_norm block).
#include "ggml_ext_gdn.h"
#include "ggml_ext_tree_cuda.cuh"
#include "launch.cuh"
#include "tree_conv_taps.h"

#include <cstdlib>
#include <cstring>
#include <type_traits>

namespace {

// ggml's rms_norm_f32<256, do_scale> on a head of S <= 256 values, one a thread, then its fused
// scale: the same butterfly within each warp and over the warps' sums (lanes past the block's
// warps hold the zeros of ggml's idle threads), so the fused ops keep ggml's bits.
__device__ __forceinline__ float l2_normed(float y, int S, float eps_over_s, float inv_sqrt_s) {
    __shared__ float part[8];
    const int lane = threadIdx.x % 32, nwarps = S / 32;
    float ss = y * y;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffff, ss, o);
    if (lane == 0) part[threadIdx.x / 32] = ss;
    __syncthreads();
    ss = lane < nwarps ? part[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffff, ss, o);
    const float mean = ss / S;
    const float scale = rsqrtf(mean + eps_over_s);
    return inv_sqrt_s * (scale * y);
}

__global__ void gdn_decode_inputs_kernel(const float * __restrict__ x, const float * __restrict__ alpha,
                                         const float * __restrict__ beta, float * __restrict__ state,
                                         const float * __restrict__ w, const float * __restrict__ dt_bias,
                                         const float * __restrict__ a, float * __restrict__ out, const int C,
                                         const int K, const int S, const int Hk, const int Hv, const float eps_over_s,
                                         const float inv_sqrt_s) {
    const int h = blockIdx.x;
    if (h == C / S) {  // gate and beta
        for (int i = threadIdx.x; i < Hv; i += blockDim.x) {
            const float z = alpha[i] + dt_bias[i];
            out[C + i] = (z > 20.0f ? z : logf(1.0f + expf(z))) * a[i];
            out[C + Hv + i] = 1.0f / (1.0f + expf(-beta[i]));
        }
        return;
    }
    const int c = h * S + threadIdx.x;  // blockDim.x == S
    float * st = state + (int64_t)c * (K - 1);
    const float * wc = w + (int64_t)c * K;
    float sum = 0.0f;
    for (int i = 0; i < K - 1; ++i) sum += st[i] * wc[i];
    const float xv = x[c];
    sum += xv * wc[K - 1];
    for (int i = 0; i + 1 < K - 1; ++i) st[i] = st[i + 1];
    st[K - 2] = xv;
    float y = sum / (1.0f + expf(-sum));  // ggml_cuda_op_silu_single
    if (h < 2 * Hk) y = l2_normed(y, S, eps_over_s, inv_sqrt_s);
    out[c] = y;
}

// l2_normed for T tokens of a head at once (y[u]: token u's value of this thread's channel): each
// token's sums go through the same butterflies as l2_normed's, so each gets l2_normed's bits, and
// the block waits at one barrier for all T.
template <int T>
__device__ __forceinline__ void l2_normed_tokens(float (&y)[T], int S, float eps_over_s, float inv_sqrt_s) {
    __shared__ float part[8][T];
    const int lane = threadIdx.x % 32, nwarps = S / 32;
    float ss[T];
#pragma unroll
    for (int u = 0; u < T; ++u) ss[u] = y[u] * y[u];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
        for (int u = 0; u < T; ++u) ss[u] += __shfl_xor_sync(0xffffffff, ss[u], o);
    }
    if (lane == 0) {
#pragma unroll
        for (int u = 0; u < T; ++u) part[threadIdx.x / 32][u] = ss[u];
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < T; ++u) ss[u] = lane < nwarps ? part[lane][u] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
        for (int u = 0; u < T; ++u) ss[u] += __shfl_xor_sync(0xffffffff, ss[u], o);
    }
#pragma unroll
    for (int u = 0; u < T; ++u) {
        const float mean = ss[u] / S;
        const float scale = rsqrtf(mean + eps_over_s);
        y[u] = inv_sqrt_s * (scale * y[u]);
    }
}

constexpr int kMaxTaps = 8;  // the conv's K (a tree's taps; a chain's window in registers)

// T tokens a block of the n-token kernel: 1, 4, 8 or 16 (DFLASH_GDN_INPUTS_TOKENS), or 0 (the
// default): 8 from kInputsTokensAutoFrom tokens, else 1. With T, a head's weights are read once for
// T tokens and a chain's window of T + K - 1 columns once (one token a block reads K columns and
// the weights for each token: ~21 MB from L2 for the 27B's 64-token verify, ~7 us a layer on the
// H200, session 37), but the grid has T times fewer blocks. The same bits for every T. The 27B's
// kernel a forward on the H100 (session 38, bench/results/h100-s38-27b-kernels-*), 48 launches, us
// with T = 1 / 8 / 16: 146 / 221 / - at 16 tokens, 212 / 223 / 374 at 32, 353 / 262 / 392 at 64.
constexpr int kInputsTokensAutoFrom = 48;
int valid_inputs_tokens(int t) { return t == 1 || t == 4 || t == 8 || t == 16 ? t : 0; }
int inputs_tokens_flag = [] {
    const char * e = std::getenv("DFLASH_GDN_INPUTS_TOKENS");
    return valid_inputs_tokens(e ? std::atoi(e) : 0);
}();

// n tokens of a chain (mode 1, ggml_ext::gdn_verify_inputs) or nodes of a tree (kTree, mode 2):
// block (h, b) head h of tokens bT .. bT + T - 1, each token's window columns i..i+K-1 of [state, x]
// (a tree: the node's taps, tree_conv_taps); the state is read only. The last block of each
// token run its gates and betas; in a chain, blocks of the first run also write the state after
// the last token (an output). The operations of gdn_decode_inputs_kernel for each token.
template <bool kTree, int T>
__global__ void gdn_verify_inputs_kernel(const float * __restrict__ x, const float * __restrict__ alpha,
                                         const float * __restrict__ beta, const float * __restrict__ state,
                                         const float * __restrict__ w, const float * __restrict__ dt_bias,
                                         const float * __restrict__ a, const int32_t * __restrict__ parent,
                                         float * __restrict__ out, const int C, const int n, const int K, const int S,
                                         const int Hk, const int Hv, const int64_t sx, const int64_t sa,
                                         const int64_t sb, const float eps_over_s, const float inv_sqrt_s) {
    const int h = blockIdx.x, i0 = blockIdx.y * T, tn = min(T, n - i0);
    if (h == C / S) {
        for (int u = 0; u < tn; ++u) {
            const int i = i0 + u;
            for (int j = threadIdx.x; j < Hv; j += blockDim.x) {
                const float z = alpha[i * sa + j] + dt_bias[j];
                out[(int64_t)n * C + i * Hv + j] = (z > 20.0f ? z : logf(1.0f + expf(z))) * a[j];
                out[(int64_t)n * C + (int64_t)n * Hv + i * Hv + j] = 1.0f / (1.0f + expf(-beta[i * sb + j]));
            }
        }
        return;
    }
    const int c = h * S + threadIdx.x;  // blockDim.x == S
    const float * st = state + (int64_t)c * (K - 1);
    float wc[kMaxTaps];
#pragma unroll
    for (int j = 0; j < kMaxTaps; ++j) wc[j] = j < K ? w[(int64_t)c * K + j] : 0.0f;
    auto col = [&](int p) { return p < K - 1 ? st[p] : x[(p - (K - 1)) * sx + c]; };  // of [state, x]
    // a chain's columns i0 .. i0 + tn + K - 2 of [state, x], each read once
    float win[kTree ? 1 : T + kMaxTaps - 1];
    if constexpr (!kTree) {
#pragma unroll
        for (int p = 0; p < T + kMaxTaps - 1; ++p) win[p] = p < tn + K - 1 ? col(i0 + p) : 0.0f;
    }
    float y[T];
#pragma unroll
    for (int u = 0; u < T; ++u) {
        float sum = 0.0f;
        if (u < tn) {
            if constexpr (kTree) {
                int64_t src[kMaxTaps];
                tree_conv_taps(parent, i0 + u, K, src);
                for (int j = 0; j < K; ++j) sum += (src[j] >= 0 ? x[src[j] * sx + c] : st[-1 - src[j]]) * wc[j];
            } else {
#pragma unroll
                for (int j = 0; j < kMaxTaps; ++j) {
                    if (j < K) sum += win[u + j] * wc[j];
                }
            }
        }
        y[u] = sum / (1.0f + expf(-sum));  // ggml_cuda_op_silu_single
    }
    if (h < 2 * Hk) l2_normed_tokens<T>(y, S, eps_over_s, inv_sqrt_s);
#pragma unroll
    for (int u = 0; u < T; ++u) {
        if (u < tn) out[(int64_t)(i0 + u) * C + c] = y[u];
    }
    if (!kTree && i0 == 0) {
        float * tail = out + (int64_t)n * C + 2 * (int64_t)n * Hv + (int64_t)c * (K - 1);
        for (int j = 0; j < K - 1; ++j) tail[j] = col(n + j);
    }
}

}  // namespace

void ggml_ext_cuda_gdn_decode_inputs(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const int S = ((const int32_t *)dst->op_params)[0], Hk = ((const int32_t *)dst->op_params)[1];
    float norm[2];  // eps / S, 1 / sqrt(S)
    std::memcpy(norm, dst->op_params + 2, sizeof(norm));
    const int mode = dst->op_params[ggml_ext::kGdnInputsModeParam];
    if (mode != 0) {
        const ggml_tensor * x = dst->src[0];
        const int C = (int)x->ne[0], n = (int)x->ne[1], Hv = (int)dst->src[1]->ne[0], K = (int)dst->src[4]->ne[0];
        const int64_t fs = sizeof(float);
        const int32_t * parent = mode == 2 ? (const int32_t *)dst->src[7]->data : nullptr;
        auto launch = [&](auto kernel, int T) {
            const dim3 grid((unsigned)(C / S + 1), (unsigned)((n + T - 1) / T), 1);
            DFLASH_LAUNCH(grid, S, 0, ctx.stream(), kernel)(
                (const float *)x->data, (const float *)dst->src[1]->data, (const float *)dst->src[2]->data,
                (const float *)dst->src[3]->data, (const float *)dst->src[4]->data, (const float *)dst->src[5]->data,
                (const float *)dst->src[6]->data, parent, (float *)dst->data, C, n, K, S, Hk, Hv,
                (int64_t)(x->nb[1] / fs), (int64_t)(dst->src[1]->nb[1] / fs), (int64_t)(dst->src[2]->nb[1] / fs),
                norm[0], norm[1]);
        };
        auto launch_tokens = [&](auto tree_tag) {
            constexpr bool kTree = decltype(tree_tag)::value;
            const int tokens = inputs_tokens_flag != 0 ? inputs_tokens_flag : n >= kInputsTokensAutoFrom ? 8 : 1;
            switch (tokens) {
                case 4:
                    return launch(gdn_verify_inputs_kernel<kTree, 4>, 4);
                case 8:
                    return launch(gdn_verify_inputs_kernel<kTree, 8>, 8);
                case 16:
                    return launch(gdn_verify_inputs_kernel<kTree, 16>, 16);
                default:
                    return launch(gdn_verify_inputs_kernel<kTree, 1>, 1);
            }
        };
        mode == 2 ? launch_tokens(std::true_type{}) : launch_tokens(std::false_type{});
        CUDA_CHECK(cudaGetLastError());
        return;
    }
    const int C = (int)ggml_nelements(dst->src[0]), Hv = (int)ggml_nelements(dst->src[1]);
    const int K = (int)dst->src[4]->ne[0];
    DFLASH_LAUNCH(C / S + 1, S, 0, ctx.stream(), gdn_decode_inputs_kernel)(
        (const float *)dst->src[0]->data, (const float *)dst->src[1]->data, (const float *)dst->src[2]->data,
        (float *)dst->src[3]->data, (const float *)dst->src[4]->data, (const float *)dst->src[5]->data,
        (const float *)dst->src[6]->data, (float *)dst->data, C, K, S, Hk, Hv, norm[0], norm[1]);
    CUDA_CHECK(cudaGetLastError());
}

bool ggml_ext_cuda_gdn_decode_inputs_supported(const ggml_tensor * op) {
    const int64_t S = ((const int32_t *)op->op_params)[0];
    const bool tokens = op->op_params[ggml_ext::kGdnInputsModeParam] != 0;  // a chain's window, a tree's taps
    return S % 32 == 0 && S <= 256 && (!tokens || op->src[4]->ne[0] <= kMaxTaps);
}

namespace ggml_ext {
void set_gdn_inputs_tokens(int tokens) { inputs_tokens_flag = valid_inputs_tokens(tokens); }
int gdn_inputs_tokens() { return inputs_tokens_flag; }
}  // namespace ggml_ext
