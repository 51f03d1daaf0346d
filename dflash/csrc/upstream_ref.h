// Upstream llama.cpp (libllama from the same vendor tree, same ggml build) driven through
// llama_decode: the oracle for logits and the baseline for benchmarks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

struct llama_model;
struct llama_context;

namespace dflash {

struct UpstreamConfig {
    int n_ctx = 4096;
    int n_batch = 512;
    std::string k_type = "f16";
    std::string v_type = "f16";
    int n_gpu_layers = -1;
    int n_threads = 0;
};

struct UpstreamTimings {
    double prefill_ms = 0;
    std::vector<double> decode_ms;  // one per decoded token
};

class UpstreamModel {
  public:
    UpstreamModel(const std::string & path, const UpstreamConfig & cfg);
    ~UpstreamModel();
    UpstreamModel(const UpstreamModel &) = delete;
    UpstreamModel & operator=(const UpstreamModel &) = delete;

    int32_t n_vocab() const;
    // Every token's logits (n x n_vocab) from an empty context.
    std::vector<float> eval_logits(const std::vector<int32_t> & tokens);
    // Same, decoding the sequence in the given chunk sizes (e.g. a prefill then single tokens).
    std::vector<float> eval_chunks(const std::vector<int32_t> & tokens, const std::vector<int> & chunks);
    // Benches: clears the context, decodes `prefix` (untimed, n_batch chunks), then `tokens` in one
    // llama_decode (every row's logits when all_logits, as a speculative verify asks) and returns
    // that decode's wall time in ms, synchronised.
    double time_decode(const std::vector<int32_t> & prefix, const std::vector<int32_t> & tokens, bool all_logits);
    // Greedy: prefill then n_gen tokens, each fed back; returns the generated tokens.
    std::vector<int32_t> greedy(const std::vector<int32_t> & prompt, int n_gen, UpstreamTimings * timings = nullptr);

  private:
    void clear();
    void decode(const int32_t * tokens, int n, int pos0, bool all_logits);
    UpstreamConfig cfg_;
    llama_model * model_ = nullptr;
    llama_context * ctx_ = nullptr;
};

// Upstream's DFlash drafter (libllama, arch "dflash") paired with its target the way upstream's
// speculative driver pairs them: the draft context reads the target's embedding and LM head
// through ctx_other, the target context extracts the inputs of the drafter's target layers, and
// those rows enter the draft KV cache through an embedding batch. The oracle for our draft graph
// in its all-bidirectional mode (upstream has no per-layer block causality).
class UpstreamDraft {
  public:
    UpstreamDraft(const std::string & target_path, const std::string & draft_path, const UpstreamConfig & cfg);
    ~UpstreamDraft();
    UpstreamDraft(const UpstreamDraft &) = delete;
    UpstreamDraft & operator=(const UpstreamDraft &) = delete;

    int32_t n_vocab() const;
    int block_size() const { return block_size_; }
    int64_t n_feature() const;
    // From empty contexts: prefill `context` through the target in one batch, inject the features
    // of every context token, then decode [anchor, MASK x (B-1)] at positions n..n+B-1 with every
    // layer bidirectional. Returns the logits of slots 1..B-1 ((B-1) x n_vocab); `features` (when
    // given) receives the injected rows (n x n_feature).
    std::vector<float> draft_logits(const std::vector<int32_t> & context, int32_t anchor,
                                    std::vector<float> * features = nullptr);

  private:
    UpstreamConfig cfg_;
    llama_model * target_ = nullptr;
    llama_context * tctx_ = nullptr;
    llama_model * draft_ = nullptr;
    llama_context * dctx_ = nullptr;
    std::vector<int32_t> layers_;  // as upstream numbers them: the input of layer id
    int block_size_ = 16;
    int32_t mask_token_ = -1;
    void release();
};

}  // namespace dflash
