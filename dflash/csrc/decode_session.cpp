#include "decode_session.h"

#include "ggml_ext_tree.h"

#include "errors.h"
#include "tree_builder.h"

#include <algorithm>
#include <chrono>

namespace dflash {

namespace {

double now_ms() {
    using namespace std::chrono;
    return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// Feature rows 0..n-1 of the target's last forward.
std::vector<int32_t> first_rows(int n) {
    std::vector<int32_t> rows(n);
    for (int i = 0; i < n; ++i) rows[i] = i;
    return rows;
}

}  // namespace

DecodeSession::DecodeSession(TargetEngine & target, DraftEngine * draft, std::vector<int32_t> prompt, int max_tokens,
                             const SamplingParams & sp, std::vector<int32_t> eog, const ChainOptions & opt)
    : target_(target),
      draft_(draft),
      prompt_(std::move(prompt)),
      max_tokens_(max_tokens),
      sp_(sp),
      eog_(std::move(eog)),
      opt_(opt),
      sampler_(sp) {
    validate(sp);
    const int n_ctx = target.config().n_ctx;
    if (prompt_.empty()) throw InvalidParameter("the prompt is empty");
    if (max_tokens < 0) throw InvalidParameter("max_tokens must be >= 0");
    // The prompt plus one generated token must fit; generation stops at the context end.
    if ((int)prompt_.size() + 1 > n_ctx) throw ContextOverflow((int)prompt_.size() + 1, n_ctx);
    const int64_t V = target.hparams().n_vocab;
    for (int32_t t : prompt_) {
        if (t < 0 || t >= V) throw InvalidParameter("token id " + std::to_string(t) + " is outside the vocabulary");
    }
    if (draft_) {
        if (opt.max_draft < 0) throw InvalidParameter("max_draft must be >= 0");
        max_draft_ = std::min({opt.max_draft, draft_->hparams().block_size - 1, target.config().n_verify_max - 1});
        if (opt.budget < 0) throw InvalidParameter("budget must be >= 0");
        if (opt.budget > target.config().n_verify_max - 1) {
            throw InvalidParameter("budget " + std::to_string(opt.budget) +
                                   " exceeds n_verify_max - 1 = " + std::to_string(target.config().n_verify_max - 1));
        }
        if (opt.budget > 0 && draft_->hparams().block_size - 1 > ggml_ext::kTreeMaxDepth) {
            throw InvalidParameter("DDTree: the drafter's block size " + std::to_string(draft_->hparams().block_size) +
                                   " gives trees deeper than the tree ops' " + std::to_string(ggml_ext::kTreeMaxDepth) +
                                   " levels; use budget=0 (chain)");
        }
        layers_ = draft_->hparams().target_layers;
        spec_.accepted_per_pos.assign(opt.budget > 0 ? draft_->hparams().block_size - 1 : std::max(max_draft_, 0), 0);
    }
    st_.n_prompt = (int)prompt_.size();
    st_.stop_reason = "length";
}

int32_t DecodeSession::pick(const ForwardResult & r, int row) {
    const int64_t V = target_.hparams().n_vocab;
    return sp_.greedy() ? r.argmax[row] : sampler_.sample(r.logits.data() + (size_t)row * V, V);
}

std::vector<int32_t> DecodeSession::emit(std::vector<int32_t> toks) {
    std::vector<int32_t> out;
    for (int32_t t : toks) {
        out.push_back(t);
        st_.n_generated++;
        if (std::find(eog_.begin(), eog_.end(), t) != eog_.end()) {
            st_.stop_reason = "eog";
            done_ = true;
            break;
        }
        if (st_.n_generated >= max_tokens_) {
            done_ = true;
            break;
        }
    }
    if (!out.empty()) anchor_ = out.back();
    st_.predict_ms = now_ms() - t_first_;
    return out;
}

std::vector<int32_t> DecodeSession::first_step() {
    started_ = true;
    t0_ = now_ms();
    target_.reset();
    if (draft_) draft_->reset();
    const int n_batch = target_.config().n_batch;
    ForwardResult r;
    for (size_t i = 0; i < prompt_.size(); i += n_batch) {
        const int n = (int)std::min<size_t>(n_batch, prompt_.size() - i);
        if (draft_ && i > 0) draft_->flush();  // the next forward overwrites the feature rows
        r = target_.forward(prompt_.data() + i, n, false, !sp_.greedy(), layers_);
        if (draft_) draft_->inject_target(first_rows(n), (int)i);
        spec_.target_forwards++;
    }
    t_first_ = now_ms();
    st_.prompt_ms = t_first_ - t0_;
    if (max_tokens_ == 0) {
        done_ = true;
        return {};
    }
    return emit({pick(r, 0)});
}

std::vector<int32_t> DecodeSession::chain_step() {
    const int64_t V = target_.hparams().n_vocab;
    const int start = target_.n_past();  // position of the anchor
    const int room = target_.config().n_ctx - start;
    const int n_draft = std::max(0, std::min({max_draft_, max_tokens_ - st_.n_generated - 1, room - 1}));

    std::vector<int32_t> batch = {anchor_};
    if (n_draft > 0) {
        const double t = now_ms();
        DraftResult d = draft_->draft(anchor_, start, false, false);  // chain: the argmax is enough
        spec_.draft_ms += now_ms() - t;
        std::vector<int32_t> drafts(d.argmax.begin(), d.argmax.begin() + n_draft);
        if (opt_.rewrite_drafts) {
            opt_.rewrite_drafts(start, drafts);
            drafts.resize(n_draft, 0);
            for (int32_t & tok : drafts) tok = std::clamp<int32_t>(tok, 0, (int32_t)V - 1);
        }
        batch.insert(batch.end(), drafts.begin(), drafts.end());
        spec_.drafts++;
        spec_.draft_tokens += n_draft;
    } else {
        draft_->flush();  // no draft() took the queued rows; the verify overwrites them
    }

    double t = now_ms();
    ForwardResult v = target_.verify(batch.data(), (int)batch.size(), !sp_.greedy(), layers_);
    spec_.verify_ms += now_ms() - t;
    spec_.target_forwards++;
    spec_.steps++;
    spec_.verified_tokens += (int)batch.size();

    // Walk: the target's token after each kept position; keep going while it is the draft's.
    std::vector<int32_t> out;
    int k = 0;
    // Each position is picked once (sampling draws from the RNG): the pick that ends the walk is
    // the target's own token after the kept ones.
    int32_t next = 0;
    if (opt_.forced_accept >= 0) {  // bench only: see ChainOptions
        k = std::min(opt_.forced_accept, n_draft);
        out.assign(batch.begin() + 1, batch.begin() + 1 + k);
        next = pick(v, k);
    } else {
        for (next = pick(v, 0); k < n_draft && next == batch[k + 1]; next = pick(v, k)) {
            out.push_back(next);
            ++k;
        }
    }
    for (int j = 0; j < k; ++j) spec_.accepted_per_pos[j]++;
    out.push_back(next);
    spec_.accepted += k;

    t = now_ms();
    target_.commit(k + 1);  // the anchor + k accepted drafts; out.back() is the next anchor
    draft_->inject_target(first_rows(k + 1), start);
    spec_.commit_ms += now_ms() - t;
    out = emit(std::move(out));
    spec_.committed += (int)out.size();
    return out;
}

std::vector<int32_t> DecodeSession::tree_step() {
    const int start = target_.n_past();
    const int room = target_.config().n_ctx - start;
    // depth limit: the block, the token budget left, the context left
    const int depth =
        std::max(0, std::min({draft_->hparams().block_size - 1, max_tokens_ - st_.n_generated - 1, room - 1}));
    const int budget = std::min(opt_.budget, room - 1);
    std::vector<int32_t> tokens = {anchor_}, parents = {-1};
    std::vector<int32_t> top1;  // the drafter's best token per depth (forced acceptance follows it)
    DraftTree tree;
    if (depth > 0 && budget > 0) {
        double t = now_ms();
        DraftResult d = draft_->draft(anchor_, start, false);
        spec_.draft_ms += now_ms() - t;
        const int K = draft_->config().top_k;
        if (opt_.rewrite_drafts) {
            // tests/benches: rewrite the top-1 candidate of each depth (the seeded chain)
            std::vector<int32_t> top1(depth);
            for (int dd = 0; dd < depth; ++dd) top1[dd] = d.top_ids[(size_t)dd * K];
            opt_.rewrite_drafts(start, top1);
            top1.resize(depth, 0);
            for (int dd = 0; dd < depth; ++dd) {
                int32_t * row = d.top_ids.data() + (size_t)dd * K;
                const int32_t tok = std::clamp<int32_t>(top1[dd], 0, (int32_t)target_.hparams().n_vocab - 1);
                for (int j = 1; j < K; ++j) {
                    if (row[j] == tok) row[j] = row[0];  // keep the row free of duplicates
                }
                row[0] = tok;
            }
        }
        for (int dd = 0; dd < depth; ++dd) top1.push_back(d.top_ids[(size_t)dd * K]);
        t = now_ms();
        build_tree(d.top_ids.data(), d.top_logp.data(), depth, K, budget, opt_.chain_seed, tree);
        for (int i = 0; i < tree.size(); ++i) {
            tokens.push_back(tree.tokens[i]);
            parents.push_back(tree.parents[i] + 1);  // positions: 0 = the anchor, i+1 = node i
        }
        spec_.tree_ms += now_ms() - t;
        spec_.drafts++;
        spec_.draft_tokens += tree.size();
    } else {
        draft_->flush();
    }

    double t = now_ms();
    ForwardResult v = target_.verify_tree(tokens.data(), parents, !sp_.greedy(), layers_);
    spec_.verify_ms += now_ms() - t;
    spec_.target_forwards++;
    spec_.steps++;
    spec_.verified_tokens += (int)tokens.size();

    // Walk: the target's choice at each position; follow the child that drafted it.
    std::vector<int32_t> choices(tokens.size());
    for (size_t p = 0; p < tokens.size(); ++p) choices[p] = pick(v, (int)p);
    std::vector<int32_t> path = {0};
    std::vector<int32_t> out;
    t = now_ms();
    if (tree.size() > 0 && opt_.forced_accept >= 0) {  // bench only: the top-1 path, forced_accept deep
        int node = -1;                                 // tree index of the last path node (-1: the anchor)
        for (int dd = 0; dd < std::min<int>(opt_.forced_accept, (int)top1.size()); ++dd) {
            int next = -1;
            for (int i = 0; i < tree.size() && next < 0; ++i) {
                if (tree.parents[i] == node && tree.tokens[i] == top1[dd]) next = i;
            }
            if (next < 0) break;
            node = next;
            path.push_back(node + 1);
            out.push_back(tree.tokens[node]);
            spec_.accepted_per_pos[dd]++;
        }
        out.push_back(choices[node + 1]);
    } else if (tree.size() > 0) {
        TreeWalk w = walk_tree(tree, choices.data(), (int)choices.size());
        for (size_t d = 0; d < w.path.size(); ++d) {
            path.push_back(w.path[d] + 1);
            out.push_back(tree.tokens[w.path[d]]);
            if (d < spec_.accepted_per_pos.size()) spec_.accepted_per_pos[d]++;
        }
        out.push_back(w.next_token);
    } else {
        out.push_back(choices[0]);
    }
    spec_.tree_ms += now_ms() - t;
    spec_.accepted += (int)path.size() - 1;

    t = now_ms();
    target_.commit_path(path);
    draft_->inject_target(path, start);  // the path's feature rows, in place on the device
    spec_.commit_ms += now_ms() - t;
    out = emit(std::move(out));
    spec_.committed += (int)out.size();
    return out;
}

std::vector<int32_t> DecodeSession::step() {
    if (done_) return {};
    if (!started_) return first_step();
    if (target_.n_past() + 1 > target_.config().n_ctx) {  // context full: "length"
        done_ = true;
        return {};
    }
    if (draft_) return opt_.budget > 0 ? tree_step() : chain_step();
    ForwardResult r = target_.forward(&anchor_, 1, false, !sp_.greedy());
    spec_.target_forwards++;
    spec_.steps++;
    spec_.verified_tokens++;
    std::vector<int32_t> out = emit({pick(r, 0)});
    spec_.committed += (int)out.size();
    return out;
}

}  // namespace dflash
