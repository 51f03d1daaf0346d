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
    // Greedy: prefill then n_gen tokens, each fed back; returns the generated tokens.
    std::vector<int32_t> greedy(const std::vector<int32_t> & prompt, int n_gen, UpstreamTimings * timings = nullptr);

  private:
    void clear();
    void decode(const int32_t * tokens, int n, int pos0, bool all_logits);
    UpstreamConfig cfg_;
    llama_model * model_ = nullptr;
    llama_context * ctx_ = nullptr;
};

}  // namespace dflash
