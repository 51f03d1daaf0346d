// CUDA kernels of the tree ops (compiled into ggml-cuda).
//
// Tree delta rule: like ggml's gated_delta_net kernel one warp owns one column of a head's
// S x S state (lanes split the rows), but nodes are visited in depth-first preorder. A node
// whose parent was the node just visited continues from the registers; otherwise it reloads its
// parent's state from a per-depth stack (thread-local memory, one slot per depth). O(n) state
// updates, no per-node state written to global memory.
#include "ggml_ext_tree.h"
#include "ggml_ext_tree_cuda.cuh"
#include "launch.cuh"
#include "tree_conv_taps.h"

namespace {

constexpr int kWarps = 4;  // columns per block

__global__ void tree_ssm_conv_kernel(const float * __restrict__ x, const float * __restrict__ cs,
                                     const float * __restrict__ w, const int32_t * __restrict__ parent,
                                     float * __restrict__ out, int64_t C, int64_t sx, int64_t n, int K) {
    const int64_t i = blockIdx.y;
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    constexpr int kMaxK = 8;
    int64_t src[kMaxK];
    tree_conv_taps(parent, i, K, src);
    float sum = 0.0f;
    for (int j = 0; j < K; ++j) {
        const float xv = src[j] >= 0 ? x[src[j] * sx + c] : cs[c * (K - 1) + (-1 - src[j])];
        sum += xv * w[c * K + j];
    }
    out[i * C + c] = sum;
}

template <int S>
__global__ void __launch_bounds__((S < 32 ? S : 32) * kWarps)
    tree_gdn_kernel(const float * __restrict__ q, const float * __restrict__ k, const float * __restrict__ v,
                    const float * __restrict__ g, const float * __restrict__ beta, const float * __restrict__ s0,
                    const int32_t * __restrict__ tree, float * __restrict__ dst, int64_t H, int64_t Hk, int64_t n,
                    int64_t sq1, int64_t sq2, int64_t sk1, int64_t sk2, int64_t sv1, int64_t sv2, float scale) {
    constexpr int warp = S < 32 ? S : 32;
    constexpr int rows = S / warp;  // rows of the column held by each lane
    const int64_t h = blockIdx.x;
    const int64_t hk = h % Hk;
    const int lane = threadIdx.x;
    const int col = blockIdx.z * blockDim.y + threadIdx.y;
    if (col >= S) return;
    const int32_t * parent = tree;
    const int32_t * order = tree + n;
    const int32_t * depth = tree + 2 * n;

    // state is stored transposed (row `col` = column col of S), as in ggml
    const float * init = s0 + h * S * S + col * S;
    float st[rows];
    float stack[ggml_ext::kTreeMaxDepth + 1][rows];
    int prev = -1;

    for (int64_t t = 0; t < n; ++t) {
        const int node = order[t], p = parent[node], d = depth[node];
        if (p < 0) {
#pragma unroll
            for (int r = 0; r < rows; ++r) st[r] = init[r * warp + lane];
        } else if (p != prev) {
#pragma unroll
            for (int r = 0; r < rows; ++r) st[r] = stack[d - 1][r];
        }
        const float * qn = q + node * sq2 + hk * sq1;
        const float * kn = k + node * sk2 + hk * sk1;
        const float gv = expf(g[node * H + h]);
        const float bv = beta[node * H + h];
        float kr[rows], qr[rows];
        float kv = 0.0f;
#pragma unroll
        for (int r = 0; r < rows; ++r) {
            kr[r] = kn[r * warp + lane];
            qr[r] = qn[r * warp + lane];
            kv += st[r] * kr[r];
        }
        kv = warp_reduce_sum<warp>(kv);
        const float delta = (v[node * sv2 + h * sv1 + col] - gv * kv) * bv;
        float o = 0.0f;
#pragma unroll
        for (int r = 0; r < rows; ++r) {
            st[r] = gv * st[r] + kr[r] * delta;
            o += st[r] * qr[r];
            stack[d][r] = st[r];
        }
        o = warp_reduce_sum<warp>(o);
        if (lane == 0) dst[node * S * H + h * S + col] = o * scale;
        prev = node;
    }
}

}  // namespace

void ggml_ext_cuda_tree_ssm_conv(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * x = dst->src[0];
    const ggml_tensor * w = dst->src[2];
    const int64_t C = x->ne[0], n = x->ne[1];
    const int K = (int)w->ne[0];
    GGML_ASSERT(K <= 8);
    const dim3 block(128, 1, 1);
    const dim3 grid((unsigned)((C + 127) / 128), (unsigned)n, 1);
    DFLASH_LAUNCH(grid, block, 0, ctx.stream(), tree_ssm_conv_kernel)(
        (const float *)x->data, (const float *)dst->src[1]->data, (const float *)w->data,
        (const int32_t *)dst->src[3]->data, (float *)dst->data, C, (int64_t)(x->nb[1] / sizeof(float)), n, K);
}

void ggml_ext_cuda_tree_gated_delta_net(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    const int64_t S = v->ne[0], H = v->ne[1], n = v->ne[2], Hk = q->ne[1];
    const int64_t fs = sizeof(float);
    const float scale = 1.0f / sqrtf((float)S);
    const int warp = S < 32 ? (int)S : 32;
    const dim3 block(warp, kWarps, 1);
    const dim3 grid((unsigned)H, 1, (unsigned)((S + kWarps - 1) / kWarps));
    auto launch = [&](auto kernel) {
        DFLASH_LAUNCH(grid, block, 0, ctx.stream(), kernel)(
            (const float *)q->data, (const float *)k->data, (const float *)v->data, (const float *)dst->src[3]->data,
            (const float *)dst->src[4]->data, (const float *)dst->src[5]->data, (const int32_t *)dst->src[6]->data,
            (float *)dst->data, H, Hk, n, q->nb[1] / fs, q->nb[2] / fs, k->nb[1] / fs, k->nb[2] / fs, v->nb[1] / fs,
            v->nb[2] / fs, scale);
    };
    switch (S) {
        case 16:
            launch(tree_gdn_kernel<16>);
            break;
        case 32:
            launch(tree_gdn_kernel<32>);
            break;
        case 64:
            launch(tree_gdn_kernel<64>);
            break;
        case 128:
            launch(tree_gdn_kernel<128>);
            break;
        default:
            GGML_ABORT("tree_gated_delta_net: unsupported state size");  // excluded by supports_op
    }
}

bool ggml_ext_cuda_gdn_decode_inputs_supported(const ggml_tensor * op);  // gdn_decode.cu

bool ggml_ext_cuda_tree_supports_op(const ggml_tensor * op) {
    if (op->op == GGML_OP_TREE_SSM_CONV) return op->src[2]->ne[0] <= 8;
    if (op->op == GGML_OP_GDN_DECODE_INPUTS) return ggml_ext_cuda_gdn_decode_inputs_supported(op);
    const int64_t S = op->src[2]->ne[0];
    return S == 16 || S == 32 || S == 64 || S == 128;
}
