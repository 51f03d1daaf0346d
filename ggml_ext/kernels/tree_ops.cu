// CUDA kernels of the tree ops (compiled into ggml-cuda).
//
// Tree delta rule: like ggml's gated_delta_net kernel one warp owns one column of a head's
// S x S state (lanes split the rows), but nodes are visited in depth-first preorder. A node
// whose parent was the node just visited continues from the registers; otherwise it reloads its
// parent's state from a per-depth stack (thread-local memory, one slot per depth). O(n) state
// updates, no per-node state written to global memory.
#include "delta_rule_step.cuh"
#include "ggml_ext_gdn_chain_cuda.cuh"
#include "ggml_ext_tree.h"
#include "ggml_ext_tree_cuda.cuh"
#include "launch.cuh"
#include "tree_conv_taps.h"

#include <type_traits>

namespace {

constexpr int kWarps = 4;  // warps per block
constexpr int kCountedNodes = 1024;

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

// C columns a warp (the chain kernel's reason, gdn_chain.cu: k and q are loaded once for C
// columns); a column's arithmetic is the chain kernel's, so a node's outputs are bit-equal to a
// decode step's on the same state. A node's state is saved to the per-depth stack only when a
// later node other than the next one continues from it (two children or more: counted once per
// block in shared memory), so chains write no stack.
template <int S, int C>
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
    const int col0 = (blockIdx.z * blockDim.y + threadIdx.y) * C;  // this warp's columns col0 .. col0 + C - 1
    const int32_t * parent = tree;
    const int32_t * order = tree + n;
    const int32_t * depth = tree + 2 * n;

    // branch[i]: a node after node i's first child continues from i (pos: preorder positions);
    // trees of more than kCountedNodes nodes save every state
    __shared__ int16_t pos[kCountedNodes];
    __shared__ uint8_t branch[kCountedNodes];
    const int tid = threadIdx.y * blockDim.x + threadIdx.x, nthreads = blockDim.x * blockDim.y;
    const bool counted = n <= kCountedNodes;
    if (counted) {
        for (int i = tid; i < n; i += nthreads) {
            pos[order[i]] = (int16_t)i;
            branch[i] = 0;
        }
        __syncthreads();
        for (int i = tid; i < n; i += nthreads) {
            const int p = parent[i];
            if (p >= 0 && pos[i] != pos[p] + 1) branch[p] = 1;  // the same value from every writer
        }
        __syncthreads();
    }
    if (col0 >= S) return;

    // state is stored transposed (row `col` = column col of S), as in ggml
    const float * init = s0 + h * S * S;
    float st[C][rows];
    float stack[ggml_ext::kTreeMaxDepth + 1][C][rows];
    int prev = -1;

    for (int64_t t = 0; t < n; ++t) {
        const int node = order[t], p = parent[node], d = depth[node];
        if (p < 0) {
#pragma unroll
            for (int c = 0; c < C; ++c) {
#pragma unroll
                for (int r = 0; r < rows; ++r) st[c][r] = init[(col0 + c) * S + r * warp + lane];
            }
        } else if (p != prev) {
#pragma unroll
            for (int c = 0; c < C; ++c) {
#pragma unroll
                for (int r = 0; r < rows; ++r) st[c][r] = stack[d - 1][c][r];
            }
        }
        const float * qn = q + node * sq2 + hk * sq1;
        const float * kn = k + node * sk2 + hk * sk1;
        const float gv = expf(g[node * H + h]);
        const float bv = beta[node * H + h];
        float o[C];
        delta_rule_step<warp, rows, C>(st, kn, qn, v + node * sv2 + h * sv1 + col0, gv, bv, lane, o);
        if (!counted || branch[node]) {
#pragma unroll
            for (int c = 0; c < C; ++c) {
#pragma unroll
                for (int r = 0; r < rows; ++r) stack[d][c][r] = st[c][r];
            }
        }
        if (lane == 0) {
#pragma unroll
            for (int c = 0; c < C; ++c) dst[node * S * H + h * S + col0 + c] = o[c] * scale;
        }
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
    const int cols = gdn_columns_for(S, H);  // gdn_chain.cu
    const dim3 block(warp, kWarps, 1);
    const dim3 grid((unsigned)H, 1, (unsigned)((S + kWarps * cols - 1) / (kWarps * cols)));
    auto launch = [&](auto kernel) {
        DFLASH_LAUNCH(grid, block, 0, ctx.stream(), kernel)(
            (const float *)q->data, (const float *)k->data, (const float *)v->data, (const float *)dst->src[3]->data,
            (const float *)dst->src[4]->data, (const float *)dst->src[5]->data, (const int32_t *)dst->src[6]->data,
            (float *)dst->data, H, Hk, n, q->nb[1] / fs, q->nb[2] / fs, k->nb[1] / fs, k->nb[2] / fs, v->nb[1] / fs,
            v->nb[2] / fs, scale);
    };
    auto launch_s = [&](auto s_tag) {
        constexpr int kS = decltype(s_tag)::value;
        if (cols == 1) {
            launch(tree_gdn_kernel<kS, 1>);
        } else if (cols == 2) {
            launch(tree_gdn_kernel<kS, 2>);
        } else {
            launch(tree_gdn_kernel<kS, 4>);
        }
    };
    switch (S) {
        case 16:
            launch_s(std::integral_constant<int, 16>{});
            break;
        case 32:
            launch_s(std::integral_constant<int, 32>{});
            break;
        case 64:
            launch_s(std::integral_constant<int, 64>{});
            break;
        case 128:
            launch_s(std::integral_constant<int, 128>{});
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
