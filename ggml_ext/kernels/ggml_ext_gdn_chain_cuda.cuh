// ggml_ext's delta rule for a chain of tokens (ggml_gated_delta_net with a scalar gate and one
// state out), taking ggml-cuda's calls through patches/0007-gdn-chain-hook.patch. See gdn_chain.cu.
#pragma once

#include "ggml-cuda/common.cuh"
#include "ggml_ext_gdn.h"

#include <cstdint>

struct GdnChainArgs {
    const float *q, *k, *v, *g, *beta, *s0;
    float * dst;    // n_seqs x n_tokens x H x S outputs
    float * state;  // the final states, (seq, head) slabs of S x S
    int64_t S, H, n_tokens, n_seqs;
    int64_t sq1, sq2, sq3, sv1, sv2, sv3, sb1, sb2, sb3;  // strides in floats
    int64_t neqk1, rq3;  // q/k heads (v head h reads q/k head h % neqk1); v seqs per q/k seq
    float scale;
    // the chunked form only (gdn_chunked.cu): a tree's parents (parents[i] < i; -1: from the
    // state s0; one sequence, at most one chunk) instead of a chain, and whether the final state
    // is written
    const int32_t * parents = nullptr;
    bool write_state = true;
};

// State columns a warp for `units` (head, sequence) pairs of S x S states, the tree kernel's too:
// forced by ggml_ext::set_gdn_columns, else 4, 2 or 1 (see gdn_chain.cu); 1 when S < 64.
int gdn_columns_for(int64_t S, int64_t units);

// The tree delta rule's form (tree_ops.cu): paths (a warp a segment) when ggml_ext::set_tree_gdn_mode
// says so, or by default when the walk's grid (walk_blocks) is smaller than the GPU's
// multiprocessors; else the walk (a warp all nodes).
bool tree_gdn_paths_for(int64_t walk_blocks, int64_t n);

// True when ggml_ext ran the op (S of 16, 32, 64 or 128); false leaves it to ggml's kernel.
bool ggml_ext_cuda_gated_delta_net(const GdnChainArgs & args, cudaStream_t stream);

// The chunked form (gdn_chunked.cu) for a node the graph marked (ggml_ext::allow_reordered_delta_rule):
// true when it ran (S of 64 or 128, within its token range, switched on); false leaves the node to
// the chain kernel. Its scratch comes from ctx's pool.
bool ggml_ext_cuda_gated_delta_net_chunked(const GdnChainArgs & args, ggml_backend_cuda_context & ctx);

// One round of warp reductions a token (gdn_chain_one_round.cu) for a node the graph marked: true
// when it ran (S of 64 or 128, 16-byte aligned rows, switched on); false leaves the node to the
// chain kernel.
bool ggml_ext_cuda_gated_delta_net_one_round(const GdnChainArgs & args, cudaStream_t stream);

// A chunk of 16 tokens at a time in parallel (gdn_chain_gram.cu) for a marked chain: true when it ran
// (switched on, a chain of 2 tokens or more, S of 64 or 128, 16-byte aligned rows); the one-round
// kernel tries it first.
bool ggml_ext_cuda_gated_delta_net_gram(const GdnChainArgs & args, cudaStream_t stream);
