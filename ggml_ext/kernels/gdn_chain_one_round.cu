// The delta rule over a chain of tokens with one round of warp reductions a token, for nodes the
// graph marked as not needing a decode step's bits (ggml_ext::allow_reordered_delta_rule).
//
// The chain kernel (gdn_chain.cu) keeps ggml's arithmetic: a token reduces s . k over a column's
// S rows (a 32-lane butterfly), updates the column, then reduces s' . q (a second butterfly). Each
// token waits on the previous one's update, so a verify pays ~2 x 5 dependent shuffle levels a
// token: 11.7 us a 27B layer at 16 tokens on the H200 (session 20), for ~1 us of arithmetic.
// Here the output comes from the state before the update,
//   o = s'^T q = g s^T q + delta (k . q),   delta = beta (v - g s^T k),
// so s . k, s . q and k . q go through one butterfly together, and a column spreads over 8 lanes
// (S / 8 rows each, read as float4 from shared memory): 3 shuffle levels a token instead of 10.
// The sums run in another order than ggml's, so only marked nodes take it (float32 either way;
// tests hold it to the equations and to the chain kernel). One token keeps the chain kernel (a
// decode step's bits for decode graphs).
//
// A block: 16 state columns of one head, CL columns a lane (its k and q reads shared by them;
// 4 CL a warp). Tokens staged 16 at a time into shared memory with cp.async, the next chunk's
// copies in flight during the current chunk's updates. Needs 16-byte aligned q, k, v rows (else
// the chain kernel runs); S of 64 or 128.
// H200, the 27B's 48 layers (session 21, kernel_profile): CL = 1 took 469 / 798 / 1472 us at
// 16 / 32 / 64 tokens against the chain kernel's 563 / 1000 / 1867 (session 20), the DDTree b32
// tree 1205 us against the walk's 1476: ~850 cycles a token, where the shared-memory reads of k
// and q (each column's 8 lanes read all of them) looked the likely limit. CL = 2 / 4: 443 / 430 us
// at 16 tokens, 1391 / 1336 at 64, the tree 1361 / 1522: not the limit. ncu (CL = 2, 64 tokens):
// 275 instructions a warp and token, half of the FP32 ones unfused (a * b + c * d + ...), 1.55
// warps a scheduler, 44% of issue slots busy: the state's gate now lives apart from it (one FMA
// an element a token) and every product is an explicit FMA. That: CL = 2 432 / 727 / 1334 us at
// 16 / 32 / 64 tokens (CL = 1: 453 / 759 / 1405), the tree (b32) CL = 1 1200 us, CL = 2 1336.
// The kernel is still latency-bound (~1.5 warps a scheduler); next: more independent work a
// warp (two heads' columns, or the next token's k . q ahead).
//
// Session 37: a chain may take U = 2 or 4 tokens a step (DFLASH_GDN_ONE_ROUND_STEP; 1, the walk
// above, by default until timed). With the state U at the step's start (the true state G U), the
// step's gates' running products H_u, its k_u, q_u, and e_u = delta_u / H_u (what token u adds to U
// along k_u), the recurrence unrolls to
//   a_u = U^T k_u + sum_{i<u} e_i (k_i . k_u),   delta_u = beta_u (v_u - H_u a_u),
//   o_u = H_u (U^T q_u + sum_{i<=u} e_i (k_i . q_u)),   U += sum_u k_u e_u,  G = H_{U-1},
// so one butterfly reduces all of a step's dot products (2U a column, U(U+1)/2 + U(U-1)/2 Gram
// entries shared by the lane's columns) and the tokens' dependency is a few scalar multiply-adds:
// one round of shuffles a step instead of a token, for ~10% more instructions at U = 2. A step
// whose gates' product falls under kOrMinScale (decayed or zero gates) walks its tokens one by one;
// a chunk's last tokens under a whole step too. In a tree, a step is U nodes in preorder each the
// parent of the next, none but the last with its state saved for a later child; other nodes go
// one by one. 8 lanes a column.
//
// A DDTree verify's nodes (kTree; tree_ops.cu sends marked tree_gated_delta_net nodes of up to
// kOrMaxNodes here) are the tree walk's order: nodes in preorder, a node whose parent is not the
// node just visited continues from its parent's state saved on a per-depth stack (only nodes with
// a child that is not next in preorder save theirs); outputs only, no state out.
#include "async_copy.cuh"
#include "gdn_chunk_walk.cuh"
#include "ggml-cuda/common.cuh"
#include "ggml_ext_gdn.h"
#include "ggml_ext_gdn_chain_cuda.cuh"
#include "ggml_ext_tree.h"
#include "launch.cuh"

#include <cstdint>
#include <cstdlib>

namespace {

constexpr int kOrDefaultLanes = 8;  // lanes a state column (each S / L of its rows): 8 or 16
constexpr int kOrColumns = 16;      // state columns a block
constexpr int kOrChunk = 16;        // tokens staged at a time
constexpr int kOrMaxNodes = 1024;   // a tree's nodes (its index staged in shared memory)
constexpr int kOrMinTokens = 2;     // one token (a decode step, a replay of one) keeps the chain kernel's bits

// Columns a lane (CL; a warp 4 CL columns, a block 4 / CL warps): each lane's k and q reads serve
// CL columns. By the form (0): 2 for a chain, 1 for a tree (the H200's faster ones, the numbers
// above); DFLASH_GDN_ONE_ROUND_COLUMNS=1, 2 or 4 forces it (benches).
int valid_columns(int c) { return c == 1 || c == 2 || c == 4 ? c : 0; }
int or_columns_flag = [] {
    const char * e = std::getenv("DFLASH_GDN_ONE_ROUND_COLUMNS");
    return valid_columns(e ? std::atoi(e) : 0);
}();

// Lanes a state column (L): 8 by default, or DFLASH_GDN_ONE_ROUND_LANES=16 (each lane S / 16 rows:
// twice the warps on the same state, a shuffle level more a token); 0 is the default.
int valid_lanes(int l) { return l == 8 || l == 16 ? l : 0; }
int or_lanes_flag = [] {
    const char * e = std::getenv("DFLASH_GDN_ONE_ROUND_LANES");
    return valid_lanes(e ? std::atoi(e) : 0);
}();

// Tokens a step (U; a tree's runs of parent-child links): 1 by default, or DFLASH_GDN_ONE_ROUND_STEP=2
// / 4 (8 lanes a column).
int valid_step(int u) { return u == 1 || u == 2 || u == 4 ? u : 1; }
int or_step_flag = [] {
    const char * e = std::getenv("DFLASH_GDN_ONE_ROUND_STEP");
    return valid_step(e ? std::atoi(e) : 1);
}();

bool or_enabled_flag = [] {
    const char * e = std::getenv("DFLASH_GDN_ONE_ROUND");
    return !(e && e[0] == '0');
}();

// G below this is folded into U (a token's delta / G stays far from float's range)
constexpr float kOrMinScale = 1e-20f;

__device__ __forceinline__ float dot4(const float4 a, const float4 b, float acc) {
    return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}

__device__ __forceinline__ void scale4(float4 & a, const float s) { a.x *= s, a.y *= s, a.z *= s, a.w *= s; }

// A tree's index in shared memory: node at each preorder position, parents, depths, and which
// nodes save their state for a later node.
template <bool kTree>
struct OrTree {
    int16_t node[kOrMaxNodes], parent[kOrMaxNodes], pos[kOrMaxNodes];
    uint8_t depth[kOrMaxNodes], branch[kOrMaxNodes];
};
template <>
struct OrTree<false> {};

// tree: the tree index (parents, preorder, depths; n each) with kTree, else null.
template <int S, int CL, int L, bool kTree, int U = 1>
__global__ void __launch_bounds__(16 * L / CL)
    gdn_chain_one_round_kernel(const float * __restrict__ q, const float * __restrict__ k, const float * __restrict__ v,
                               const float * __restrict__ g, const float * __restrict__ beta,
                               const float * __restrict__ s0, float * __restrict__ dst, float * __restrict__ state,
                               const int32_t * __restrict__ tree, const int64_t H, const int64_t n_tokens,
                               const int64_t sq1, const int64_t sq2, const int64_t sq3, const int64_t sv1,
                               const int64_t sv2, const int64_t sv3, const int64_t sb1, const int64_t sb2,
                               const int64_t sb3, const int64_t neqk1, const int64_t rq3, const float scale) {
    constexpr int kThreads = 16 * L / CL;  // kOrColumns columns of L lanes, CL a lane
    constexpr int R4 = S / L / 4;          // float4s of rows a lane: rows 4 (L i + j) .. + 3, i < R4
    static_assert(kOrChunk % U == 0, "a chunk holds whole steps");
    __shared__ __align__(16) float s_k[2][kOrChunk][S];
    __shared__ __align__(16) float s_q[2][kOrChunk][S];
    __shared__ __align__(16) float s_v[2][kOrChunk][kOrColumns];
    __shared__ float s_g[2][kOrChunk], s_b[2][kOrChunk];
    __shared__ OrTree<kTree> s_tree;

    const int64_t h = blockIdx.x, seq = blockIdx.y;
    const int64_t iq1 = h % neqk1, iq3 = seq / rq3;
    const int tid = threadIdx.x, lane = tid % 32, j = lane % L;
    const int c0 = ((tid / 32) * (32 / L) + lane / L) * CL;  // this lane's columns c0 .. c0 + CL - 1 of the block's
    const int64_t col_block = (int64_t)blockIdx.z * kOrColumns;

    if constexpr (kTree) {
        const int n = (int)n_tokens;
        for (int i = tid; i < n; i += kThreads) {
            const int node = tree[n + i];
            s_tree.node[i] = (int16_t)node;
            s_tree.pos[node] = (int16_t)i;
            s_tree.parent[i] = (int16_t)tree[i];
            s_tree.depth[i] = (uint8_t)tree[2 * n + i];
            s_tree.branch[i] = 0;
        }
        __syncthreads();
        for (int i = tid; i < n; i += kThreads) {
            const int p = s_tree.parent[i];
            if (p >= 0 && s_tree.pos[i] != s_tree.pos[p] + 1) s_tree.branch[p] = 1;  // same value from every writer
        }
        __syncthreads();  // the index, before the stage reads it
    }
    // the token at position t: t itself in a chain, the node at preorder position t in a tree
    auto node_at = [&](int64_t t) -> int64_t {
        if constexpr (kTree) {
            return s_tree.node[t];
        } else {
            return t;
        }
    };

    // states are stored transposed (row `col` = column col of S), as in ggml
    const float4 * init = reinterpret_cast<const float4 *>(s0 + ((seq * H + h) * S + col_block + c0) * S);
    // The state is G U: the gates' product G since the last rescale is kept apart from U, so a
    // token's update is one FMA an element (U += k delta / G) instead of a multiply and an FMA.
    float4 st[CL][R4];  // U
    float G = 1.0f;
    auto load_initial = [&] {
#pragma unroll
        for (int c = 0; c < CL; ++c) {
#pragma unroll
            for (int i = 0; i < R4; ++i) st[c][i] = init[c * (S / 4) + L * i + j];
        }
        G = 1.0f;
    };
    load_initial();
    // the tree's per-depth stack of saved states and their G (thread-local memory)
    float4 stack[kTree ? ggml_ext::kTreeMaxDepth + 1 : 1][CL][R4];
    float stack_g[kTree ? ggml_ext::kTreeMaxDepth + 1 : 1];
    int64_t prev = -1;

    // chunk c's k, q and v rows into buffer c % 2 (cp.async; one commit group a chunk)
    auto stage = [&](int buf, int64_t t0, int tn) {
        for (int p = tid; p < tn * (S / 4); p += kThreads) {
            const int t = p / (S / 4), e = 4 * (p % (S / 4));
            const int64_t qk = iq3 * sq3 + node_at(t0 + t) * sq2 + iq1 * sq1 + e;
            cp_async_16(&s_k[buf][t][e], k + qk);
            cp_async_16(&s_q[buf][t][e], q + qk);
        }
        for (int p = tid; p < tn * (kOrColumns / 4); p += kThreads) {
            const int t = p / (kOrColumns / 4), e = 4 * (p % (kOrColumns / 4));
            cp_async_16(&s_v[buf][t][e], v + seq * sv3 + node_at(t0 + t) * sv2 + h * sv1 + col_block + e);
        }
        cp_async_commit();
    };
    // a chunk's gates (after expf) and betas: thread t < tn holds token t's
    auto gate_beta = [&](int64_t t0, int tn, float & gv, float & bv) {
        if (tid < tn) {
            const int64_t gb = seq * sb3 + node_at(t0 + tid) * sb2 + h * sb1;
            gv = expf(g[gb]);
            bv = beta[gb];
        }
    };

    float * out = dst + (seq * n_tokens * H + h) * S + col_block + c0;  // + node S H
    {
        const int tn = gdn_chunk_tokens<kOrChunk>(n_tokens, 0);
        stage(0, 0, tn);
        float gv = 0.0f, bv = 0.0f;
        gate_beta(0, tn, gv, bv);
        if (tid < tn) s_g[0][tid] = gv, s_b[0][tid] = bv;
    }
    for (int64_t t0 = 0, ci = 0; t0 < n_tokens; t0 += kOrChunk, ++ci) {
        const int buf = (int)(ci & 1);
        const int tn = gdn_chunk_tokens<kOrChunk>(n_tokens, t0);
        const int64_t t1 = t0 + kOrChunk;
        const int tn1 = gdn_chunk_tokens<kOrChunk>(n_tokens, t1);
        float gv = 0.0f, bv = 0.0f;
        gdn_stage_next_wait_this(tn1, [&] {
            stage(buf ^ 1, t1, tn1);
            gate_beta(t1, tn1, gv, bv);
        });
        __syncthreads();  // this chunk's rows, gates and betas are in shared memory

        // a tree node's state before it: the initial state (a root), or its parent's from the stack
        // when its parent is not the node just visited
        auto enter_node = [&](const int64_t node) {
            if constexpr (kTree) {
                const int p = s_tree.parent[node], d = s_tree.depth[node];
                if (p < 0) {
                    load_initial();
                } else if (p != prev) {
#pragma unroll
                    for (int c = 0; c < CL; ++c) {
#pragma unroll
                        for (int i = 0; i < R4; ++i) st[c][i] = stack[d - 1][c][i];
                    }
                    G = stack_g[d - 1];
                }
            }
        };
        // after a tree node: its state saved for a later child, and it is the node just visited
        auto leave_node = [&](const int64_t node) {
            if constexpr (kTree) {
                if (s_tree.branch[node]) {
                    const int d = s_tree.depth[node];
#pragma unroll
                    for (int c = 0; c < CL; ++c) {
#pragma unroll
                        for (int i = 0; i < R4; ++i) stack[d][c][i] = st[c][i];
                    }
                    stack_g[d] = G;
                }
                prev = node;
            }
        };
        auto node_of = [&](const int t) -> int64_t { return node_at(t0 + t); };
        auto one_token = [&](const int t) {  // position t of the chunk alone (the walk above)
            const int64_t node = node_of(t);
            enter_node(node);
            const float4 * kp = reinterpret_cast<const float4 *>(s_k[buf][t]);
            const float4 * qp = reinterpret_cast<const float4 *>(s_q[buf][t]);
            float4 kr[R4];
            float kv[CL][2] = {}, sq[CL][2] = {}, kq[2] = {0.0f, 0.0f};
#pragma unroll
            for (int i = 0; i < R4; ++i) {
                kr[i] = kp[L * i + j];
                const float4 qr = qp[L * i + j];
                const int a = i & 1;  // two chains of sums: half the dependent depth
#pragma unroll
                for (int c = 0; c < CL; ++c) {
                    kv[c][a] = dot4(st[c][i], kr[i], kv[c][a]);
                    sq[c][a] = dot4(st[c][i], qr, sq[c][a]);
                }
                kq[a] = dot4(kr[i], qr, kq[a]);
            }
            float skv[CL], ssq[CL], skq = kq[0] + kq[1];
#pragma unroll
            for (int c = 0; c < CL; ++c) skv[c] = kv[c][0] + kv[c][1], ssq[c] = sq[c][0] + sq[c][1];
#pragma unroll
            for (int m = 1; m < L; m <<= 1) {  // the column's L lanes, every sum at once
#pragma unroll
                for (int c = 0; c < CL; ++c) {
                    skv[c] += __shfl_xor_sync(0xffffffff, skv[c], m);
                    ssq[c] += __shfl_xor_sync(0xffffffff, ssq[c], m);
                }
                skq += __shfl_xor_sync(0xffffffff, skq, m);
            }
            // the token's gate joins G; a G near float's floor (decayed or zero gates, which are
            // the same for the whole block) is folded into U first
            G *= s_g[buf][t];
            const float bt = s_b[buf][t];
            const bool fold = G < kOrMinScale;
            const float rg = fold ? 1.0f : 1.0f / G;
#pragma unroll
            for (int c = 0; c < CL; ++c) {
                const float delta = (s_v[buf][t][c0 + c] - G * skv[c]) * bt;
                if (j == 0) out[node * S * H + c] = (G * ssq[c] + delta * skq) * scale;
                const float dg = delta * rg;
#pragma unroll
                for (int i = 0; i < R4; ++i) {
                    if (fold) scale4(st[c][i], G);
                    st[c][i].x = fmaf(kr[i].x, dg, st[c][i].x);
                    st[c][i].y = fmaf(kr[i].y, dg, st[c][i].y);
                    st[c][i].z = fmaf(kr[i].z, dg, st[c][i].z);
                    st[c][i].w = fmaf(kr[i].w, dg, st[c][i].w);
                }
            }
            if (fold) G = 1.0f;
            leave_node(node);
        };
        // positions t .. t + U - 1 as one step: in a tree, each node the parent of the next, none
        // but the last with its state saved (a chain: always)
        auto step_links = [&](const int t) {
            if constexpr (kTree) {
#pragma unroll
                for (int u = 1; u < U; ++u) {
                    const int64_t a = node_of(t + u - 1);
                    if (s_tree.parent[node_of(t + u)] != a || s_tree.branch[a]) return false;
                }
            }
            return true;
        };
        int t = 0;
        while (t < tn) {
            if constexpr (U > 1) {
                if (t + U > tn || !step_links(t)) {
                    one_token(t++);
                    continue;
                }
                enter_node(node_of(t));
                float gs[U], bs[U], prod = 1.0f;
#pragma unroll
                for (int u = 0; u < U; ++u) gs[u] = s_g[buf][t + u], bs[u] = s_b[buf][t + u], prod *= gs[u];
                if (G * prod < kOrMinScale) {  // the same for the whole block (the gates are the head's)
                    if (prod < kOrMinScale) {  // the step's own gates: token by token
#pragma unroll
                        for (int u = 0; u < U; ++u) one_token(t + u);
                        t += U;
                        continue;
                    }
#pragma unroll
                    for (int c = 0; c < CL; ++c) {
#pragma unroll
                        for (int i = 0; i < R4; ++i) scale4(st[c][i], G);
                    }
                    G = 1.0f;
                }
                // every dot product of the step in one pass over the lane's rows, then one butterfly
                float dk[CL][U] = {}, dq[CL][U] = {}, kk[U][U] = {}, kq[U][U] = {};
#pragma unroll
                for (int i = 0; i < R4; ++i) {
                    float4 kr[U], qr[U];
#pragma unroll
                    for (int u = 0; u < U; ++u) {
                        kr[u] = reinterpret_cast<const float4 *>(s_k[buf][t + u])[L * i + j];
                        qr[u] = reinterpret_cast<const float4 *>(s_q[buf][t + u])[L * i + j];
                    }
#pragma unroll
                    for (int c = 0; c < CL; ++c) {
#pragma unroll
                        for (int u = 0; u < U; ++u) {
                            dk[c][u] = dot4(st[c][i], kr[u], dk[c][u]);
                            dq[c][u] = dot4(st[c][i], qr[u], dq[c][u]);
                        }
                    }
#pragma unroll
                    for (int a = 0; a < U; ++a) {
#pragma unroll
                        for (int b = a; b < U; ++b) {
                            if (b > a) kk[a][b] = dot4(kr[a], kr[b], kk[a][b]);
                            kq[a][b] = dot4(kr[a], qr[b], kq[a][b]);
                        }
                    }
                }
#pragma unroll
                for (int m = 1; m < L; m <<= 1) {
#pragma unroll
                    for (int u = 0; u < U; ++u) {
#pragma unroll
                        for (int c = 0; c < CL; ++c) {
                            dk[c][u] += __shfl_xor_sync(0xffffffff, dk[c][u], m);
                            dq[c][u] += __shfl_xor_sync(0xffffffff, dq[c][u], m);
                        }
#pragma unroll
                        for (int a = 0; a <= u; ++a) {
                            if (a < u) kk[a][u] += __shfl_xor_sync(0xffffffff, kk[a][u], m);
                            kq[a][u] += __shfl_xor_sync(0xffffffff, kq[a][u], m);
                        }
                    }
                }
                // the tokens in order: scalars only (H_u: the gates' running product from G)
                float hs[U], rh[U], h = G;
#pragma unroll
                for (int u = 0; u < U; ++u) h *= gs[u], hs[u] = h, rh[u] = 1.0f / h;
                float e[CL][U];
#pragma unroll
                for (int c = 0; c < CL; ++c) {
#pragma unroll
                    for (int u = 0; u < U; ++u) {
                        float a = dk[c][u], b = dq[c][u];
#pragma unroll
                        for (int i = 0; i < u; ++i) a = fmaf(e[c][i], kk[i][u], a);
                        const float delta = (s_v[buf][t + u][c0 + c] - hs[u] * a) * bs[u];
                        e[c][u] = delta * rh[u];
#pragma unroll
                        for (int i = 0; i <= u; ++i) b = fmaf(e[c][i], kq[i][u], b);
                        if (j == 0) out[node_of(t + u) * S * H + c] = hs[u] * b * scale;
                    }
                }
#pragma unroll
                for (int i = 0; i < R4; ++i) {
#pragma unroll
                    for (int u = 0; u < U; ++u) {
                        const float4 kr = reinterpret_cast<const float4 *>(s_k[buf][t + u])[L * i + j];
#pragma unroll
                        for (int c = 0; c < CL; ++c) {
                            st[c][i].x = fmaf(kr.x, e[c][u], st[c][i].x);
                            st[c][i].y = fmaf(kr.y, e[c][u], st[c][i].y);
                            st[c][i].z = fmaf(kr.z, e[c][u], st[c][i].z);
                            st[c][i].w = fmaf(kr.w, e[c][u], st[c][i].w);
                        }
                    }
                }
                G = hs[U - 1];
                leave_node(node_of(t + U - 1));
                t += U;
            } else {
                one_token(t++);
            }
        }
        if (tn1 > 0 && tid < tn1) s_g[buf ^ 1][tid] = gv, s_b[buf ^ 1][tid] = bv;
        __syncthreads();  // this chunk is read before the next iteration stages into its buffer
    }
    if constexpr (!kTree) {
        float4 * st_out = reinterpret_cast<float4 *>(state + ((seq * H + h) * S + col_block + c0) * S);
#pragma unroll
        for (int c = 0; c < CL; ++c) {
#pragma unroll
            for (int i = 0; i < R4; ++i) {
                scale4(st[c][i], G);
                st_out[c * (S / 4) + L * i + j] = st[c][i];
            }
        }
    }
}

template <int S, int CL, int L, bool kTree, int U = 1>
void launch_one_round(const GdnChainArgs & a, cudaStream_t stream) {
    const dim3 grid((unsigned)a.H, (unsigned)a.n_seqs, (unsigned)(S / kOrColumns));
    DFLASH_LAUNCH(grid, dim3(16 * L / CL), 0, stream, gdn_chain_one_round_kernel<S, CL, L, kTree, U>)(
        a.q, a.k, a.v, a.g, a.beta, a.s0, a.dst, a.state, a.parents, a.H, a.n_tokens, a.sq1, a.sq2, a.sq3, a.sv1, a.sv2,
        a.sv3, a.sb1, a.sb2, a.sb3, a.neqk1, a.rq3, a.scale);
}

// Tokens a step (or_step_flag) with 8 lanes a column; with 16 lanes, one.
template <int S, int CL, int L, bool kTree>
void launch_steps(const GdnChainArgs & a, cudaStream_t stream) {
    if constexpr (L == 8) {
        switch (or_step_flag) {
            case 2:
                return launch_one_round<S, CL, L, kTree, 2>(a, stream);
            case 4:
                return launch_one_round<S, CL, L, kTree, 4>(a, stream);
            default:
                return launch_one_round<S, CL, L, kTree>(a, stream);
        }
    } else {
        launch_one_round<S, CL, L, kTree>(a, stream);
    }
}

template <int S, int CL, int L>
void launch_form(const GdnChainArgs & a, cudaStream_t stream) {
    if (a.parents) {
        launch_steps<S, CL, L, true>(a, stream);
    } else {
        launch_steps<S, CL, L, false>(a, stream);
    }
}

template <int S, int CL>
void launch_or_lanes(const GdnChainArgs & a, cudaStream_t stream) {
    if ((or_lanes_flag != 0 ? or_lanes_flag : kOrDefaultLanes) == 16) {
        launch_form<S, CL, 16>(a, stream);
    } else {
        launch_form<S, CL, 8>(a, stream);
    }
}

template <int S>
void launch_or_columns(const GdnChainArgs & a, cudaStream_t stream) {
    switch (or_columns_flag != 0 ? or_columns_flag : a.parents ? 1 : 2) {
        case 1:
            return launch_or_lanes<S, 1>(a, stream);
        case 4:
            return launch_or_lanes<S, 4>(a, stream);
        default:
            return launch_or_lanes<S, 2>(a, stream);
    }
}

}  // namespace

namespace ggml_ext {
void set_gdn_one_round(bool on) { or_enabled_flag = on; }
bool gdn_one_round() { return or_enabled_flag; }
void set_gdn_one_round_columns(int columns) { or_columns_flag = valid_columns(columns); }
int gdn_one_round_columns() { return or_columns_flag; }
void set_gdn_one_round_lanes(int lanes) { or_lanes_flag = valid_lanes(lanes); }
int gdn_one_round_lanes() { return or_lanes_flag; }
void set_gdn_one_round_step(int tokens) { or_step_flag = valid_step(tokens); }
int gdn_one_round_step() { return or_step_flag; }
}  // namespace ggml_ext

bool ggml_ext_cuda_gated_delta_net_one_round(const GdnChainArgs & a, cudaStream_t stream) {
    const bool rows16 = gdn_rows_aligned16(a, a.parents == nullptr);
    // a tree: one sequence, its index in shared memory, outputs only
    const bool tree_ok = a.parents == nullptr || (a.n_seqs == 1 && a.n_tokens <= kOrMaxNodes && !a.write_state);
    if (!or_enabled_flag || !tree_ok || !rows16 || a.n_tokens < kOrMinTokens) return false;
    if (a.parents == nullptr && ggml_ext_cuda_gated_delta_net_gram(a, stream)) return true;  // DFLASH_GDN_GRAM
    switch (a.S) {
        case 64:
            launch_or_columns<64>(a, stream);
            return true;
        case 128:
            launch_or_columns<128>(a, stream);
            return true;
        default:
            return false;
    }
}
