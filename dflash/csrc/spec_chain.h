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
    int draft_tokens = 0;  // draft tokens (DDTree: tree nodes) verified
    int accepted = 0;      // draft tokens accepted
    int target_forwards = 0;
    int steps = 0;            // decode steps after the prefill: one target forward each
    int verified_tokens = 0;  // rows of those forwards: the anchor plus the draft tokens / tree nodes
    int committed = 0;        // tokens those steps emitted: accepted drafts plus the target's own token
    // [i]: steps whose accepted draft (DDTree: accepted root-to-leaf path) reached depth i+1
    std::vector<int> accepted_per_pos;
    // draft_ms: the drafter's forward (top-K included: it is part of the draft graph); tree_ms:
    // DDTree host work - building the tree from the top-K lists and walking it with the target's
    // choices; verify_ms: the target forward; commit_ms: recurrent/KV commit and the drafter's
    // feature injection. Test/bench draft rewrites are in none of them.
    double draft_ms = 0, tree_ms = 0, verify_ms = 0, commit_ms = 0;

    double acceptance_length() const { return drafts ? 1.0 + (double)accepted / drafts : 0.0; }
    double tokens_per_forward() const { return steps ? (double)committed / steps : 0.0; }
};

struct ChainOptions {
    int max_draft = 15;      // draft tokens verified per step (<= block size - 1, <= n_verify_max - 1)
    int budget = 0;          // > 0: DDTree - verify a tree of this many draft nodes (<= n_verify_max - 1)
    bool chain_seed = true;  // DDTree: the top-1 chain is always in the tree
    // Tests and benches only: may rewrite the drafted tokens before the verify (to exercise
    // acceptance with random-weight models, or to impose a synthetic acceptance profile).
    std::function<void(int start, std::vector<int32_t> & drafts)> rewrite_drafts;
    // Benches only (like upstream's --spec-synth-len): >= 0 accepts exactly this many drafts per
    // step whatever the target says - the chain's first ones, or a DDTree's top-1 path - so the
    // engine's speed at a given acceptance is measured on random weights. The output is not the
    // model's.
    int forced_accept = -1;
};

GenerateStats generate_chain(TargetEngine & target, DraftEngine & draft, const std::vector<int32_t> & prompt,
                             int max_tokens, const SamplingParams & sp, const std::vector<int32_t> & eog,
                             const TokenCallback & on_token, const ChainOptions & opt, SpecStats & stats);

}  // namespace dflash
