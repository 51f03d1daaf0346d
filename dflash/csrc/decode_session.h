// One generation request as a step machine: each step() runs one target forward (plain
// decoding) or one draft + verify + commit (chain DFlash) and returns the tokens it produced.
// The caller pulls steps from its own thread - no callbacks, no thread hand-off per token - and
// stops whenever it likes (stop strings, a client that left).
#pragma once

#include "draft_engine.h"
#include "spec_chain.h"
#include "target_engine.h"

#include <vector>

namespace dflash {

class DecodeSession {
  public:
    // draft == nullptr: plain autoregressive decoding.
    DecodeSession(TargetEngine & target, DraftEngine * draft, std::vector<int32_t> prompt, int max_tokens,
                  const SamplingParams & sp, std::vector<int32_t> eog, const ChainOptions & opt = {});

    // The next tokens (the first call prefills the prompt); empty once done().
    std::vector<int32_t> step();
    bool done() const { return done_; }
    const GenerateStats & stats() const { return st_; }
    const SpecStats & spec() const { return spec_; }

  private:
    std::vector<int32_t> first_step();
    std::vector<int32_t> chain_step();
    std::vector<int32_t> tree_step();
    // Keeps the tokens up to an end-of-generation token or the budget; marks the end.
    std::vector<int32_t> emit(std::vector<int32_t> toks);
    int32_t pick(const ForwardResult & r, int row);

    TargetEngine & target_;
    DraftEngine * draft_;
    std::vector<int32_t> prompt_;
    int max_tokens_;
    SamplingParams sp_;
    std::vector<int32_t> eog_;
    ChainOptions opt_;
    Sampler sampler_;
    int max_draft_ = 0;
    std::vector<int> layers_;  // target layers the drafter reads (chain only)

    bool started_ = false, done_ = false;
    int32_t anchor_ = 0;  // the last emitted token, not yet run through the target
    double t0_ = 0, t_first_ = 0;
    GenerateStats st_;
    SpecStats spec_;
};

}  // namespace dflash
