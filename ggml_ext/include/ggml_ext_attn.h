// Attention over paths of cache rows, in an order that does not depend on the batch: the op of
// the engine's batch-invariant mode (ggml_ext/BATCH_INVARIANCE.md), in which a DDTree node's
// logits must be the bits a one-token decode at its position gives.
//
// Query i attends a "virtual" sequence of P_i + L_i cache rows: rows 0 .. P_i - 1 (the committed
// prefix) and then L_i rows listed for it (its path: a decode's own row; a chain token's rows
// since the prefix; a tree node's ancestors-or-self, root first). Scores are summed in tiles of
// kAttnPathsTile virtual positions with an online softmax in a fixed order, so a query's output
// depends only on its virtual sequence: a tree node and the decode of the same token after the
// same tokens see the same rows in the same order and get the same bits (on one backend).
// New ggml op GGML_OP_ATTN_PATHS (patches/0001); kernels in kernels/ (CPU, CUDA).
#pragma once

#include "ggml.h"

#include <cstdint>
#include <vector>

namespace ggml_ext {

constexpr int kAttnPathsTile = 32;

// q f32 [D, n_head, n] (rows contiguous), k and v [D, n_head_kv, n_rows] of type f32, f16 or bf16
// (rows contiguous; n_head a multiple of n_head_kv), paths i32 [W, n] contiguous with column i =
// {P_i, L_i, r_0 .. r_{L_i - 1}} (L_i >= 1, L_i + 2 <= W, every row < n_rows: the caller's
// contract, not checked per step) -> f32 [D, n_head, n], softmax(q k^T * scale) v per head.
ggml_tensor * attn_paths(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * v, ggml_tensor * paths,
                         float scale);

// Whether attn_paths takes K/V of this type.
inline bool attn_paths_supports_type(ggml_type t) {
    return t == GGML_TYPE_F32 || t == GGML_TYPE_F16 || t == GGML_TYPE_BF16;
}

// The paths input of a forward of n tokens written at cache rows start .. start + n - 1 after a
// committed prefix of `start` rows: parents empty (a chain; a decode is n = 1) or a tree's
// parents (parent[i] < i, -1 for the root). Width W = n + 2.
std::vector<int32_t> attn_paths_rows(int32_t start, int n, const std::vector<int32_t> & parents);

}  // namespace ggml_ext
