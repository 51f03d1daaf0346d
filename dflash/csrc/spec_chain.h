// Chain DFlash speculative decoding (REFERENCE.md section 3): draft a block, verify
// [anchor, d1..dn] in one target forward, keep the longest prefix the target agrees with plus
// its own next token, roll the recurrent state back exactly, feed the drafter the features of
// the kept positions. Greedy, and "sample and match" at T > 0: both lossless.
#pragma once

#include "draft_engine.h"
#include "target_engine.h"

#include <functional>
#include <vector>

namespace dflash {

struct SpecStats {
    int drafts = 0;        // verify steps that carried draft tokens
    int draft_tokens = 0;  // draft tokens verified
    int accepted = 0;      // draft tokens accepted
    int target_forwards = 0;
    std::vector<int> accepted_per_pos;  // [i]: drafts whose token i+1 was accepted
    double draft_ms = 0, verify_ms = 0, commit_ms = 0;

    double acceptance_length() const { return drafts ? 1.0 + (double)accepted / drafts : 0.0; }
};

struct ChainOptions {
    int max_draft = 15;      // draft tokens verified per step (<= block size - 1, <= n_verify_max - 1)
    int budget = 0;          // > 0: DDTree - verify a tree of this many draft nodes (<= n_verify_max - 1)
    bool chain_seed = true;  // DDTree: the top-1 chain is always in the tree
    // Tests and benches only: may rewrite the drafted tokens before the verify (to exercise
    // acceptance with random-weight models, or to impose a synthetic acceptance profile).
    std::function<void(int start, std::vector<int32_t> & drafts)> rewrite_drafts;
};

GenerateStats generate_chain(TargetEngine & target, DraftEngine & draft, const std::vector<int32_t> & prompt,
                             int max_tokens, const SamplingParams & sp, const std::vector<int32_t> & eog,
                             const TokenCallback & on_token, const ChainOptions & opt, SpecStats & stats);

}  // namespace dflash
