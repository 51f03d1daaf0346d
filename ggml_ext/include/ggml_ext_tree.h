// Tree ops for Gated DeltaNet layers (DDTree verify, REFERENCE.md section 4): the short conv
// and the delta rule of a hybrid model evaluated over a tree of tokens in one op each, every node
// continuing from its parent. New ggml ops (GGML_OP_TREE_*, hooked in by
// patches/0001-tree-ops-hooks.patch); kernels in kernels/ (CPU always, CUDA with DFLASH_CUDA).
#pragma once

#include "ggml.h"

#include <cstdint>
#include <string>
#include <vector>

namespace ggml_ext {

// Deepest node a tree op accepts (root = depth 0). The CUDA kernel keeps one state per depth.
constexpr int kTreeMaxDepth = 32;

// The tree index tensor's contents, I32 [n, 3]: row 0 parents (-1: starts from the cached
// state), row 1 the nodes in depth-first preorder, row 2 depths.
struct TreeIndex {
    std::vector<int32_t> data;
    int n = 0;
    int max_depth = 0;
};

// Validates parents (parent[i] in [-1, i)) and depth (<= kTreeMaxDepth); false + err if not.
bool make_tree_index(const std::vector<int32_t> & parents, TreeIndex & out, std::string * err = nullptr);

// Depthwise causal conv over a tree: node i's window is its own column of x plus its nearest
// ancestors', falling back to the cached conv state once the path to the root runs out.
//   x [C, n] f32 (rows may lie apart), conv_state [K-1, C(, 1)] f32 (oldest column first), w [K, C] f32,
//   tree I32 [n, 3]
//   -> [C, n] (no activation; same tap order as ggml_ssm_conv)
ggml_tensor * tree_ssm_conv(ggml_context * ctx, ggml_tensor * x, ggml_tensor * conv_state, ggml_tensor * w,
                            ggml_tensor * tree);

// Gated delta rule over a tree (scalar gate): each node's state is its parent's state updated
// with the node's (q, k, v, g, beta); roots start from `state`. Same math and scale as
// ggml_gated_delta_net; no state is written (commit replays the accepted path).
//   q, k [S, Hk, n, 1], v [S, Hv, n, 1], g and beta [1, Hv, n, 1], state [S, S, Hv, 1],
//   tree I32 [n, 3] with depths <= max_depth  ->  [S * Hv, n]
ggml_tensor * tree_gated_delta_net(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v,
                                   ggml_tensor * g, ggml_tensor * beta, ggml_tensor * state, ggml_tensor * tree,
                                   int max_depth);

}  // namespace ggml_ext
