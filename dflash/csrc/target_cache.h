// Per-sequence state of the qwen35 target: attention K/V rows for the full-attention layers
// and (conv, delta-rule) states for the Gated DeltaNet layers. One sequence, max n_ctx tokens.
#pragma once

#include "ggml-backend.h"
#include "qwen35_model.h"

#include <vector>

namespace dflash {

struct TargetCacheConfig {
    int n_ctx = 4096;
    int n_verify_max = 16;  // most tokens a speculative verify may defer (recurrent replay scratch)
    ggml_type k_type = GGML_TYPE_F16;
    ggml_type v_type = GGML_TYPE_F16;
};

class TargetCache {
  public:
    TargetCache(const Qwen35Hparams & hp, const TargetCacheConfig & cfg);
    ~TargetCache();
    TargetCache(const TargetCache &) = delete;
    TargetCache & operator=(const TargetCache &) = delete;

    // Bytes this cache takes in `buft`: {kv, recurrent}.
    std::pair<size_t, size_t> bytes(ggml_backend_buffer_type_t buft) const;
    void allocate(ggml_backend_buffer_type_t buft);
    // Forget everything: zero recurrent states, no tokens.
    void clear();

    TargetCacheConfig cfg;
    int n_past = 0;
    // Every layer's state lies in one tensor per kind, slot attn_slot[il] / gdn_slot[il] of it, so
    // that a commit moves the K/V rows of all attention layers with one gather and one scatter per
    // kind and replays the delta rule of all GDN layers in one op (n_seqs = the layers):
    //   k_all, v_all  [head_dim * n_head_kv, n_ctx, n_attn]
    //   conv_all      [(d_conv-1) * channels, n_gdn] f32
    //   ssm_all       [S * S * H_v, n_gdn] f32
    // and the per-layer tensors below are views of them.
    ggml_tensor *k_all = nullptr, *v_all = nullptr, *conv_all = nullptr, *ssm_all = nullptr;
    std::vector<ggml_tensor *> k, v;       // [head_dim * n_head_kv, n_ctx] (attention layers)
    std::vector<ggml_tensor *> conv, ssm;  // [d_conv-1, channels], [S, S, H_v] f32 (GDN layers)
    std::vector<int> attn_slot;            // layer -> slot in k_all / v_all (-1: GDN layer)

    // Where a new delta-rule state of GDN layer il (or of all, il < 0) goes: a [S*S*H_v, 1] (or
    // [.., n_gdn]) view of ssm_all. Copying a ggml_gated_delta_net's state tail into it is the
    // pattern ggml's CUDA backend fuses (the kernel writes the state there; no copy kernel).
    ggml_tensor * ssm_dst(ggml_context * ctx, int il = -1) const;

    // A verify leaves the recurrent state at its start and keeps each token's delta-rule inputs
    // and the conv window here; commit(a) then replays the first a tokens exactly (REFERENCE.md
    // section 4: no per-token states, no f16 drift). The inputs of every GDN layer lie in three
    // tensors, slot gdn_slot[il] of each, so that a tree commit gathers its path's rows of all
    // layers with three get_rows (verify_views() slices them):
    //   vin  [W, n_verify_max, n_gdn]: per token q [S*H_k] | k [S*H_k] | v [S*H_v] | x [channels]
    //        (q, k, v as the delta rule takes them; x the conv's input, from which a commit
    //        rebuilds the conv state)
    //   vgate, vbeta [H_v, n_verify_max, n_gdn] (log-decay, beta)
    ggml_tensor * vin = nullptr;
    ggml_tensor * vgate = nullptr;
    ggml_tensor * vbeta = nullptr;
    std::vector<int> gdn_slot;  // layer -> slot in the tensors above (-1: attention layer)

    // One GDN layer's verify scratch as views in ctx, of `rows` tokens from `src` (vin, vgate,
    // vbeta, or tensors gathered from them with the same first two dimensions): q, k [S, H_k,
    // rows], v [S, H_v, rows], qkv (the three as [channels, rows]) and x [channels, rows] (rows
    // apart), g, b [1, H_v, rows] (contiguous).
    struct VerifyViews {
        ggml_tensor *q, *k, *v, *qkv, *x, *g, *b;
    };
    VerifyViews verify_views(ggml_context * ctx, int il, int64_t rows, ggml_tensor * in, ggml_tensor * gate,
                             ggml_tensor * beta) const;
    VerifyViews verify_views(ggml_context * ctx, int il, int64_t rows) const {
        return verify_views(ctx, il, rows, vin, vgate, vbeta);
    }

  private:
    int64_t S_ = 0, Hk_ = 0, Hv_ = 0, C_ = 0;
    ggml_context * ctx_ = nullptr;
    ggml_backend_buffer_t kv_buf_ = nullptr;
    ggml_backend_buffer_t rs_buf_ = nullptr;
    std::vector<ggml_tensor *> kv_tensors_, rs_tensors_;  // the allocated tensors
    std::vector<ggml_tensor *> views_;                    // per-layer views, initialised after allocation
};

}  // namespace dflash
