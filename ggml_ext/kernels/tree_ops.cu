// CUDA kernels of the tree ops (compiled into ggml-cuda).
//
// Tree delta rule, two forms with the same per-node arithmetic (delta_rule_step.cuh), hence the
// same bits. Like ggml's gated_delta_net kernel a warp owns columns of a head's S x S state
// (lanes split the rows).
// - walk: one warp visits every node in depth-first preorder. A node whose parent was the node
//   just visited continues from the registers; otherwise it reloads its parent's state from a
//   per-depth stack (thread-local memory). O(n) updates, but n of them one after another.
// - paths: the preorder cut into segments, each a run of nodes that are each the previous one's
//   child (a segment ends at a leaf: one segment a leaf). One warp a segment replays the
//   segment's ancestors from the cached state (their outputs are other segments' to write), then
//   its segment. More updates in all (ancestors again), but the longest chain of them is the
//   tree's depth, not its node count: for grids that leave the GPU mostly idle (the trained
//   pair's 8 heads of 64: 128 blocks a layer) the latency is what counts.
// Neither writes per-node states to global memory (the commit replays the accepted path).
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

struct TreeGdnArgs {
    const float *q, *k, *v, *g, *beta, *s0;
    const int32_t * tree;  // the tree index: parents, preorder, depths (n each)
    float * dst;
    int64_t H, Hk, n, sq1, sq2, sk1, sk2, sv1, sv2;  // strides in floats
    float scale;
};

// One warp's share of a head: C state columns from col0 (the chain kernel's reason, gdn_chain.cu:
// k and q are loaded once for C columns); a column's arithmetic is the chain kernel's
// (delta_rule_step.cuh), so a node's outputs are bit-equal to a decode step's on the same state.
template <int S, int C>
struct TreeGdnWarp {
    static constexpr int warp = S < 32 ? S : 32;
    static constexpr int rows = S / warp;  // rows of a column held by each lane
    using State = float[C][rows];
    const TreeGdnArgs & a;
    int64_t h, hk;
    int lane, col0;

    __device__ TreeGdnWarp(const TreeGdnArgs & args)
        : a(args),
          h(blockIdx.x),
          hk(blockIdx.x % args.Hk),
          lane(threadIdx.x),
          col0((blockIdx.z * blockDim.y + threadIdx.y) * C) {}

    // the cached state, stored transposed (row `col` = column col of S) as in ggml
    __device__ void load_initial(State & st) const {
        const float * init = a.s0 + h * S * S;
#pragma unroll
        for (int c = 0; c < C; ++c) {
#pragma unroll
            for (int r = 0; r < rows; ++r) st[c][r] = init[(col0 + c) * S + r * warp + lane];
        }
    }

    using Inputs = DeltaRuleInputs<warp, rows, C>;

    // a node's update with its inputs loaded at the top (delta_rule_step.cuh: S < 64)
    __device__ void step(State & st, int node, float (&o)[C]) const {
        const float * qn = a.q + node * a.sq2 + hk * a.sq1;
        const float * kn = a.k + node * a.sk2 + hk * a.sk1;
        // the gate first, then beta, k and q: the walk's order since session 12 (its arithmetic as
        // before, op for op)
        const float gv = expf(a.g[node * a.H + h]);
        const float bv = a.beta[node * a.H + h];
        float kr[rows], qr[rows];
        delta_rule_load_kq<warp, rows>(kn, qn, lane, kr, qr);
        delta_rule_core<warp, rows, C>(st, kr, qr, a.v + node * a.sv2 + h * a.sv1 + col0, gv, bv, o);
    }

    // a node's inputs, loaded a step ahead of their use
    __device__ void load(Inputs & in, int node) const {
        in.load(a.k + node * a.sk2 + hk * a.sk1, a.q + node * a.sq2 + hk * a.sq1, a.v + node * a.sv2 + h * a.sv1 + col0,
                a.g + node * a.H + h, a.beta + node * a.H + h, lane);
    }

    __device__ void store(int node, const float (&o)[C]) const {
        if (lane == 0) {
#pragma unroll
            for (int c = 0; c < C; ++c) a.dst[node * S * a.H + h * S + col0 + c] = o[c] * a.scale;
        }
    }
};

// The walk. A node's state is saved to the per-depth stack only when a later node other than the
// next one continues from it (two children or more: counted once per block in shared memory), so
// chains write no stack.
template <int S, int C>
__global__ void __launch_bounds__((S < 32 ? S : 32) * kWarps, kDeltaRuleMinBlocks<S>)
    tree_gdn_kernel(const TreeGdnArgs a) {
    using W = TreeGdnWarp<S, C>;
    const W w(a);
    const int64_t n = a.n;
    const int32_t * parent = a.tree;
    const int32_t * order = a.tree + n;
    const int32_t * depth = a.tree + 2 * n;

    // branch[i]: a node after node i's first child continues from i (pos: preorder positions);
    // trees of more than kCountedNodes nodes save every state
    __shared__ int16_t pos[kCountedNodes];
    __shared__ uint8_t branch[kCountedNodes];
    // the tree index itself, for the form that loads a step ahead
    __shared__ int32_t s_order[kDeltaRuleLoadAhead<W::rows, C> ? kCountedNodes : 1];
    __shared__ int32_t s_parent[kDeltaRuleLoadAhead<W::rows, C> ? kCountedNodes : 1];
    __shared__ uint8_t s_depth[kDeltaRuleLoadAhead<W::rows, C> ? kCountedNodes : 1];
    const int tid = threadIdx.y * blockDim.x + threadIdx.x, nthreads = blockDim.x * blockDim.y;
    const bool counted = n <= kCountedNodes;
    if (counted) {
        for (int i = tid; i < n; i += nthreads) {
            pos[order[i]] = (int16_t)i;
            branch[i] = 0;
            if constexpr (kDeltaRuleLoadAhead<W::rows, C>) {
                s_order[i] = order[i];
                s_parent[i] = parent[i];
                s_depth[i] = (uint8_t)depth[i];
            }
        }
        __syncthreads();
        for (int i = tid; i < n; i += nthreads) {
            const int p = parent[i];
            if (p >= 0 && pos[i] != pos[p] + 1) branch[p] = 1;  // the same value from every writer
        }
        __syncthreads();
    }
    if (w.col0 >= S) return;

    typename W::State st;
    float stack[ggml_ext::kTreeMaxDepth + 1][C][W::rows];
    int prev = -1;
    // Loading a step ahead, the tree index comes from shared memory where it fits (staged above):
    // the next node's address then waits on no global load.
    constexpr bool ahead = kDeltaRuleLoadAhead<W::rows, C>;
    const int32_t * O = ahead && counted ? s_order : order;
    const int32_t * P = ahead && counted ? s_parent : parent;
    typename W::Inputs in;
    if (ahead && n > 0) w.load(in, O[0]);
    for (int64_t t = 0; t < n; ++t) {
        const int node = O[t], p = P[node], d = ahead && counted ? s_depth[node] : depth[node];
        typename W::Inputs next;
        if (ahead && t + 1 < n) w.load(next, O[t + 1]);
        if (p < 0) {
            w.load_initial(st);
        } else if (p != prev) {
#pragma unroll
            for (int c = 0; c < C; ++c) {
#pragma unroll
                for (int r = 0; r < W::rows; ++r) st[c][r] = stack[d - 1][c][r];
            }
        }
        float o[C];
        if constexpr (ahead) {
            delta_rule_apply(st, in, o);
            in = next;
        } else {
            w.step(st, node, o);  // inputs loaded at the top of the step
        }
        if (!counted || branch[node]) {
#pragma unroll
            for (int c = 0; c < C; ++c) {
#pragma unroll
                for (int r = 0; r < W::rows; ++r) stack[d][c][r] = st[c][r];
            }
        }
        w.store(node, o);
        prev = node;
    }
}

// The paths, inputs loaded a step ahead (S >= 64). The block stages the tree's parents and preorder
// in shared memory (coalesced, once) and thread 0 lists the block's nodes from there: its segment's
// ancestors, root first, then the segment. Chasing the parents through global memory instead costs
// a round trip a level, microseconds for a deep segment, before the first update.
template <int S, int C>
__device__ __forceinline__ void tree_gdn_paths_ahead(const TreeGdnArgs & a) {
    using W = TreeGdnWarp<S, C>;
    const W w(a);
    const int32_t * parent = a.tree;
    const int32_t * order = a.tree + a.n;
    const int64_t t0 = blockIdx.y;
    const int first = order[t0];
    if (t0 > 0 && parent[first] == order[t0 - 1]) return;  // the whole block: no barrier is reached

    __shared__ int32_t s_parent[kCountedNodes], s_order[kCountedNodes];
    __shared__ int32_t seq[ggml_ext::kTreeMaxDepth + 2];  // a root-to-leaf path: depth + 1 nodes at most
    __shared__ int n_anc, n_seq;
    const bool staged = a.n <= kCountedNodes;
    const int tid = threadIdx.y * blockDim.x + threadIdx.x, nthreads = blockDim.x * blockDim.y;
    if (staged) {
        for (int i = tid; i < a.n; i += nthreads) {
            s_parent[i] = parent[i];
            s_order[i] = order[i];
        }
        __syncthreads();
    }
    if (tid == 0) {
        const int32_t * P = staged ? s_parent : parent;
        const int32_t * O = staged ? s_order : order;
        const int d0 = a.tree[2 * a.n + first];
        for (int p = P[first], j = d0 - 1; p >= 0 && j >= 0; p = P[p], --j) seq[j] = p;
        int m = d0;
        seq[m++] = first;
        for (int64_t t = t0 + 1; t < a.n && m < ggml_ext::kTreeMaxDepth + 2 && P[O[t]] == seq[m - 1]; ++t) {
            seq[m++] = O[t];
        }
        n_anc = d0;
        n_seq = m;
    }
    __syncthreads();
    if (w.col0 >= S) return;

    typename W::State st;
    w.load_initial(st);
    const int na = n_anc, ns = n_seq;
    typename W::Inputs in;
    w.load(in, seq[0]);
    for (int j = 0; j < ns; ++j) {
        typename W::Inputs next;
        if (j + 1 < ns) w.load(next, seq[j + 1]);
        float o[C];
        delta_rule_apply(st, in, o);
        if (j >= na) w.store(seq[j], o);  // ancestors' outputs are other blocks'
        in = next;
    }
}

// The paths. Block y: preorder position t. Blocks whose node continues the previous one's segment
// return at once (the whole block: no barrier follows).
template <int S, int C>
__global__ void __launch_bounds__((S < 32 ? S : 32) * kWarps, kDeltaRuleMinBlocks<S>)
    tree_gdn_paths_kernel(const TreeGdnArgs a) {
    if constexpr (kDeltaRuleLoadAhead<TreeGdnWarp<S, C>::rows, 1>) {  // any columns: see the header
        tree_gdn_paths_ahead<S, C>(a);
    } else {  // inputs loaded at the top of each step
        const TreeGdnWarp<S, C> w(a);
        const int32_t * parent = a.tree;
        const int32_t * order = a.tree + a.n;
        int64_t t = blockIdx.y;
        const int first = order[t];
        if ((t > 0 && parent[first] == order[t - 1]) || w.col0 >= S) return;

        int path[ggml_ext::kTreeMaxDepth];  // the segment's ancestors, root first
        const int d0 = a.tree[2 * a.n + first];
        for (int p = parent[first], j = d0 - 1; p >= 0 && j >= 0; p = parent[p], --j) path[j] = p;

        typename TreeGdnWarp<S, C>::State st;
        w.load_initial(st);
        float o[C];
        for (int j = 0; j < d0; ++j) w.step(st, path[j], o);
        for (int node = first;;) {
            w.step(st, node, o);
            w.store(node, o);
            if (++t >= a.n || parent[order[t]] != node) break;
            node = order[t];
        }
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
    auto f32 = [&](int i) { return (const float *)dst->src[i]->data; };
    if (ggml_ext::reordered_delta_rule_allowed(dst) && q->nb[1] == k->nb[1] && q->nb[2] == k->nb[2]) {
        // reordered sums, where the graph allows them (the chunked form when on, else one reduction
        // round a node): the tree as one sequence of n tokens whose parents say what precedes each,
        // outputs only
        GdnChainArgs a{};
        a.q = f32(0), a.k = f32(1), a.v = f32(2), a.g = f32(3), a.beta = f32(4), a.s0 = f32(5);
        a.dst = (float *)dst->data;
        a.S = S, a.H = H, a.n_tokens = n, a.n_seqs = 1;
        a.sq1 = q->nb[1] / fs, a.sq2 = q->nb[2] / fs;  // q and k: head, node
        a.sv1 = v->nb[1] / fs, a.sv2 = v->nb[2] / fs;
        a.sb1 = 1, a.sb2 = H;  // gate and beta [1, H, n], contiguous
        a.neqk1 = Hk, a.rq3 = 1, a.scale = scale;
        a.parents = (const int32_t *)dst->src[6]->data;
        a.write_state = false;
        if (ggml_ext_cuda_gated_delta_net_chunked(a, ctx) || ggml_ext_cuda_gated_delta_net_one_round(a, ctx.stream())) {
            return;
        }
    }
    const int warp = S < 32 ? (int)S : 32;
    const int walk_cols = gdn_columns_for(S, H);  // gdn_chain.cu
    const bool paths = tree_gdn_paths_for(H * ((S + kWarps * walk_cols - 1) / (kWarps * walk_cols)), n);
    // The paths' warps: a segment a block row, about one for every four nodes (a guess: the tree
    // is on the device); more columns a warp when that many blocks would queue in waves.
    const int cols = paths ? gdn_columns_for(S, H * ((n + 3) / 4)) : walk_cols;
    const unsigned groups = (unsigned)((S + kWarps * cols - 1) / (kWarps * cols));
    const dim3 block(warp, kWarps, 1);
    const dim3 grid((unsigned)H, paths ? (unsigned)n : 1u, groups);
    const TreeGdnArgs args{f32(0),
                           f32(1),
                           f32(2),
                           f32(3),
                           f32(4),
                           f32(5),
                           (const int32_t *)dst->src[6]->data,
                           (float *)dst->data,
                           H,
                           Hk,
                           n,
                           q->nb[1] / fs,
                           q->nb[2] / fs,
                           k->nb[1] / fs,
                           k->nb[2] / fs,
                           v->nb[1] / fs,
                           v->nb[2] / fs,
                           scale};
    auto launch = [&](auto kernel) { DFLASH_LAUNCH(grid, block, 0, ctx.stream(), kernel)(args); };
    auto launch_s = [&](auto s_tag) {
        constexpr int kS = decltype(s_tag)::value;
        if (cols == 1) {
            launch(paths ? tree_gdn_paths_kernel<kS, 1> : tree_gdn_kernel<kS, 1>);
        } else if (cols == 2) {
            launch(paths ? tree_gdn_paths_kernel<kS, 2> : tree_gdn_kernel<kS, 2>);
        } else {
            launch(paths ? tree_gdn_paths_kernel<kS, 4> : tree_gdn_kernel<kS, 4>);
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
