// DFlash drafter (GGUF arch "dflash", as written by convert-draft or upstream's converter):
// hyperparameters and weights. A few Qwen3 decoder layers that read features of the target's
// hidden states; the token embedding and the LM head are the target's own tensors (shared,
// never copied), bound by bind_target() after the target is checked for compatibility.
#pragma once

#include "backend.h"
#include "weight_store.h"
#include "qwen35_model.h"

#include <cstdint>
#include <string>
#include <vector>

struct ggml_context;
struct ggml_tensor;

namespace dflash {

class GgufFile;

struct DflashHparams {
    int64_t n_embd = 0;
    int64_t n_layer = 0;
    int64_t n_ff = 0;
    int64_t n_head = 0;
    int64_t n_head_kv = 0;
    int64_t head_dim = 0;
    int64_t n_vocab = 0;  // 0 when the file does not say (then only the target's counts)
    int64_t n_ctx_train = 0;
    int64_t n_target_layers_trained = 0;  // 0 when unknown
    float rms_eps = 1e-6f;
    float rope_freq_base = 1e7f;
    float rope_freq_scale = 1.0f;  // 1 / linear rope scaling factor
    float attn_scale = 0.0f;       // 0 -> 1/sqrt(head_dim)
    int n_rot = 0;
    int block_size = 16;
    int32_t mask_token_id = -1;
    // Target layers whose outputs (residual stream after the layer) feed the drafter, in
    // the order their features are concatenated. HF convention (the file stores id + 1).
    std::vector<int> target_layers;
    int64_t sliding_window = 0;    // 0: no sliding-window layers
    std::vector<bool> is_sliding;  // per layer
    std::vector<bool> causal;      // per layer: causal inside the block (else bidirectional)

    int64_t n_feature() const { return (int64_t)target_layers.size() * n_embd; }
    int64_t kv_row() const { return head_dim * n_head_kv; }
};

struct DflashLayer {
    ggml_tensor * attn_norm = nullptr;  // input_layernorm
    ggml_tensor * wq = nullptr;
    ggml_tensor * wk = nullptr;
    ggml_tensor * wv = nullptr;
    ggml_tensor * wo = nullptr;
    ggml_tensor * q_norm = nullptr;
    ggml_tensor * k_norm = nullptr;
    ggml_tensor * ffn_norm = nullptr;  // post_attention_layernorm
    ggml_tensor * ffn_gate = nullptr;
    ggml_tensor * ffn_up = nullptr;
    ggml_tensor * ffn_down = nullptr;
};

class DflashModel {
  public:
    // Reads and validates the metadata and the tensor table; allocates nothing.
    explicit DflashModel(const GgufFile & file);
    ~DflashModel();
    DflashModel(const DflashModel &) = delete;
    DflashModel & operator=(const DflashModel &) = delete;

    // Throws ModelLoadError when this drafter cannot run on `target` (hidden size, layer ids,
    // vocabulary); otherwise takes the target's embedding and LM head.
    void bind_target(const Qwen35Model & target);

    void assign_buffers(const Backends & backends);
    size_t weight_bytes() const;
    void load(const GgufFile & file, const ProgressFn & progress);

    DflashHparams hp;
    std::string name;
    ggml_tensor * fc = nullptr;           // [n_feature, n_embd]
    ggml_tensor * hidden_norm = nullptr;  // enc.output_norm
    ggml_tensor * output_norm = nullptr;
    std::vector<DflashLayer> layers;
    // The target's (not owned).
    ggml_tensor * tok_embd = nullptr;
    ggml_tensor * output = nullptr;

  private:
    ggml_tensor * take(const GgufFile & file, const std::string & name, std::vector<int64_t> shape);
    std::string path_;
    WeightStore weights_;
};

}  // namespace dflash
