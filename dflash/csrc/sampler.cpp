#include "sampler.h"

#include "errors.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace dflash {

void validate(const SamplingParams & p) {
    if (!std::isfinite(p.temperature) || p.temperature < 0.0f) {
        throw InvalidParameter("temperature must be a finite number >= 0, got " + std::to_string(p.temperature));
    }
    if (p.top_k < 0) throw InvalidParameter("top_k must be >= 0, got " + std::to_string(p.top_k));
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) {
        throw InvalidParameter("top_p must be in (0, 1], got " + std::to_string(p.top_p));
    }
}

int32_t Sampler::sample(const float * logits, int64_t n_vocab) {
    if (p_.greedy()) return (int32_t)(std::max_element(logits, logits + n_vocab) - logits);
    cand_.resize(n_vocab);
    for (int64_t i = 0; i < n_vocab; ++i) cand_[i] = {logits[i] / p_.temperature, (int32_t)i};
    size_t n = cand_.size();
    auto by_logit = [](const auto & a, const auto & b) { return a.first > b.first; };
    if (p_.top_k > 0 && (size_t)p_.top_k < n) {
        std::partial_sort(cand_.begin(), cand_.begin() + p_.top_k, cand_.end(), by_logit);
        n = p_.top_k;
    } else {
        std::sort(cand_.begin(), cand_.end(), by_logit);
    }
    const float mx = cand_[0].first;
    double sum = 0;
    std::vector<double> prob(n);
    for (size_t i = 0; i < n; ++i) sum += prob[i] = std::exp((double)cand_[i].first - mx);
    if (p_.top_p < 1.0f) {
        double acc = 0;
        size_t keep = n;
        for (size_t i = 0; i < n; ++i) {
            acc += prob[i] / sum;
            if (acc >= p_.top_p) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        sum = 0;
        for (size_t i = 0; i < n; ++i) sum += prob[i];
    }
    std::uniform_real_distribution<double> u(0.0, sum);
    double r = u(rng_);
    for (size_t i = 0; i < n; ++i) {
        r -= prob[i];
        if (r <= 0) return cand_[i].second;
    }
    return cand_[n - 1].second;
}

}  // namespace dflash
