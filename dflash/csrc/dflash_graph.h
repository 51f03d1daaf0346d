// The DFlash draft forward as one ggml graph:
//  (a) context injection: H = RMSNorm_hidden(fc @ [target features]) for new committed rows,
//      projected by every layer's k_proj/v_proj (+k_norm, +RoPE at the rows' positions) and
//      written into the persistent draft KV cache;
//  (b) the block [anchor, MASK x (B-1)] at positions start.. through the draft layers, attending
//      over [cached context ; block] with a per-layer mask, then the target's LM head on slots
//      1..B-1 (logits, argmax, top-K).
// Either part may be absent (inject only; block only).
//
// Cache layout: row r holds the K/V of position r. The block's K/V go to rows start..start+B-1,
// past every committed row: they are never counted as context and the next injection
// overwrites them (transient). Keeping rows = positions lets sliding-window layers attend over a
// contiguous view that starts near the window instead of at row 0.
#pragma once

#include "dflash_model.h"

#include <vector>

struct ggml_cgraph;

namespace dflash {

struct DraftKv {
    std::vector<ggml_tensor *> k, v;  // per layer [head_dim * n_head_kv, n_rows]
    int64_t n_rows = 0;
    int64_t trash_row() const { return n_rows - 1; }  // padding injection rows land here
};

struct DraftSpec {
    int n_inject = 0;              // feature rows (padded); padding rows are written to the trash row
    int n_block = 0;               // 0 (inject only) or block_size
    int top_k = 1;                 // candidates per slot (top_ids / top_logp); 0: argmax only
    float top_temperature = 1.0f;  // softmax temperature of top_logp
    // Attended rows: [0, kv_hi) for full layers, [kv_lo_sliding, kv_hi) for sliding ones.
    int kv_hi = 0;
    int kv_lo_sliding = 0;
    // Feature rows gathered from this device tensor (the target's captured features, version
    // feat_version) instead of uploaded from the host.
    ggml_tensor * feat_src = nullptr;
    uint64_t feat_version = 0;
};

struct DraftGraph {
    ggml_cgraph * gf = nullptr;
    // inputs
    ggml_tensor * feat = nullptr;       // f32 [n_feature, n_inject] (host upload), or
    ggml_tensor * feat_rows = nullptr;  // i32 [n_inject]: rows of spec.feat_src
    ggml_tensor * inj_pos = nullptr;    // i32 [n_inject]
    ggml_tensor * inj_idx = nullptr;    // i64 [n_inject]
    ggml_tensor * tokens = nullptr;     // i32 [n_block]
    ggml_tensor * pos = nullptr;        // i32 [n_block]
    ggml_tensor * blk_idx = nullptr;    // i64 [n_block]
    ggml_tensor * mask[2][2] = {};      // [sliding][causal]: f16 [n_kv of that layer kind, n_block]
    // outputs (block only)
    ggml_tensor * logits = nullptr;    // f32 [n_vocab, n_block - 1]
    ggml_tensor * argmax = nullptr;    // i32 [n_block - 1]
    ggml_tensor * top_ids = nullptr;   // i32 [top_k, n_block - 1] (unordered)
    ggml_tensor * top_logp = nullptr;  // f32 [top_k, n_block - 1] log-probabilities of top_ids
    // the backend whose stream queues the input writes (inputs in its memory: device_inputs.h), or null
    ggml_backend_t upload = nullptr;
};

// Rows that must be attended for a block at `start` (padded to 256 for the CUDA FA kernels,
// capped at the cache size): {kv_lo_sliding, kv_hi}.
std::pair<int, int> draft_kv_range(const DflashHparams & hp, int start, int n_block, int64_t n_rows);

DraftGraph build_dflash_draft(ggml_context * ctx, const DflashModel & model, const DraftKv & kv,
                              const DraftSpec & spec);

// What one run reads: the feature rows to inject and the block to draft.
struct DraftInputs {
    const float * feat = nullptr;         // n_real_inject x n_feature (host rows), or
    const int32_t * feat_rows = nullptr;  // n_real_inject rows of spec.feat_src
    int n_real_inject = 0;                // <= spec.n_inject; the rest is padding
    int inject_pos0 = 0;                  // position of the first feature row
    int32_t anchor = 0;
    int start = 0;  // block position (anchor)
    int n_ctx = 0;  // committed context rows visible to the block (positions < n_ctx)
    bool all_bidirectional = false;
};

void set_dflash_inputs(const DraftGraph & g, const DflashModel & model, const DraftKv & kv, const DraftSpec & spec,
                       const DraftInputs & in);

}  // namespace dflash
