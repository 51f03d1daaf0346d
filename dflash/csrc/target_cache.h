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
    std::vector<ggml_tensor *> k, v;       // [head_dim * n_head_kv, n_ctx] (attention layers)
    std::vector<ggml_tensor *> conv, ssm;  // [d_conv-1, channels], [S, S, H_v] f32 (GDN layers)

    // A verify leaves the recurrent state at its start and keeps each token's delta-rule inputs
    // and the conv window here; commit(a) then replays the first a tokens exactly (REFERENCE.md
    // section 4: no per-token states, no f16 drift). Per GDN layer:
    std::vector<ggml_tensor *> vq, vk;  // [S, H_k, n_verify_max]
    std::vector<ggml_tensor *> vv;      // [S, H_v, n_verify_max]
    std::vector<ggml_tensor *> vg, vb;  // [1, H_v, n_verify_max] (log-decay, beta)
    std::vector<ggml_tensor *> vconv;   // [d_conv-1 + n_verify_max, channels]: old state + inputs
    std::vector<ggml_tensor *> vx;      // [channels, n_verify_max]: each token's conv input (tree)

  private:
    ggml_context * ctx_ = nullptr;
    ggml_backend_buffer_t kv_buf_ = nullptr;
    ggml_backend_buffer_t rs_buf_ = nullptr;
    std::vector<ggml_tensor *> kv_tensors_, rs_tensors_;
};

}  // namespace dflash
