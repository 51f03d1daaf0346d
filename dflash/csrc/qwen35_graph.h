// The qwen35 target forward as one ggml graph: n_tokens new tokens at positions
// n_past.., reading and updating the TargetCache. Mirrors upstream's src/models/qwen35.cpp
// op for op so that logits match libllama on the same file.
#pragma once

#include "qwen35_model.h"
#include "target_cache.h"

#include <vector>

struct ggml_cgraph;

namespace dflash {

struct ForwardSpec {
    int n_tokens = 1;
    int n_past = 0;
    bool all_logits = false;           // logits of every token, else of the last one only
    std::vector<int> capture_layers;   // copy these layers' outputs (residual stream) ...
    ggml_tensor * features = nullptr;  // ... into rows 0..n_tokens-1 of this f32 [L * n_embd, rows]
    // Speculative verify: keep the recurrent state as it was and save the delta-rule inputs
    // and conv window into the cache's verify scratch for a later commit.
    bool defer_recurrent = false;
    // DDTree verify: parents[i] is the index of token i's parent in this forward (-1 for the
    // root, token 0). Positions become n_past + depth and each token attends to the committed
    // prefix plus its ancestors-or-self. Empty: a plain causal chain.
    std::vector<int32_t> tree_parents;
    // EngineConfig::batch_invariant: weight matmuls through ggml_ext::mul_mat_invariant, and the
    // attention of a decode or a verify through ggml_ext::attn_paths (a prefill keeps ggml's flash
    // attention: it is the same graph on both sides).
    bool batch_invariant = false;
    // One-token forwards: each layer's stacked input projections (Qwen35Layer::stacked) as one
    // product, sliced per projection; same rows, same per-row arithmetic, fewer launches.
    bool stack_projections = true;
    // Forwards of several tokens too, and their FFN gate and up (Qwen35Layer::ffn_gate_up): on a
    // GPU. (ggml's CPU products of several columns pick their f16 kernel by the matrix's height,
    // tinyBLAS or its own dot of f16-rounded activations: stacking would move a prefill's logits.)
    bool stack_tokens = false;
    // One-token forwards that commit their recurrent state: each Gated DeltaNet layer's conv,
    // SiLU, q/k L2 norms, gate and beta in one op (ggml_ext::gdn_decode_inputs) instead of nine.
    bool fused_gdn_inputs = false;
    // One-token forwards too: a layer's input products enter the graph next to each other right
    // after its norm, as they always do for several tokens, so that the GEMV's quantizer can read
    // the norm once for a pair (ggml_ext's DFLASH_FUSE_RMS_NORM_GEMV, which turns this on).
    bool adjacent_products = false;
};

struct ForwardGraph {
    ggml_cgraph * gf = nullptr;
    int n_kv = 0;  // attended cache rows (padded)
    // inputs
    ggml_tensor * tokens = nullptr;  // i32 [n_tokens]
    ggml_tensor * pos = nullptr;     // i32 [4 * n_tokens] (IMROPE: three equal axes + zero)
    ggml_tensor * kv_idx = nullptr;  // i64 [n_tokens] cache rows to write
    ggml_tensor * mask = nullptr;    // f16 [n_kv, n_tokens] (null where paths replace it)
    ggml_tensor * k_rot = nullptr;   // Hadamard matrices for quantised K/V (or null)
    ggml_tensor * v_rot = nullptr;
    // tree verify with Gated DeltaNet layers: ggml_ext's tree index (parents, preorder, depths)
    ggml_tensor * tree = nullptr;  // i32 [n_tokens, 3]
    // batch-invariant attention: each token's cache rows (ggml_ext::attn_paths_rows)
    ggml_tensor * paths = nullptr;  // i32 [n_tokens + 2, n_tokens]
    // outputs
    ggml_tensor * logits = nullptr;  // f32 [n_vocab, n_out]
    ggml_tensor * argmax = nullptr;  // i32 [n_out]
    // the backend whose stream queues the input writes (inputs in its memory: device_inputs.h), or null
    ggml_backend_t upload = nullptr;
};

// Node capacity of the commit graphs (recurrent replay + K/V compaction).
constexpr int COMMIT_GRAPH_NODES = 8192;

// Attended cache rows for a forward ending at n_end tokens (padded for the CUDA FA kernels).
int padded_n_kv(int n_end, int n_ctx);

ForwardGraph build_qwen35_forward(ggml_context * ctx, const Qwen35Model & model, const TargetCache & cache,
                                  const ForwardSpec & spec);

// The recurrent part of a commit: every GDN layer's delta rule replayed from the pre-verify state
// along the accepted tokens' saved inputs, and the conv state rebuilt from their conv inputs.
// rows: i32 [a, n_gdn], the accepted tokens' verify indices (the first a for a chain, a tree's
// path) once per GDN layer slot.
void build_qwen35_commit_recurrent(ggml_context * ctx, ggml_cgraph * gf, const Qwen35Model & model,
                                   const TargetCache & cache, ggml_tensor * rows);

// Moves attention K/V rows src[d] -> dst[d] in every attention layer (a tree verify's accepted
// path becoming consecutive positions; valid because RoPE depends only on depth). src_rows: i32
// [a, n_attn] (the rows once per attention layer slot), dst_rows: i64 [a].
void build_qwen35_kv_compact(ggml_context * ctx, ggml_cgraph * gf, const TargetCache & cache, ggml_tensor * src_rows,
                             ggml_tensor * dst_rows);

// Fills the inputs after the graph is allocated (causal mask over the committed prefix).
void set_qwen35_inputs(const ForwardGraph & g, const Qwen35Model & model, const ForwardSpec & spec,
                       const int32_t * tokens);

}  // namespace dflash
