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

#include <cstring>

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

// n tokens of a chain (mode 1, ggml_ext::gdn_verify_inputs) or nodes of a tree (kTree, mode 2):
// block (h, i) head h of token i, whose window is columns i..i+K-1 of [state, x] (a tree: the
// node's taps, tree_conv_taps); the state is read only. The last block of each token its gate and
// beta; in a chain, blocks of token 0 also write the state after the last token (an output).
template <bool kTree>
__global__ void gdn_verify_inputs_kernel(const float * __restrict__ x, const float * __restrict__ alpha,
                                         const float * __restrict__ beta, const float * __restrict__ state,
                                         const float * __restrict__ w, const float * __restrict__ dt_bias,
                                         const float * __restrict__ a, const int32_t * __restrict__ parent,
                                         float * __restrict__ out, const int C, const int n, const int K, const int S,
                                         const int Hk, const int Hv, const int64_t sx, const int64_t sa,
                                         const int64_t sb, const float eps_over_s, const float inv_sqrt_s) {
    const int h = blockIdx.x, i = blockIdx.y;
    if (h == C / S) {
        for (int j = threadIdx.x; j < Hv; j += blockDim.x) {
            const float z = alpha[i * sa + j] + dt_bias[j];
            out[(int64_t)n * C + i * Hv + j] = (z > 20.0f ? z : logf(1.0f + expf(z))) * a[j];
            out[(int64_t)n * C + (int64_t)n * Hv + i * Hv + j] = 1.0f / (1.0f + expf(-beta[i * sb + j]));
        }
        return;
    }
    const int c = h * S + threadIdx.x;  // blockDim.x == S
    const float * st = state + (int64_t)c * (K - 1);
    const float * wc = w + (int64_t)c * K;
    auto col = [&](int p) { return p < K - 1 ? st[p] : x[(p - (K - 1)) * sx + c]; };  // of [state, x]
    float sum = 0.0f;
    if constexpr (kTree) {
        constexpr int kMaxK = 8;
        int64_t src[kMaxK];
        tree_conv_taps(parent, i, K, src);
        for (int j = 0; j < K; ++j) sum += (src[j] >= 0 ? x[src[j] * sx + c] : st[-1 - src[j]]) * wc[j];
    } else {
        for (int j = 0; j < K; ++j) sum += col(i + j) * wc[j];
    }
    float y = sum / (1.0f + expf(-sum));  // ggml_cuda_op_silu_single
    if (h < 2 * Hk) y = l2_normed(y, S, eps_over_s, inv_sqrt_s);
    out[(int64_t)i * C + c] = y;
    if (!kTree && i == 0) {
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
        auto launch = [&](auto kernel) {
            DFLASH_LAUNCH(dim3((unsigned)(C / S + 1), (unsigned)n, 1), S, 0, ctx.stream(), kernel)(
                (const float *)x->data, (const float *)dst->src[1]->data, (const float *)dst->src[2]->data,
                (const float *)dst->src[3]->data, (const float *)dst->src[4]->data, (const float *)dst->src[5]->data,
                (const float *)dst->src[6]->data, parent, (float *)dst->data, C, n, K, S, Hk, Hv,
                (int64_t)(x->nb[1] / fs), (int64_t)(dst->src[1]->nb[1] / fs), (int64_t)(dst->src[2]->nb[1] / fs),
                norm[0], norm[1]);
        };
        mode == 2 ? launch(gdn_verify_inputs_kernel<true>) : launch(gdn_verify_inputs_kernel<false>);
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
    const bool tree = op->op_params[ggml_ext::kGdnInputsModeParam] == 2;
    return S % 32 == 0 && S <= 256 && (!tree || op->src[4]->ne[0] <= 8);  // a tree's taps: kMaxK
}
