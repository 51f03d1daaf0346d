// Qwen3.5/3.6 dense hybrid target (GGUF arch "qwen35"): hyperparameters and weights.
// Layer i is Gated DeltaNet unless it is a full-attention layer; MTP (nextn) blocks stored
// after the trunk are skipped.
#pragma once

#include "backend.h"
#include "weight_store.h"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

struct ggml_context;
struct ggml_tensor;

namespace dflash {

class GgufFile;

struct Qwen35Hparams {
    int64_t n_vocab = 0;
    int64_t n_embd = 0;
    int64_t n_layer = 0;  // trunk layers (block_count minus nextn layers)
    int64_t n_layer_nextn = 0;
    int64_t n_ff = 0;
    int64_t n_head = 0;
    int64_t n_head_kv = 0;
    int64_t head_dim = 0;
    int64_t n_ctx_train = 0;
    float rms_eps = 1e-6f;
    float rope_freq_base = 1e7f;
    float attn_scale = 0.0f;  // 0 -> 1/sqrt(head_dim)
    int n_rot = 0;
    int rope_sections[4] = {0, 0, 0, 0};
    // Gated DeltaNet
    int64_t ssm_d_conv = 0;
    int64_t ssm_d_inner = 0;
    int64_t ssm_d_state = 0;    // head dim of K and V
    int64_t ssm_n_v_heads = 0;  // time_step_rank
    int64_t ssm_n_k_heads = 0;  // group_count
    std::vector<bool> is_recurrent;

    int64_t conv_channels() const { return ssm_d_inner + 2 * ssm_n_k_heads * ssm_d_state; }
    int64_t n_attn_layers() const;
    int64_t n_recurrent_layers() const { return n_layer - n_attn_layers(); }
};

// Input projections of one layer stacked into a single weight (WeightStore::stacked): parts
// [first, first + count) of the layer's projection list (attention: q, k, v; Gated DeltaNet:
// qkv, z, beta, alpha), whose rows follow one another in `w`.
struct StackedProjection {
    int first = 0, count = 0;
    ggml_tensor * w = nullptr;
};

struct Qwen35Layer {
    ggml_tensor * attn_norm = nullptr;
    ggml_tensor * attn_post_norm = nullptr;
    // full attention
    ggml_tensor * wq = nullptr;  // Q and output gate interleaved per head
    ggml_tensor * wk = nullptr;
    ggml_tensor * wv = nullptr;
    ggml_tensor * wo = nullptr;
    ggml_tensor * q_norm = nullptr;
    ggml_tensor * k_norm = nullptr;
    // Gated DeltaNet
    ggml_tensor * wqkv = nullptr;
    ggml_tensor * wgate = nullptr;  // z
    ggml_tensor * conv1d = nullptr;
    ggml_tensor * dt_bias = nullptr;
    ggml_tensor * ssm_a = nullptr;
    ggml_tensor * w_beta = nullptr;
    ggml_tensor * w_alpha = nullptr;
    ggml_tensor * ssm_norm = nullptr;
    ggml_tensor * ssm_out = nullptr;
    // FFN
    ggml_tensor * ffn_gate = nullptr;
    ggml_tensor * ffn_up = nullptr;
    ggml_tensor * ffn_down = nullptr;
    // [gate; up] as one weight where the loader placed them back to back (null otherwise)
    ggml_tensor * ffn_gate_up = nullptr;
    // the input projections (input_projections()) stacked where their weights allow it
    std::vector<StackedProjection> stacked;

    // The weights that read the layer's normed input, in the order the loader places them.
    std::vector<ggml_tensor *> input_projections() const {
        return wqkv ? std::vector<ggml_tensor *>{wqkv, wgate, w_beta, w_alpha} : std::vector<ggml_tensor *>{wq, wk, wv};
    }
    // Products reading the layer's normed input when they are stacked: one a stack, one each
    // projection left apart.
    int input_products() const {
        int n = (int)input_projections().size();
        for (const auto & s : stacked) n -= s.count - 1;
        return n;
    }
};

class Qwen35Model {
  public:
    // Reads and validates the metadata; allocates nothing.
    explicit Qwen35Model(const GgufFile & file);
    ~Qwen35Model();
    Qwen35Model(const Qwen35Model &) = delete;
    Qwen35Model & operator=(const Qwen35Model &) = delete;

    // Chooses each weight's buffer type: the device's "extra" types first where they take the
    // weight's matmul (the CPU's repacked layouts, as upstream does), else the default type.
    void assign_buffers(const Backends & backends);
    // Bytes the weights will take (for the memory plan); after assign_buffers.
    size_t weight_bytes() const;
    // Allocates the weights and reads them from the file, then stacks each layer's input
    // projections and each FFN's gate and up where they are adjacent and alike (Qwen35Layer::stacked,
    // ffn_gate_up).
    void load(const GgufFile & file, const ProgressFn & progress);
    // Stacked weights: input projections and FFN gate/up pairs (a count for tests and benches).
    int n_stacked() const;

    Qwen35Hparams hp;
    ggml_tensor * tok_embd = nullptr;
    ggml_tensor * output_norm = nullptr;
    ggml_tensor * output = nullptr;  // may alias tok_embd (tied)
    std::vector<Qwen35Layer> layers;
    std::string name;

  private:
    ggml_tensor * take(const GgufFile & file, const std::string & name, std::vector<int64_t> shape,
                       bool required = true);
    WeightStore weights_;
};

}  // namespace dflash
