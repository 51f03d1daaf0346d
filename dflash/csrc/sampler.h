// Token selection from one row of logits: greedy at temperature 0, otherwise
// temperature -> top-k -> top-p -> categorical draw from a seeded generator.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace dflash {

struct SamplingParams {
    float temperature = 0.0f;
    int top_k = 0;       // 0 = off
    float top_p = 1.0f;  // 1 = off
    uint64_t seed = 0;
    bool greedy() const { return temperature <= 0.0f; }
};

// Throws InvalidParameter for values no sampler accepts.
void validate(const SamplingParams & p);

class Sampler {
  public:
    explicit Sampler(const SamplingParams & p) : p_(p), rng_(p.seed) {}
    int32_t sample(const float * logits, int64_t n_vocab);

  private:
    SamplingParams p_;
    std::mt19937_64 rng_;
    std::vector<std::pair<float, int32_t>> cand_;
};

}  // namespace dflash
